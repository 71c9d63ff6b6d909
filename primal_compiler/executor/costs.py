"""Per-opcode cost rules: busy time, the unit a record holds, and its dynamic energy.

``RULES`` maps every opcode of the descriptor table
(:mod:`primal_compiler.isa.descriptors`) to the function of this module its
``cost_rule`` names (a name without one is an error at import naming both);
a stream holding an opcode without a rule is an error naming it. Each rule is
vectorized over the records of its opcode and returns the cycles the record
keeps its unit busy (network time of router records comes from
:mod:`.transfers`), the unit it holds (``-1`` none) and picojoules per energy
component (``COMPONENTS``).
Every constant is a field of the target; the formulas are in
``docs/executor.md``.

Units: the RRAM macro, the SRAM macro and the router's DMAC/activation path
of each PE, the controller's embedding lookup and its argmax, and each CT's
power controller. A unit runs its
records one at a time in stream order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from primal_compiler.errors import InputError
from primal_compiler.executor.topology import Topology
from primal_compiler.isa.stream import Stream
from primal_compiler.target.spec import PrimalTarget
from primal_compiler.executor.transfers import Transfers
from primal_compiler.isa.descriptors import DESCRIPTORS, Descriptor
from primal_compiler.isa.opcodes import ARG_ENUM_MASK, CONTROLLER, ActFn, DmacOp, Flag, Opcode

COMPONENTS = ("rram_adc", "base_dcim", "sram_dcim", "router_dmac", "links", "controller", "wakeup")


@dataclass(frozen=True)
class Ctx:
    """What the rules read: the target, the records, the placed tiles and the transfers."""

    target: PrimalTarget
    topo: Topology
    records: np.ndarray
    stream: Stream
    transfers: Transfers
    rram_rows: np.ndarray  # per (ct * P + pe): used rows of the RRAM tile there (0 = none)
    rram_cols: np.ndarray
    sram_rows: np.ndarray
    sram_cols: np.ndarray
    bank_lanes: int = 1  # DMAC lanes reading one scratchpad bank at once (:func:`bank_lanes`)
    head_dim: int = 0  # elements of an attention head (the KV map's): a PV DMAC's scores are its MACs over it; 0 none

    def unit(self, kind: int, ct, pe) -> np.ndarray:
        pes = self.topo.num_cts * self.topo.pes
        return kind * pes + ct.astype(np.int64) * self.topo.pes + pe.astype(np.int64)

    @property
    def controller_unit(self) -> int:
        return 3 * self.topo.num_cts * self.topo.pes

    @property
    def num_units(self) -> int:
        return self.controller_unit + 2 + self.topo.num_cts


RRAM_UNIT, SRAM_UNIT, DMAC_UNIT = 0, 1, 2


def _none(n: int):
    return np.zeros(n, dtype=np.int64), np.full(n, -1, dtype=np.int64), {}


def _ceil(a, b):
    return -(-np.asarray(a, dtype=np.int64) // int(b))


def _pos(c: Ctx, rec):
    r = c.records
    return r["ct"][rec].astype(np.int64), r["pe"][rec].astype(np.int64)


def base_mvm(target: PrimalTarget, rows, cols) -> tuple[int, np.ndarray, str]:
    """(cycles, picojoules, energy component) of one input vector through a base tile of ``rows x cols``
    weights (arrays or scalars): the RRAM-ACIM pulses, conversions, cells and word lines, or in an all-digital
    target (:attr:`~PrimalTarget.digital_base`) the tile's SRAM-DCIM macros in parallel, ``mac_energy_pj``
    scaled from ``sram.weight_bits`` to the base ``weight_bits``."""
    t, s = target.rram, target.sram
    rows, cols = np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64)
    if target.digital_base:
        return s.mac_latency_cycles, rows * cols * (t.weight_bits / s.weight_bits) * s.mac_energy_pj, "base_dcim"
    pulses = -(-t.input_bits // t.dac_bits)
    conv = pulses * _ceil(rows, t.rows_active_per_read) * cols
    pj = (conv * (t.adc_energy_pj_per_conversion + t.shift_add_energy_pj_per_conversion)
          + pulses * rows * cols * t.array_read_energy_pj + pulses * rows * t.row_driver_energy_pj)
    return t.mvm_latency_cycles, pj, "rram_adc"


def lora_mvm_pj(target: PrimalTarget, rows, cols) -> np.ndarray:
    """Picojoules of one input vector through ``rows x cols`` LoRA weights of the SRAM-DCIM macro (it takes
    ``sram.mac_latency_cycles``)."""
    return np.asarray(rows, dtype=np.int64) * np.asarray(cols, dtype=np.int64) * target.sram.mac_energy_pj


def _smac_rram(c: Ctx, rec):
    ct, pe = _pos(c, rec)
    key = ct * c.topo.pes + pe
    count = c.records["count"][rec].astype(np.int64)
    cycles, pj, component = base_mvm(c.target, c.rram_rows[key], c.rram_cols[key])
    return count * cycles, c.unit(RRAM_UNIT, ct, pe), {component: pj * count}


def _smac_sram(c: Ctx, rec):
    ct, pe = _pos(c, rec)
    key = ct * c.topo.pes + pe
    fired = (c.records["flags"][rec] & Flag.SKIPPED) == 0
    count = c.records["count"][rec].astype(np.int64) * fired
    energy = lora_mvm_pj(c.target, c.sram_rows[key], c.sram_cols[key]) * count
    return count * c.target.sram.mac_latency_cycles, c.unit(SRAM_UNIT, ct, pe), {"sram_dcim": energy}


def _kv_read_bytes(c: Ctx, rec):
    return c.records["count"][rec].astype(np.int64) * c.target.router.dmac_bits // 8


def bank_lanes(target: PrimalTarget, kv: dict) -> int:
    """Most DMAC lanes whose reads of one word round one scratchpad bank serves.

    The lanes (``router.dmac_macs_per_cycle``) work on consecutive tokens of a KV chunk in lock-step (QK
    broadcasts one query element to every lane each cycle, lane u scoring token u; PV adds the lanes'
    products of one value element in one tree), so in a word round lane u reads bank word w of token u.
    With the kv-ring's ``"token"`` interleave token u's vector sits in bank ``u % banks``: the lanes
    spread over every bank. With ``"word"`` a chunk is contiguous: word w of token u is in bank
    ``(u * words_per_token + w) % banks``, so the lanes reach ``banks / gcd(words_per_token, banks)``
    banks (one, for Llama's 256-byte heads over 8 banks).
    """
    r = target.router
    lanes, banks = r.dmac_macs_per_cycle, r.scratchpad_banks
    if kv.get("interleave", "token") == "token":
        reach = banks
    else:
        words = -(-int(kv["head_dim"]) * int(kv["kv_bytes"]) * 8 // r.scratchpad_bank_width_bits)
        reach = banks // math.gcd(words, banks)
    return -(-lanes // min(reach, lanes))


def dmac_cycles(c: Ctx, rec) -> tuple[np.ndarray, np.ndarray]:
    """(compute cycles, scratchpad cycles) of DMAC records: one KV element read per MAC.

    A bank serves one word (``scratchpad_bank_width_bits``: ``e`` KV elements) per cycle, and a lane
    consumes a word in ``e`` MAC cycles. Each lane holds or has asked for at most ``D =
    router.dmac_lane_buffer_words`` words, so a buffer slot comes round every ``e + k`` cycles (its word
    consumed, then the ``k = c.bank_lanes`` lanes of the next word served by their bank) and a word round
    takes ``max(e, (e + k) / D)`` cycles: the reads take ``(e + k) / (D e)`` times the compute cycles when
    that exceeds 1 (bank conflicts; ``tests/executor/test_banks.py`` steps lanes and banks cycle by
    cycle). The scratchpad time is the larger of that and the banks' total bytes per cycle.
    """
    r = c.target.router
    count = c.records["count"][rec].astype(np.int64)
    port = r.scratchpad_banks * r.scratchpad_bank_width_bits // 8
    compute = _ceil(count, r.dmac_macs_per_cycle)
    e, slots = max(1, r.scratchpad_bank_width_bits // r.dmac_bits), r.dmac_lane_buffer_words
    over = e + c.bank_lanes > slots * e
    conflict = _ceil(compute * (e + c.bank_lanes), slots * e) if over else np.zeros_like(compute)
    return compute, np.maximum(_ceil(_kv_read_bytes(c, rec), port), conflict)


def softmax_ops(c: Ctx, rec) -> np.ndarray:
    """DMAC operations of the softmax a PV record applies to its scores before weighting the values: one
    score per ``head_dim`` of its MACs, ``act.softmax_ops_per_element`` each (max, exp, sum, reciprocal); 0
    for QK records and without a head size."""
    arg = c.records["arg"][rec].astype(np.int64) & ARG_ENUM_MASK[Opcode.DMAC]
    scores = c.records["count"][rec].astype(np.int64) // c.head_dim if c.head_dim else 0
    return np.where(arg == DmacOp.PV, scores, 0) * c.target.act.softmax_ops_per_element


def _dmac(c: Ctx, rec):
    r = c.target.router
    ct, pe = _pos(c, rec)
    compute, storage = dmac_cycles(c, rec)
    count = c.records["count"][rec].astype(np.int64)
    soft = softmax_ops(c, rec)
    energy = (count + soft) * r.dmac_energy_pj_per_op + _kv_read_bytes(c, rec) * 8 * r.scratchpad_energy_pj_per_bit
    busy = np.maximum(compute + _ceil(soft, r.dmac_macs_per_cycle), storage)  # the lanes exponentiate, then MAC
    return busy, c.unit(DMAC_UNIT, ct, pe), {"router_dmac": energy}


def act_ops(target: PrimalTarget) -> np.ndarray:
    """DMAC operations per element of each ActFn, from the target's ``act`` table."""
    missing = [fn.name for fn in ActFn if not hasattr(target.act, f"{fn.name.lower()}_ops_per_element")]
    if missing:
        raise InputError(target.name, f"act: no cost for ActFn {', '.join(missing)} (add act.<name>_ops_per_element)")
    return np.array([getattr(target.act, f"{fn.name.lower()}_ops_per_element") for fn in ActFn], dtype=np.int64)


def _act(c: Ctx, rec):
    r = c.target.router
    ct, pe = _pos(c, rec)
    fn = c.records["arg"][rec].astype(np.int64) & ARG_ENUM_MASK[Opcode.ACT]
    ops = c.records["count"][rec].astype(np.int64) * act_ops(c.target)[fn]
    on_ctl = ct == CONTROLLER
    # the NMC's embedding lookup and its logits path (the logits' cap, the argmax) are two units
    ctl = c.controller_unit + np.isin(fn, (ActFn.ARGMAX, ActFn.LOGIT_CAP))
    unit = np.where(on_ctl, ctl, c.unit(DMAC_UNIT, np.where(on_ctl, 0, ct), np.where(on_ctl, 0, pe)))
    energy = ops * r.dmac_energy_pj_per_op
    return _ceil(ops, r.dmac_macs_per_cycle), unit, {"router_dmac": np.where(on_ctl, 0.0, energy),
                                                     "controller": np.where(on_ctl, energy, 0.0)}


def _elements(c: Ctx, rec):
    return c.records["nbytes"][rec].astype(np.int64) * 8 // c.target.router.dmac_bits


def _reduce(c: Ctx, rec):
    """A reduction combines each flit as it arrives (the DMACs add it while the next crosses the link): past
    the network time only the last flit's combine shows, or, with DMACs slower than the link, what the
    combine of every element takes beyond the serialization."""
    r = c.target.router
    g = c.records["group"][rec].astype(np.int64)
    members = c.stream.group_ptr[g + 1] - c.stream.group_ptr[g]
    elements = _elements(c, rec)
    adds = elements * np.maximum(members - 1, 0)
    flit = max(1, r.flit_bits // r.dmac_bits)
    tail = _ceil(np.minimum(elements, flit), r.dmac_macs_per_cycle)
    behind = _ceil(elements, r.dmac_macs_per_cycle) - c.transfers.hold_mesh[rec]
    busy = c.transfers.net_cycles[rec] + np.maximum(tail, behind)
    return busy, np.full(len(rec), -1, dtype=np.int64), {"router_dmac": adds * r.dmac_energy_pj_per_op}


def _move(c: Ctx, rec):
    return c.transfers.net_cycles[rec], np.full(len(rec), -1, dtype=np.int64), {}


def _kv_append(c: Ctx, rec):
    bits = c.records["nbytes"][rec].astype(np.int64) * 8
    busy, unit, _ = _move(c, rec)
    return busy, unit, {"router_dmac": bits * c.target.router.scratchpad_energy_pj_per_bit}


def _config(c: Ctx, rec):
    s = c.target.sram
    r = c.records
    unit = c.unit(SRAM_UNIT, r["dst_ct"][rec], r["dst_pe"][rec])
    busy = c.transfers.net_cycles[rec] + s.reconfig_cycles
    return busy, unit, {"sram_dcim": r["nbytes"][rec].astype(np.int64) * 8 * s.write_energy_pj_per_bit}


def _power(c: Ctx, rec, cycles: int):
    ct = c.records["ct"][rec].astype(np.int64)
    return np.full(len(rec), cycles, dtype=np.int64), c.controller_unit + 2 + ct, {}


def _pg_on(c: Ctx, rec):
    busy, unit, _ = _power(c, rec, c.target.power_gating.wakeup_cycles)
    return busy, unit, {"wakeup": np.full(len(rec), c.target.power_gating.wakeup_energy_pj)}


def _pg_off(c: Ctx, rec):
    return _power(c, rec, 1)


def _mask(c: Ctx, rec):
    ct, pe = _pos(c, rec)
    return np.ones(len(rec), dtype=np.int64), c.unit(SRAM_UNIT, ct, pe), {}


def _sync(c: Ctx, rec):
    return _none(len(rec))


def rules(table: Mapping[Opcode, Descriptor]) -> dict[Opcode, Callable]:
    """The rule of every opcode in ``table``: the function of this module its ``cost_rule`` names;
    NameError naming the opcode and the rule when there is no such function."""
    out = {}
    for op, d in table.items():
        rule = globals().get(d.cost_rule)
        if not callable(rule) or getattr(rule, "__module__", None) != __name__:
            raise NameError(f"opcode {op.name}: cost rule {d.cost_rule!r} is not a function of {__name__}")
        out[op] = rule
    return out


RULES = rules(DESCRIPTORS)


def record_costs(c: Ctx, where: str = "program") -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """(busy cycles, unit, {component: pJ}) of every record, through ``RULES``; InputError naming ``where``."""
    r = c.records
    n = len(r)
    busy = np.zeros(n, dtype=np.int64)
    unit = np.full(n, -1, dtype=np.int64)
    energy = {k: np.zeros(n) for k in COMPONENTS}
    for op in np.unique(r["op"]):
        known = int(op) in Opcode._value2member_map_
        rule = RULES.get(Opcode(op)) if known else None
        if rule is None:
            name = Opcode(op).name if known else "unknown"
            raise InputError(where, f"no cost rule for opcode {op} ({name})")
        rec = np.flatnonzero(r["op"] == op)
        b, u, e = rule(c, rec)
        busy[rec], unit[rec] = b, u
        for k, v in e.items():
            energy[k][rec] = v
    energy["controller"] += c.target.system.nmc_issue_energy_pj
    return busy, unit, energy


def throttled(c: Ctx, unit: np.ndarray, max_active_pes: int) -> np.ndarray:
    """``unit`` with the RRAM MVMs of every CT on ``max_active_pes`` lanes: the CT's PEs that run an RRAM MVM,
    in PE order, dealt round-robin to the lanes, so at most that many of a CT's RRAM macros (and their ADCs)
    convert at once, the lanes share the work evenly and each PE's MVMs keep their order (a thermal-aware
    policy, docs/thermal.md); 0 or at least a CT's PEs: unchanged."""
    pes = c.topo.pes
    if max_active_pes <= 0 or max_active_pes >= pes:
        return unit
    rram = np.flatnonzero((unit >= RRAM_UNIT * pes * c.topo.num_cts) & (unit < (RRAM_UNIT + 1) * pes * c.topo.num_cts))
    used = np.unique(unit[rram])  # sorted: by CT, then PE
    ct = used // pes
    rank = np.arange(len(used)) - np.searchsorted(ct, ct)  # place among its CT's MVM PEs
    out = unit.copy()
    out[rram] = (ct * pes + rank % max_active_pes)[np.searchsorted(used, unit[rram])]
    return out


def link_energy(c: Ctx, mesh_links: np.ndarray, other_links: np.ndarray) -> np.ndarray:
    """pJ per record for its bits crossing its distinct mesh links and die-to-die/controller links."""
    bits = c.records["nbytes"].astype(np.float64) * 8
    return bits * (mesh_links * c.target.router.energy_pj_per_bit_hop + other_links * c.target.d2d.energy_pj_per_bit)


def kv_storage(c: Ctx, rec) -> tuple[float, float]:
    """(KV bytes the DMAC records read, bytes their scratchpad banks could deliver while they ran)."""
    r = c.target.router
    rec = rec[c.records["op"][rec] == Opcode.DMAC]
    rec = rec[np.isin(c.records["arg"][rec] & 0xFF, (DmacOp.QK, DmacOp.PV))]
    compute, storage = dmac_cycles(c, rec)
    port = r.scratchpad_banks * r.scratchpad_bank_width_bits // 8
    return float(_kv_read_bytes(c, rec).sum()), float((np.maximum(compute, storage) * port).sum())
