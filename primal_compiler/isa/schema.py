"""What a compiled program file holds beyond a legal stream, and the check that it holds it.

``primal compile`` writes meta ``format = "primal-program"`` and, besides the
stream, the model IR, the KV-ring layout, the tile table, the CT layout, the
mapping's flows and (after ``srpg``) the power schedule. The executor, the
hop validation, ``primal viz`` and the functional replay index one with the
other, so :func:`compiled_issue` checks every key and array they read: the
meta keys (:func:`~primal_compiler.isa.meta.meta_issue`), every array's
name, dtype and length (``ARRAYS``; the srpg schedule all or none; the KV
arrays one entry per unit of each layer's ring), value ranges and
cross-references (tiles placed on the mesh, one PE-owning tile per PE, each
LoRA tile on its RRAM host's PE or on a PE of its own, CT templates and the
flows' CSR pointers, KV units on their layer's CTs in distinct slots, power
windows naming PG_ON/PG_OFF records of their CT), and
the sections (``adapter:R`` with LoRA, ``prefill:R`` with one controller
ARGMAX, ``decode:R`` with at least one, for R = 0, 1, ... in order).
:func:`tiles_issue` adds the one check that needs the target: the tile
table's weight columns are what lowering ``model_ir`` for it gives. Both
assume :func:`~primal_compiler.isa.legality.stream_problem` passed. A
program they accept replays, validates, draws and rebuilds without an index
leaving its arrays; anything else is one :class:`Issue` naming the key,
array or section.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, TYPE_CHECKING

import numpy as np

from primal_compiler.errors import InputError
from primal_compiler.ir.model_json import model_from_dict
from primal_compiler.ir.tiles import COLUMNS, ROLE_CODES, Macro, Part, lora_macros
from primal_compiler.isa.meta import COMPILED, INT_MAX, Issue, kv_units, meta_issue
from primal_compiler.isa.opcodes import Opcode, step_ends
from primal_compiler.isa.stream import Stream
from primal_compiler.mapping.lower import Geometry, lower_model

if TYPE_CHECKING:
    from primal_compiler.target.spec import PrimalTarget

TILES = {f"tile_{name}": np.dtype(dtype) for name, dtype in COLUMNS.items()}
ARRAYS = {**TILES, **{name: np.dtype(dtype) for name, dtype in (
    ("ct_layer", "<i4"), ("ct_template", "<i4"), ("map_tpl_ptr", "<i8"), ("map_src_pe", "<i4"), ("map_dst_pe", "<i4"),
    ("map_hops", "<i4"), ("map_d2d_src", "<i4"), ("map_d2d_dst", "<i4"), ("kv_ct", "<u2"), ("kv_pe", "<u2"),
    ("kv_slot", "<u2"), ("pg_ct", "<i8"), ("pg_on", "<i8"), ("pg_off", "<i8"), ("pg_sram_off", "<i8"))}}
POWER = ("pg_ct", "pg_on", "pg_off", "pg_sram_off")  # the srpg schedule: all or none
"""The srpg schedule: per window its CT, PG_ON and PG_OFF records; per CT the SRAM-DCIM macros it keeps
switched off (they hold no LoRA weight)."""
WEIGHT_COLUMNS = ("layer", "role", "part", "macro", "brow", "bcol", "slice", "rows", "cols", "bytes", "host")
SECTION = re.compile(r"(adapter|prefill|decode):(0|[1-9][0-9]{0,8})")


def is_compiled(meta: object) -> bool:
    """Whether ``meta`` claims to be a compiled program's (such a file is always checked in full)."""
    return isinstance(meta, Mapping) and meta.get("format") == COMPILED


def compiled_issue(meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray], stream: Stream) -> Issue | None:
    """The first thing a compiled program lacks or gets wrong, or None; ``stream`` must be legal under ``meta``."""
    return meta_issue(meta) or _array_issue(meta, arrays, stream) or _section_issue(arrays, stream)


def check_compiled(meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray], stream: Stream, where: str) -> None:
    """Raise ``InputError(where, ...)`` naming the first key, array or section :func:`compiled_issue` finds."""
    issue = compiled_issue(meta, arrays, stream)
    if issue is not None:
        raise InputError(where, issue.message)


def tiles_issue(meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray], target: PrimalTarget) -> Issue | None:
    """Whether the tile table's weight columns (every column but the placement's ``ct``, ``seq``, ``pe`` and
    lora-sparsity's ``zero``) are what lowering ``model_ir`` with ``target``'s macros gives (the functional
    replay cuts the weights by them); ``compiled_issue`` must have passed."""
    model = model_from_dict(meta["model_ir"])
    p, r, s = model.precision, target.rram, target.sram
    geo = Geometry(r.rows, r.cols, r.bits_per_cell, s.rows, s.cols_bits, p.base_weight_bits, p.lora_weight_bits,
                   p.lm_head_bits)
    try:
        tiles = lower_model(model, geo)
    except InputError as exc:
        return Issue("meta", "model_ir", f"meta model_ir: does not fit target {target.name} ({exc.problem})")
    gives = f"lowering model_ir for target {target.name} gives"
    if len(tiles) != len(arrays["tile_layer"]):
        return Issue("array", "tile_layer", f"array tile_layer: {len(arrays['tile_layer'])} tiles, but {gives} "
                                            f"{len(tiles)}")
    for column in WEIGHT_COLUMNS:
        want, got = getattr(tiles, column), arrays[f"tile_{column}"]
        issue = _first(f"tile_{column}", got != want, lambda i: f"is {got[i]}, but {gives} {want[i]}")
        if issue is not None:
            return issue
    return None


# --------------------------------------------------------------------------- arrays


def _first(name: str, bad: np.ndarray, describe) -> Issue | None:
    """An Issue naming the first entry of array ``name`` where ``bad`` holds: ``describe(i)`` says why."""
    hits = np.flatnonzero(bad)
    if not len(hits):
        return None
    more = f" (and {len(hits) - 1} more)" if len(hits) > 1 else ""
    return Issue("array", name, f"array {name}: entry {int(hits[0])} {describe(int(hits[0]))}{more}")


def _outside(name: str, a: np.ndarray, low: int, high: int, mask: np.ndarray | None = None,
             note: str = "") -> Issue | None:
    """An Issue if an entry of ``a`` (where ``mask``) is outside ``low..high``."""
    bad = (a < low) | (a > high)
    return _first(name, bad if mask is None else bad & mask, lambda i: f"is {a[i]}, outside {low}..{high}{note}")


def _array_issue(meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray], stream: Stream) -> Issue | None:
    power = [n for n in POWER if n in arrays]
    for name, dtype in ARRAYS.items():
        if name not in arrays and (name not in POWER or power):
            why = "the srpg schedule needs pg_ct, pg_on, pg_off and pg_sram_off" if name in POWER \
                else "a compiled program has it"
            return Issue("array", name, f"array {name}: missing ({why})")
        given = arrays.get(name)
        if given is not None and (given.dtype != dtype or given.ndim != 1):
            return Issue("array", name, f"array {name}: expected a 1-D {dtype} array, got {given.dtype} of shape "
                                        f"{list(given.shape)}")
    a, kv = arrays, meta["kv"]
    num_cts, pes, layers = meta["num_cts"], meta["mesh_rows"] * meta["mesh_cols"], meta["num_layers"]
    units = kv_units(kv, layers)
    templates = len(a["map_tpl_ptr"]) - 1
    for names, length, what in (
        (tuple(TILES), max(len(a["tile_layer"]), 1), "one entry per tile (at least one)"),
        (("ct_layer", "ct_template"), num_cts, f"one entry per CT (num_cts {num_cts})"),
        (("map_tpl_ptr",), max(templates, 1) + 1, "one entry per CT template plus one (at least 2)"),
        (("map_src_pe", "map_dst_pe", "map_hops"), max(len(a["map_src_pe"]), 1), "one entry per mapped flow"),
        (("map_d2d_src", "map_d2d_dst"), len(a["map_d2d_src"]), "one entry per die-to-die transfer"),
        (("kv_ct", "kv_pe", "kv_slot"), int(units.sum()), f"the KV units of {layers} layers (kv)"),
        ([n for n in power if n != "pg_sram_off"], len(a.get("pg_ct", ())), "one entry per power window"),
        (("pg_sram_off",) if power else (), num_cts, f"one entry per CT (num_cts {num_cts})"),
    ):
        for name in names:
            if len(a[name]) != length:
                return Issue("array", name, f"array {name}: {len(a[name])} entries, expected {length} ({what})")
    for check in (
        lambda: _tile_issue(a, num_cts, pes, layers),
        lambda: _outside("ct_layer", a["ct_layer"], 0, layers, note=" (0..num_layers)"),
        lambda: _outside("ct_template", a["ct_template"], 0, templates - 1, note=" (a CT template of map_tpl_ptr)"),
        lambda: _csr(a["map_tpl_ptr"], len(a["map_src_pe"])),
        lambda: _outside("map_src_pe", a["map_src_pe"], 0, pes - 1),
        lambda: _outside("map_dst_pe", a["map_dst_pe"], 0, pes - 1),
        lambda: _outside("map_hops", a["map_hops"], 0, INT_MAX),
        lambda: _outside("map_d2d_src", a["map_d2d_src"], -1, num_cts - 1, note=" (-1: the controller)"),
        lambda: _outside("map_d2d_dst", a["map_d2d_dst"], -1, num_cts - 1, note=" (-1: the controller)"),
        lambda: _outside("kv_ct", a["kv_ct"], 0, num_cts - 1),
        lambda: _outside("kv_pe", a["kv_pe"], 0, pes - 1),
        lambda: _outside("kv_slot", a["kv_slot"], 0, kv["chunk_slots"] - 1, note=" (kv.chunk_slots)"),
        lambda: _kv_layers(a, units),
        lambda: _twice("kv_slot", (a["kv_ct"].astype(np.int64) * pes + a["kv_pe"]) * kv["chunk_slots"] + a["kv_slot"],
                       np.arange(len(a["kv_ct"])), "shares its CT, PE and chunk slot with another KV unit"),
        lambda: _power_issue(a, stream, num_cts) if power else None,
        lambda: _sram_off_issue(a, num_cts, pes) if power else None,
    ):
        issue = check()
        if issue is not None:
            return issue
    return None


def _tile_issue(a: Mapping[str, np.ndarray], num_cts: int, pes: int, layers: int) -> Issue | None:
    """Tile columns in range, each tile placed, each SRAM tile on its own RRAM host's PE or its own host.

    The PE owners (RRAM tiles and SRAM tiles that are their own host) are one per PE.
    """
    macro, host, ct, pe = a["tile_macro"], a["tile_host"], a["tile_ct"], a["tile_pe"]
    rram, n = macro == Macro.RRAM, len(macro)
    sram = np.flatnonzero(~rram)
    own = ~rram & (host == np.arange(n))
    owners = np.flatnonzero(rram | own)
    for check in (
        lambda: _outside("tile_layer", a["tile_layer"], 0, layers, note=" (0..num_layers)"),
        lambda: _outside("tile_role", a["tile_role"], 0, len(ROLE_CODES) - 1),
        lambda: _outside("tile_macro", macro, 0, len(Macro) - 1),
        lambda: _outside("tile_part", a["tile_part"], int(Part.BASE), int(Part.BASE), rram, " for an RRAM tile"),
        lambda: _outside("tile_part", a["tile_part"], int(Part.LORA_A), int(Part.LORA_B), ~rram, " for an SRAM tile"),
        *(lambda c=c: _outside(c, a[c], 0, np.iinfo(a[c].dtype).max) for c in (
            "tile_brow", "tile_bcol", "tile_slice", "tile_rows", "tile_cols", "tile_bytes")),
        lambda: _outside("tile_seq", a["tile_seq"], -1, np.iinfo(np.int32).max),
        lambda: _outside("tile_zero", a["tile_zero"], -1, 1),
        lambda: _outside("tile_ct", ct, 0, num_cts - 1, note=" (every tile is placed on a CT)"),
        lambda: _outside("tile_pe", pe, 0, pes - 1, note=" (every tile is placed on a PE)"),
        lambda: _outside("tile_host", host, -1, -1, rram, " for an RRAM tile"),
        lambda: _outside("tile_host", host, 0, n - 1, ~rram, " for an SRAM tile (the RRAM tile hosting it, or itself)"),
        lambda: _first("tile_host", ~rram & ~own & ~rram[np.clip(host, 0, n - 1)],
                       lambda i: f"is {host[i]}, another SRAM tile: SRAM tiles are hosted by RRAM tiles or by "
                                 f"themselves"),
        lambda: _twice("tile_host", host[sram], sram, "hosts a second SRAM tile (one LoRA tile per PE)"),
        lambda: _first("tile_pe", ~rram & (pe != pe[np.clip(host, 0, n - 1)]),
                       lambda i: f"is {pe[i]}, but the RRAM tile hosting it is on PE {pe[host[i]]}"),
        lambda: _first("tile_ct", ~rram & (ct != ct[np.clip(host, 0, n - 1)]),
                       lambda i: f"is {ct[i]}, but the RRAM tile hosting it is on CT {ct[host[i]]}"),
        lambda: _twice("tile_pe", ct[owners].astype(np.int64) * pes + pe[owners], owners,
                       "places a second RRAM tile or self-hosted SRAM tile on one PE (one of each macro per PE)"),
    ):
        issue = check()
        if issue is not None:
            return issue
    return None


def _twice(name: str, keys: np.ndarray, rows: np.ndarray, what: str) -> Issue | None:
    """An Issue if two of ``keys`` (belonging to entries ``rows`` of array ``name``) are equal."""
    order = np.argsort(keys, kind="stable")
    same = np.flatnonzero(keys[order][1:] == keys[order][:-1])
    if not len(same):
        return None
    first, second = rows[order[same[0]]], rows[order[same[0] + 1]]
    return Issue("array", name, f"array {name}: entry {second} {what}: entry {first} has the same "
                                f"({len(same)} such pairs)")


def _csr(ptr: np.ndarray, members: int) -> Issue | None:
    if ptr[0] != 0 or ptr[-1] != members or np.any(np.diff(ptr) < 0):
        return Issue("array", "map_tpl_ptr", f"array map_tpl_ptr: must start at 0, never decrease and end at "
                                             f"{members} (the mapped flows)")
    return None


def _kv_layers(a: Mapping[str, np.ndarray], units: np.ndarray) -> Issue | None:
    """Every KV unit of layer n (``units[n]`` of them, after layer n-1's) lives on a CT of layer n (gated CTs
    keep only their own layer's cache)."""
    layer, home = np.repeat(np.arange(len(units)), units), a["ct_layer"][a["kv_ct"]]
    return _first("kv_ct", home != layer, lambda i: f"(a unit of layer {layer[i]}) is CT {a['kv_ct'][i]} of layer "
                                                    f"{home[i]}; a layer's KV cache stays in its own CTs")


def _sram_off_issue(a: Mapping[str, np.ndarray], num_cts: int, pes: int) -> Issue | None:
    """A CT switches off at most its SRAM-DCIM macros that hold no LoRA weight."""
    free = pes - lora_macros(a["tile_macro"], a["tile_ct"], a["tile_pe"], a["tile_host"], num_cts, pes)
    return _first("pg_sram_off", (a["pg_sram_off"] < 0) | (a["pg_sram_off"] > free),
                  lambda i: f"(CT {i}) switches off {a['pg_sram_off'][i]} SRAM-DCIM macros; it has {free[i]} "
                            f"that hold no LoRA weight")


def _power_issue(a: Mapping[str, np.ndarray], stream: Stream, num_cts: int) -> Issue | None:
    """The srpg schedule names a PG_ON and a later PG_OFF of its CT for every window."""
    r, last = stream.records, len(stream) - 1
    for name, op in (("pg_on", Opcode.PG_ON), ("pg_off", Opcode.PG_OFF)):
        at = a[name]
        issue = _first(name, (at < 0) | (at > last), lambda i: f"names record {at[i]}, but the stream has records "
                                                               f"0..{last} (truncated?)") or _first(
            name, r["op"][np.clip(at, 0, last)] != op, lambda i: f"names record {at[i]}, which is not a {op.name}")
        if issue is not None:
            return issue
    ct = a["pg_ct"]
    for name in ("pg_on", "pg_off"):
        at = a[name]
        issue = _outside("pg_ct", ct, 0, num_cts - 1) or _first(
            "pg_ct", r["ct"][at] != ct,
            lambda i: f"is CT {ct[i]}, but its {name} record {at[i]} is on CT {r['ct'][at[i]]}")
        if issue is not None:
            return issue
    on, off = a["pg_on"], a["pg_off"]
    return _first("pg_off", off <= on, lambda i: f"is record {off[i]}, not after its window's PG_ON (record {on[i]})")


# --------------------------------------------------------------------------- sections


def _section_issue(arrays: Mapping[str, np.ndarray], stream: Stream) -> Issue | None:
    """Per request r = 0, 1, ...: adapter:r (LoRA programs; always for r = 0), prefill:r with one controller
    ARGMAX per pass (one pass, or one per sequence when pipelined: distinct TOKEN buffers), decode:r with
    at least one, in that order and nothing else."""
    r = stream.records
    argmax = step_ends(r)
    before = np.concatenate([[0], np.cumsum(argmax)])
    lora = bool((arrays["tile_macro"] == Macro.SRAM).any())
    secs, k, request = stream.sections, 0, 0
    while k < len(secs) or request == 0:
        for kind in ("adapter", "prefill", "decode"):
            want = f"{kind}:{request}"
            if kind == "adapter" and not (lora and (request == 0 or (k < len(secs) and secs[k].name == want))):
                continue
            if k == len(secs):
                after = f"after section {secs[k - 1].name}" if k else "in an empty stream"
                return Issue("end", want, f"section {want}: missing, the program ends {after} (truncated?)")
            s = secs[k]
            if s.name != want:
                problem = "names no section of a compiled program" if not SECTION.fullmatch(s.name) else \
                    f"found where {want} belongs (sections run adapter:R if LoRA, prefill:R, decode:R, R = 0, 1, ...)"
                return Issue("section", s.name, f"section {k} {s.name}: {problem}")
            tokens = int(before[s.stop] - before[s.start])
            dst = r["dst_buf"][s.start + np.flatnonzero(argmax[s.start : s.stop])]
            if (kind == "prefill" and (tokens < 1 or len(np.unique(dst)) != tokens)) or (kind == "decode" and tokens < 1):
                need = "one per pass, each its own TOKEN buffer" if kind == "prefill" else "at least one"
                return Issue("section", s.name, f"section {s.name}: {tokens} controller ARGMAX records, needs {need} "
                                                f"(each prefill and decode step ends with one)")
            k += 1
        request += 1
    return None
