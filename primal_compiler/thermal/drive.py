"""Per-CT power of a replay window: what heats each CT site of the thermal network.

The window is one of the run report's (``executor.metrics.phase_window``):
decode (first token to last token, the window of ``power_w``) or prefill.
Each CT's watts are its static power in its replayed power states
(``executor.power.interval_watts`` over the window) plus the dynamic energy
of the window's records over the window's length, attributed to CTs as
``executor.leakage.ct_dynamic_j`` says (a transfer to another CT gives half
to each end). Energy spent off the CT dies, the controller's issue energy
and a controller-to-controller record, is reported apart (``offdie_w``).
The static power's leakage is at each die's leakage scale of the replay
(``executor/leakage.py``: the whole replay's steady temperature), the RRAM
periphery's bias as stated. A decode
generation longer than the replayed steps (``steady``, the run report's
:class:`~primal_compiler.executor.steady.Steady`) repeats the middle step as
the report does: each repeat adds that step's records' energy and every
CT's static energy over one period to each CT, and the period to the
window. Every joule of the window lands in exactly one place, so the CT
watts plus ``offdie_w`` equal the report's ``power_w`` for the same
generation (a test checks it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from primal_compiler.executor import power as xpower
from primal_compiler.executor.leakage import ct_dynamic_j
from primal_compiler.executor.metrics import phase_window

if TYPE_CHECKING:
    from primal_compiler.executor.replay import Replay
    from primal_compiler.executor.steady import Steady



@dataclass(frozen=True, eq=False)
class Drive:
    """Watts per CT (``ct_w``), off the dies (``offdie_w``), over a window of ``window_s`` seconds."""

    phase: str
    ct_w: np.ndarray
    offdie_w: float
    window_s: float


def drive(rp: Replay, phase: str = "decode", request: int = 0, steady: Steady | None = None) -> Drive:
    """The average power of every CT over request ``request``'s ``phase`` window, a decode one extended by
    ``steady``'s repeated steps (module docstring)."""
    rec, begin, end = phase_window(rp, phase, request)
    n, cycles = rp.topo.num_cts, end - begin
    if cycles <= 0:
        raise ValueError(f"the {phase} window of request {request} is empty")
    dyn_j, offdie_j = ct_dynamic_j(rp.stream.records, rp.energy_pj, rec, n)
    static_j = xpower.ct_static_j(rp.timeline, rp.target, rp.topo.pes, n, begin, end)
    if phase == "decode" and steady is not None and steady.repeated:
        step_dyn, step_off = ct_dynamic_j(rp.stream.records, rp.energy_pj, steady.step_records, n)
        step_static = xpower.ct_static_j(rp.timeline, rp.target, rp.topo.pes, n, *steady.repeat_window(end))
        dyn_j, static_j = dyn_j + steady.repeated * step_dyn, static_j + steady.repeated * step_static
        offdie_j, cycles = offdie_j + steady.repeated * step_off, cycles + steady.repeated * steady.period_cycles
    window_s = rp.seconds(cycles)
    return Drive(phase, (dyn_j + static_j) / window_s, offdie_j / window_s, window_s)
