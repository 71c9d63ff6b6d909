"""Leakage at the dies' temperature: every CT's leakage scaled to the steady temperature its die reaches.

The target's leakage keys (``rram``, ``sram``, ``router`` ``leakage_uw`` and
``router.scratchpad_leakage_uw``) are stated at ``thermal.leakage_reference_c``
(300 K: the NeuroSim V1.4 7 nm FinFET device behind every one of them). A
transistor's off current grows about exponentially with temperature;
``thermal.leakage_doubling_k`` is the kelvins per doubling, derived from the
same device's off-current table (targets/primal-7nm.toml). A CT whose die is
at ``T`` leaks its stated leakage times :func:`scale` ``= 2 ** ((T -
reference) / doubling)``, held at 1 below the reference (the table starts
there, and leakage only falls below it: an upper bound).

Which temperature: a replay covers milliseconds, the package's thermal time
constants are seconds (docs/thermal.md), so a die settles at the steady state
of the power it dissipates on average. Each CT's temperature is the steady
state of the package's RC network (:mod:`.heat`) under the replay's mean
power per CT over the whole replayed span, its records' dynamic energy
(attributed as :func:`ct_dynamic_j` says), its RRAM periphery's bias
(``rram.idle_bias_uw``: set by design, not scaled) plus its leakage at that
temperature: the machine running this workload back to back. The two depend
on each other; iterating from ambient rises monotonically (the network's
inverse is non-negative, the scale grows with temperature) to the least
fixed point, or past ``thermal.model_max_c``, where the models stop holding
(leakage runaway or too little cooling): refused in one line. With
``thermal.leakage_temperature = "reference"`` every scale is 1: the leakage
keys as stated.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from primal_compiler.errors import InputError
from primal_compiler.executor import power
from primal_compiler.executor.heat import network
from primal_compiler.jit import njit

if TYPE_CHECKING:
    from primal_compiler.executor.power import Timeline
    from primal_compiler.executor.topology import Topology
    from primal_compiler.target.spec import PrimalTarget

TOLERANCE_K = 1e-6  # the fixed point is taken once no die moves more than this
MAX_ITERATIONS = 500


def scale(temperature_c: np.ndarray, target: PrimalTarget) -> np.ndarray:
    """Leakage at ``temperature_c`` over leakage at ``thermal.leakage_reference_c`` (module docstring)."""
    th = target.thermal
    rise = np.maximum(np.asarray(temperature_c, dtype=np.float64) - th.leakage_reference_c, 0.0)
    return np.exp2(rise / th.leakage_doubling_k)


def ct_dynamic_j(records: np.ndarray, energy_pj: Mapping[str, np.ndarray], rec: np.ndarray,
                 num_cts: int) -> tuple[np.ndarray, float]:
    """(joules per CT die, joules off the dies) of records ``rec``: a record's energy goes to the CT that
    issues it; a transfer to another CT (``dst_ct``) gives half to each end (a die-to-die link spends its
    energy in both PHYs; the CTs a package route passes through get none). The controller's issue energy
    and a controller-to-controller record are off the dies."""
    src, dst = records["ct"][rec].astype(np.int64), records["dst_ct"][rec].astype(np.int64)
    on_src, on_dst = src < num_cts, (dst < num_cts) & (dst != src)
    off = rec[~on_src & ~on_dst]
    dyn_j = np.zeros(num_cts)
    offdie_j = 0.0
    for name, per_record in energy_pj.items():
        if name == "controller":
            offdie_j += float((per_record[rec] * 1e-12).sum())
            continue
        _attribute(dyn_j, np.asarray(per_record, np.float64), rec, src, dst, on_src, on_dst)
        offdie_j += float((per_record[off] * 1e-12).sum())
    return dyn_j, offdie_j


@njit(nogil=True)
def _attribute(dyn_j, per_record, rec, src, dst, on_src, on_dst):  # pragma: no cover - compiled
    """Add each record's joules (``per_record`` pJ) to its issuing CT, then to the CT it writes to, half each
    where both are dies: the additions of ``np.add.at`` in its order, so the sums are the same to the bit."""
    for k in range(len(rec)):
        if on_src[k]:
            dyn_j[src[k]] += (0.5 if on_dst[k] else 1.0) * (per_record[rec[k]] * 1e-12)
    for k in range(len(rec)):
        if on_dst[k]:
            e = per_record[rec[k]] * 1e-12
            dyn_j[dst[k]] += 0.5 * e if on_src[k] else e


def steady(dynamic_w: np.ndarray, static_w: np.ndarray, topo: Topology, target: PrimalTarget,
           where: str = "program") -> tuple[np.ndarray, np.ndarray]:
    """(leakage scale, die temperature degC) of every CT dissipating ``dynamic_w`` plus ``static_w`` (its
    leakage at the reference temperature) times the scale at its temperature, in steady state (module
    docstring); all ones and the reference temperature under ``leakage_temperature = "reference"``.
    InputError naming ``where`` when a die passes ``thermal.model_max_c``."""
    th, n = target.thermal, topo.num_cts
    if th.leakage_temperature == "reference":
        return np.ones(n), np.full(n, th.leakage_reference_c)
    net = network(topo, target)
    inject = np.zeros((2 * n, n))
    inject[np.arange(n), np.arange(n)] = 1.0
    rise_per_w = np.linalg.solve(net.g, inject)[:n]  # kelvin at each die per watt into each die
    die = np.full(n, net.ambient_c)
    for _ in range(MAX_ITERATIONS):
        nxt = net.ambient_c + rise_per_w @ (dynamic_w + static_w * scale(die, target))
        hot = int(np.argmax(nxt))
        if nxt[hot] > th.model_max_c:
            raise InputError(where, f"CT {hot}'s die would pass {th.model_max_c:g} degC (thermal.model_max_c), where "
                                    "the leakage and drift models stop holding: its leakage at temperature runs "
                                    "away or the package cannot shed its power (thermal.leakage_temperature = "
                                    "\"reference\" takes the leakage as stated)")
        done = float(np.abs(nxt - die).max(initial=0.0)) <= TOLERANCE_K
        die = nxt
        if done:
            break
    return scale(die, target), die


def at_temperature(tl: Timeline, records: np.ndarray, energy_pj: Mapping[str, np.ndarray], end: int,
                   topo: Topology, target: PrimalTarget, where: str = "program") -> Timeline:
    """``tl`` with every CT's ``leak_scale`` and ``die_c`` at the steady temperature of the replay's mean power
    over ``[0, end)`` cycles (module docstring); unchanged for an empty replay."""
    if end <= 0:
        return tl
    seconds = end / target.system.clock_hz
    n = len(tl.sram_on)
    bias_j = power.ct_static_j(replace(tl, leak_scale=np.zeros(n)), target, topo.pes, topo.num_cts, 0, end)
    static_j = power.ct_static_j(replace(tl, leak_scale=np.ones(n)), target, topo.pes, topo.num_cts, 0, end) - bias_j
    dyn_j, _ = ct_dynamic_j(records, energy_pj, np.arange(len(records)), topo.num_cts)
    s, die = steady((dyn_j + bias_j) / seconds, static_j / seconds, topo, target, where)
    return replace(tl, leak_scale=s, die_c=die)
