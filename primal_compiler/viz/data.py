"""Everything the pictures draw from: one replayed compile output and the facts derived from it.

:func:`load` reads ``OUT/program.primal`` (and ``OUT/records.json``), replays
it with the executor and computes its metrics and H100 baseline once; the
placement helpers turn the program file's tile columns, hub PEs and KV map
into per-PE labels of one CT.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from primal_compiler.errors import InputError
from primal_compiler.inputs import TEXT_LIMIT_BYTES, read_text
from primal_compiler.ir.tiles import ROLE_CODES, Macro, Part
from primal_compiler.isa.container import plain_json

if TYPE_CHECKING:
    from primal_compiler.executor.cache import ReplayCache
    from primal_compiler.executor.replay import Replay
    from primal_compiler.isa.stream import Stream
    from primal_compiler.target.spec import PrimalTarget

#: PE labels beyond the role indices: hub, KV-only, empty.
HUB, KV_ONLY, EMPTY = len(ROLE_CODES), len(ROLE_CODES) + 1, len(ROLE_CODES) + 2
LORA_A, LORA_B = 1, 2  # bits of :func:`pe_lora`


@dataclass(eq=False)
class VizData:
    """A replayed program: container parts, the :class:`~primal_compiler.executor.replay.Replay`, metrics, and
    the run report saved beside it (``saved``: ``OUT/report.json`` of this very program, or None)."""

    out: Path
    where: str
    meta: dict
    arrays: dict
    stream: Stream
    target: PrimalTarget
    rp: Replay
    metrics: dict
    h100: dict | None
    records: list = field(default_factory=list)
    seconds: dict = field(default_factory=dict)
    saved: dict | None = None

    @property
    def num_cts(self) -> int:
        return int(self.meta["num_cts"])

    @property
    def rows(self) -> int:
        return int(self.meta["mesh_rows"])

    @property
    def cols(self) -> int:
        return int(self.meta["mesh_cols"])

    @property
    def num_layers(self) -> int:
        return int(self.meta["num_layers"])

    @property
    def clock_hz(self) -> float:
        return float(self.target.system.clock_hz)

    def section_names(self) -> list[str]:
        return [s.name for s in self.stream.sections]

    def section(self, name: str) -> np.ndarray:
        return self.rp.section(name)

    def layer_name(self, ct: int) -> str:
        layer = int(self.arrays["ct_layer"][ct])
        return "head" if layer >= self.num_layers else f"L{layer}"


def read_records(out: Path) -> list:
    """The pass records of ``OUT/records.json`` ([] when the file is absent); InputError naming it if malformed.

    Each record is an object with a string ``name`` and ``spec`` and, when present, a finite number
    ``seconds`` (what the HTML report prints).
    """
    path = out / "records.json"
    if not path.exists():
        return []
    try:
        records = plain_json(read_text(path, TEXT_LIMIT_BYTES, "pass-record file"))
    except (ValueError, RecursionError) as exc:
        raise InputError(str(path), f"not a readable pass-record file ({exc})") from None
    number = (int, float)
    if not isinstance(records, list) or not all(
            isinstance(r, dict) and type(r.get("name")) is str and type(r.get("spec", "")) is str
            and (r.get("seconds") is None or type(r["seconds"]) in number) for r in records):
        raise InputError(str(path), "expected a JSON list of pass records, each with a string 'name' and 'spec' "
                                    "and a number 'seconds'")
    return records


def same_run(saved: dict | None, target: str, m: dict) -> bool:
    """Whether the saved run report ``saved`` is of the replay whose metrics are ``m``: the same target, control
    mode and generation (a run with ``--control central`` or another ``--generate`` is another run)."""
    if not isinstance(saved, dict) or saved.get("target") != target or not isinstance(saved.get("metrics"), dict):
        return False
    return all(saved["metrics"].get(k) == m.get(k) for k in ("control", "decode_steps", "generation"))


def load(out, target_name: str | None = None, cache: ReplayCache | None = None, critical: bool = False) -> VizData:
    """Load and replay compile output ``out`` (or a program file), reading and keeping its schedule in ``cache``
    (:mod:`~primal_compiler.executor.cache`); every failure is an InputError naming the file.

    ``metrics["critical_path"]`` (:func:`~primal_compiler.executor.critical.critical_path`) is computed with
    ``critical`` (a full replay: the cache is not read), else taken from the saved run report when it has one
    for this target, else absent.

    The program comes through :func:`~primal_compiler.report.collect.load_compiled`, so its placement, KV map and
    mapping arrays exist and index each other, and sections ``prefill:0``/``decode:0`` end with ARGMAX.
    """
    from primal_compiler.report.collect import h100_for, load_compiled, planned_generation
    from primal_compiler.report.run import read_saved
    from primal_compiler.executor.metrics import metrics
    from primal_compiler.executor.replay import replay

    out = Path(out)
    if not out.exists():
        raise InputError(str(out), "no such compile output directory")
    seconds = {}
    t = time.perf_counter()
    c = load_compiled(out, target_name)
    meta, arrays, stream, target, where = c.meta, c.arrays, c.stream, c.target, c.where
    saved = read_saved(Path(where))  # checked against the program before the replay
    seconds["load"] = time.perf_counter() - t
    t = time.perf_counter()
    rp = replay(meta, arrays, stream, target, where, cache=None if critical else cache, rows=False)  # traffic walks its own
    seconds["replay"] = time.perf_counter() - t
    m = metrics(rp, generate=planned_generation(meta), where=where, required=False)  # what primal run reports
    if critical:
        from primal_compiler.executor.critical import critical_path

        t = time.perf_counter()
        m["critical_path"] = critical_path(rp, generate=m["decode_steps"])
        seconds["critical path"] = time.perf_counter() - t
    elif saved is not None and same_run(saved, target.name, m) and "critical_path" in saved["metrics"]:
        m["critical_path"] = saved["metrics"]["critical_path"]
    records = read_records(out) if out.is_dir() else []
    return VizData(out if out.is_dir() else out.parent, where, meta, arrays, stream, target, rp, m,
                   h100_for(meta, m), records, seconds, saved)


def pe_roles(d: VizData, ct: int) -> np.ndarray:
    """Label of every PE of CT ``ct``: the role index of its RRAM tile, else HUB, KV_ONLY or EMPTY."""
    a = d.arrays
    pes = d.rows * d.cols
    label = np.full(pes, EMPTY, dtype=np.int64)
    kv = pe_kv(d, ct)
    label[kv] = KV_ONLY
    label[pe_hubs(d, ct)] = HUB
    sel = (a["tile_ct"] == ct) & (a["tile_macro"] == Macro.RRAM) & (a["tile_pe"] >= 0)
    label[a["tile_pe"][sel]] = a["tile_role"][sel]
    return label


def pe_lora(d: VizData, ct: int) -> np.ndarray:
    """Bit set per PE of CT ``ct``: LORA_A / LORA_B if it hosts an SRAM tile of that LoRA factor."""
    a = d.arrays
    out = np.zeros(d.rows * d.cols, dtype=np.int64)
    sram = np.flatnonzero((a["tile_macro"] == Macro.SRAM) & (a["tile_pe"] >= 0) & (a["tile_host"] >= 0))
    host_ct = a["tile_ct"][a["tile_host"][sram]]
    sram = sram[host_ct == ct]
    for part, bit in ((Part.LORA_A, LORA_A), (Part.LORA_B, LORA_B)):
        s = sram[a["tile_part"][sram] == part]
        out[a["tile_pe"][s]] |= bit
    return out


def pe_kv(d: VizData, ct: int) -> np.ndarray:
    """Whether each PE of CT ``ct`` holds KV-cache chunks (from the kv-ring map)."""
    a = d.arrays
    out = np.zeros(d.rows * d.cols, dtype=bool)
    if "kv_ct" in a:
        out[a["kv_pe"][a["kv_ct"] == ct].astype(np.int64)] = True
    return out


def pe_hubs(d: VizData, ct: int) -> np.ndarray:
    """PEs the mapping's flows of CT ``ct``'s template use but that hold no weight tile (hubs)."""
    a = d.arrays
    if "ct_template" not in a or "map_tpl_ptr" not in a:
        return np.zeros(0, dtype=np.int64)
    tpl = int(a["ct_template"][ct])
    lo, hi = int(a["map_tpl_ptr"][tpl]), int(a["map_tpl_ptr"][tpl + 1])
    used = np.unique(np.concatenate([a["map_src_pe"][lo:hi], a["map_dst_pe"][lo:hi]])).astype(np.int64)
    tiles = a["tile_pe"][(a["tile_ct"] == ct) & (a["tile_macro"] == Macro.RRAM)]
    return used[~np.isin(used, tiles) & (used >= 0)]


def representative_cts(d: VizData, limit: int = 6) -> list[int]:
    """Every CT of a small system; of a large one the first CT of layer 0, the layer-0 CTs holding most
    attention-output (O) and most MLP tiles if different, and the first LM-head CT."""
    if d.num_cts <= limit:
        return list(range(d.num_cts))
    a = d.arrays
    layer0 = np.flatnonzero(a["ct_layer"] == 0)
    picks = [int(layer0[0])] if len(layer0) else [0]
    rram = a["tile_macro"] == Macro.RRAM
    names = [r.value for r in ROLE_CODES]
    for group in (("o",), ("gate", "up", "down", "fc1", "fc2")):
        codes = [names.index(g) for g in group]
        sel = rram & np.isin(a["tile_role"], codes) & np.isin(a["tile_ct"], layer0)
        if sel.any():
            ct = int(np.bincount(a["tile_ct"][sel]).argmax())
            if ct not in picks:
                picks.append(ct)
    head = np.flatnonzero(a["ct_layer"] >= d.num_layers)
    if len(head) and int(head[0]) not in picks:
        picks.append(int(head[0]))
    return picks
