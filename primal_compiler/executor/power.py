"""Power states of every CT over a replay, and the static energy they cost.

A CT is *active* from time 0. ``PG_OFF`` gates it when the record finishes;
``PG_ON`` starts *waking* it at its start and makes it active at its finish.
Static power per PE in each state comes from the target: active = every
domain's leakage; waking = active leakage (the rails recharge; the wake-up
energy itself is the ``PG_ON`` record's dynamic energy); gated = switched-off
domains (RRAM periphery, router) at ``gated_leakage_fraction``, retained
domains (SRAM-DCIM, scratchpad) at ``retained_leakage_fraction``. The RRAM
periphery also draws its bias (``rram.idle_bias_uw`` per macro, :func:`bias_w`)
while its CT is active or waking, none while gated when the periphery is
switched off; a bias is set by design, so it is never scaled with the dies'
temperature as leakage is (:mod:`.leakage`). An all-digital
target's base-weight macros (``base_dcim``, ``base_sram_macros`` per PE) are
always retained: they are volatile and nothing reloads them. The SRAM-DCIM
macros the srpg schedule switches off (``pg_sram_off``: those holding no LoRA
weight, when the target's ``power_gating.gate_unused_sram`` allows it) leak at
``gated_leakage_fraction`` in every state, counted as gated; the others follow
their CT's state (:func:`sram_powered`). A gated CT keeps only the scratchpads
holding a KV chunk or a buffer live across the gated window, when the target's
``power_gating.gate_unused_scratchpad`` allows it; the others leak at
``gated_leakage_fraction`` (:func:`scratchpads_kept`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from primal_compiler.isa.opcodes import Opcode

if TYPE_CHECKING:
    from primal_compiler.target.spec import PrimalTarget

STATES = ("active", "waking", "gated")
ACTIVE, WAKING, GATED = range(3)
DOMAINS = ("rram_adc", "base_dcim", "sram_dcim", "router_dmac", "scratchpad")


@dataclass(frozen=True)
class Timeline:
    """State intervals of every CT: ``ct``, ``state``, ``[begin, end)`` cycles (end = replay end); ``sram_on``:
    per CT, its SRAM-DCIM macros not switched off (:func:`sram_powered`); ``scratch_kept``: per CT, the
    scratchpads it retains while gated (:func:`scratchpads_kept`; every one until that is known);
    ``leak_scale``: per CT, its leakage over the target's stated leakage, at ``die_c``, its die's temperature
    (:mod:`.leakage`; ones at the reference temperature until that is known)."""

    ct: np.ndarray
    state: np.ndarray
    begin: np.ndarray
    end: np.ndarray
    sram_on: np.ndarray
    scratch_kept: np.ndarray
    leak_scale: np.ndarray
    die_c: np.ndarray


def domain_leakage_w(target: PrimalTarget) -> dict[str, np.ndarray]:
    """Per domain: static watts of one PE in each state (index by ACTIVE/WAKING/GATED)."""
    pg = target.power_gating
    off, keep = pg.gated_leakage_fraction, pg.retained_leakage_fraction
    digital = target.digital_base  # an all-digital PE: no RRAM periphery; its base macros are retained, as SRAM-DCIM
    leak = {"rram_adc": (0.0 if digital else target.rram.leakage_uw, off if pg.gate_rram_periphery else 1.0),
            "base_dcim": (target.base_sram_macros * target.sram.leakage_uw, keep),  # volatile: nothing reloads them
            "sram_dcim": (target.sram.leakage_uw, keep if pg.retain_sram else off),
            "router_dmac": (target.router.leakage_uw, off if pg.gate_router else 1.0),
            "scratchpad": (target.router.scratchpad_leakage_uw, keep if pg.retain_scratchpad else off)}
    return {k: np.array([uw, uw, uw * frac]) * 1e-6 for k, (uw, frac) in leak.items()}


def bias_w(target: PrimalTarget) -> np.ndarray:
    """Per state (index by ACTIVE/WAKING/GATED): watts of one PE's RRAM periphery bias (``rram.idle_bias_uw``),
    removed while gated when ``power_gating.gate_rram_periphery`` switches the periphery off; none on an all-digital
    target. Part of the ``rram_adc`` domain, at no temperature scale."""
    uw = 0.0 if target.digital_base else target.rram.idle_bias_uw
    return np.array([uw, uw, 0.0 if target.power_gating.gate_rram_periphery else uw]) * 1e-6


def domain_static_w(target: PrimalTarget) -> dict[str, np.ndarray]:
    """:func:`domain_leakage_w` with the RRAM periphery's bias (:func:`bias_w`) in its ``rram_adc`` domain: the static
    watts of one PE in each state at the reference temperature."""
    out = domain_leakage_w(target)
    out["rram_adc"] = out["rram_adc"] + bias_w(target)
    return out


def sram_powered(arrays: Mapping[str, np.ndarray], num_cts: int, pes_per_ct: int) -> np.ndarray:
    """Per CT: SRAM-DCIM macros that can be powered, all but the ``pg_sram_off`` of the srpg schedule (every
    macro without one)."""
    off = arrays.get("pg_sram_off")
    return np.full(num_cts, pes_per_ct, dtype=np.int64) - (0 if off is None else off.astype(np.int64))


def timeline(records, start, finish, num_cts: int, end: int, sram_on: np.ndarray, pes_per_ct: int,
             reference_c: float) -> Timeline:
    """Every CT's state intervals from the replayed ``PG_ON``/``PG_OFF`` records (``sram_on``: kept as is;
    every scratchpad kept while gated until :func:`scratchpads_kept` says otherwise; leakage as stated, at
    ``reference_c``)."""
    op = records["op"]
    off = np.flatnonzero(op == Opcode.PG_OFF)
    on = np.flatnonzero(op == Opcode.PG_ON)
    ct = np.concatenate([records["ct"][off], records["ct"][on], records["ct"][on]]).astype(np.int64)
    at = np.concatenate([finish[off], start[on], finish[on]])
    state = np.concatenate([np.full(len(off), GATED), np.full(len(on), WAKING), np.full(len(on), ACTIVE)])
    sub = np.concatenate([np.zeros(len(off) + len(on), dtype=np.int64), np.ones(len(on), dtype=np.int64)])
    seq = np.concatenate([off, on, on]) * 2 + sub  # a PG_ON's "active" follows its "waking"
    # initial active state of every CT
    ct = np.concatenate([np.arange(num_cts), ct])
    at = np.concatenate([np.zeros(num_cts, dtype=np.int64), at])
    state = np.concatenate([np.full(num_cts, ACTIVE), state])
    seq = np.concatenate([np.full(num_cts, -1), seq])
    order = np.lexsort((seq, at, ct))
    ct, at, state = ct[order], at[order], state[order]
    nxt = np.empty_like(at)
    nxt[:-1] = at[1:]
    last = np.ones(len(ct), dtype=bool)
    last[:-1] = ct[1:] != ct[:-1]
    nxt[last] = end
    keep = nxt > at
    return Timeline(ct[keep], state[keep].astype(np.int8), at[keep], nxt[keep], sram_on,
                    np.full(num_cts, pes_per_ct, dtype=np.int64), np.ones(num_cts), np.full(num_cts, reference_c))


def scratchpads_kept(tl: Timeline, target: PrimalTarget, pes_per_ct: int, kv_bytes: np.ndarray | None,
                     inst_pe: np.ndarray, inst_begin: np.ndarray, inst_end: np.ndarray) -> Timeline:
    """``tl`` with ``scratch_kept``: per CT, its PEs whose scratchpad holds something to retain while the CT is
    gated: a KV chunk (``kv_bytes``, per ``ct * pes + pe``), or a buffer instance on it (``inst_pe``, same key)
    live across one of the CT's gated intervals. Every scratchpad is kept without ``kv_bytes`` (no occupancy
    known) or when the target's ``power_gating.gate_unused_scratchpad`` is false. A scratchpad's banks are
    kept together: the kv-ring spreads a chunk over every bank."""
    num_cts = len(tl.sram_on)
    if kv_bytes is None or not target.power_gating.gate_unused_scratchpad:
        return replace(tl, scratch_kept=np.full(num_cts, pes_per_ct, dtype=np.int64))
    used = kv_bytes > 0
    gated = np.flatnonzero(tl.state == GATED)  # sorted by (ct, begin), disjoint within a CT
    if len(gated):
        ct = inst_pe // pes_per_ct
        big = np.int64(1) << 44  # above every cycle count the schedule reaches
        key = tl.ct[gated].astype(np.int64) * big + tl.end[gated]
        nxt = np.searchsorted(key, ct * big + inst_begin, side="right")  # the CT's first gated interval ending after
        at = gated[np.minimum(nxt, len(gated) - 1)]
        across = (nxt < len(gated)) & (tl.ct[at] == ct) & (tl.begin[at] < inst_end)
        used[inst_pe[across]] = True
    return replace(tl, scratch_kept=used.reshape(num_cts, pes_per_ct).sum(axis=1).astype(np.int64))


def state_cycles(tl: Timeline, begin: int, end: int, weight: np.ndarray | None = None) -> np.ndarray:
    """CT-cycles spent in each state within ``[begin, end)`` (array over STATES); with ``weight`` (per CT),
    each CT's cycles times its weight."""
    span = np.clip(np.minimum(tl.end, end) - np.maximum(tl.begin, begin), 0, None).astype(np.float64)
    if weight is not None:
        span = span * weight[tl.ct]
    return np.bincount(tl.state, weights=span, minlength=len(STATES))


def static_energy_j(tl: Timeline, target: PrimalTarget, pes_per_ct: int, begin: int, end: int) -> dict[str, np.ndarray]:
    """Static joules within ``[begin, end)``: per domain, an array over STATES (the SRAM-DCIM domain's
    switched-off macros count as gated); each CT's leakage at its ``leak_scale``, the RRAM periphery's bias
    (:func:`bias_w`) as stated."""
    s = tl.leak_scale  # a CT's seconds weigh its leakage scale: "seconds" below are scaled seconds
    seconds = state_cycles(tl, begin, end, s) / target.system.clock_hz * pes_per_ct
    out = {k: w * seconds for k, w in domain_leakage_w(target).items()}
    out["rram_adc"] = out["rram_adc"] + bias_w(target) * (state_cycles(tl, begin, end) / target.system.clock_hz
                                                          * pes_per_ct)
    kept = state_cycles(tl, begin, end, tl.sram_on * s) / target.system.clock_hz
    off = float((seconds - kept).sum())  # macro-seconds of the switched-off macros, whatever their CT's state
    sram_off = off * _off_w(target.sram.leakage_uw, target)
    out["sram_dcim"] = domain_leakage_w(target)["sram_dcim"] * kept + np.array([0.0, 0.0, sram_off])
    held = state_cycles(tl, begin, end, tl.scratch_kept * s)[GATED] / target.system.clock_hz
    out["scratchpad"][GATED] = (held * domain_leakage_w(target)["scratchpad"][GATED]
                                + (seconds[GATED] - held) * _off_w(target.router.scratchpad_leakage_uw, target))
    return out


def _off_w(leakage_uw: float, target: PrimalTarget) -> float:
    """Watts of one switched-off macro or scratchpad leaking ``leakage_uw`` when powered."""
    return leakage_uw * 1e-6 * target.power_gating.gated_leakage_fraction


def ct_static_j(tl: Timeline, target: PrimalTarget, pes_per_ct: int, num_cts: int, begin: int, end: int) -> np.ndarray:
    """Static joules of every CT within ``[begin, end)`` cycles: :func:`interval_watts` over each interval's
    share of the window."""
    span = np.clip(np.minimum(tl.end, end) - np.maximum(tl.begin, begin), 0, None) / target.system.clock_hz
    return np.bincount(tl.ct, weights=span * interval_watts(tl, target, pes_per_ct), minlength=num_cts)[:num_cts]


def interval_watts(tl: Timeline, target: PrimalTarget, pes_per_ct: int) -> np.ndarray:
    """Static watts of the CT of every timeline interval in its state: all its domains, its switched-off
    SRAM-DCIM macros at ``gated_leakage_fraction``, at the CT's ``leak_scale``, plus its RRAM periphery's bias
    (:func:`bias_w`, at no scale)."""
    leak = domain_leakage_w(target)
    others = sum((w for k, w in leak.items() if k not in ("sram_dcim", "scratchpad")), start=np.zeros(len(STATES)))
    on = tl.sram_on[tl.ct].astype(np.float64)
    held = np.where(tl.state == GATED, tl.scratch_kept[tl.ct], pes_per_ct).astype(np.float64)
    sram_off, pad_off = _off_w(target.sram.leakage_uw, target), _off_w(target.router.scratchpad_leakage_uw, target)
    return tl.leak_scale[tl.ct] * (others[tl.state] * pes_per_ct + leak["sram_dcim"][tl.state] * on
                                   + (pes_per_ct - on) * sram_off + leak["scratchpad"][tl.state] * held
                                   + (pes_per_ct - held) * pad_off) + interval_bias_watts(tl, target, pes_per_ct)


def interval_bias_watts(tl: Timeline, target: PrimalTarget, pes_per_ct: int) -> np.ndarray:
    """The part of :func:`interval_watts` no leakage scale touches: the RRAM periphery's bias (:func:`bias_w`) of
    the CT of every timeline interval in its state."""
    return bias_w(target)[tl.state] * pes_per_ct

