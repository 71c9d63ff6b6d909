"""The thermal report of a replay: every CT's temperature under a phase's power, sustained.

The replay covers milliseconds; the package's time constants are seconds to
minutes. The report therefore answers: *if the machine kept doing what the
replayed window does* (decode: generating tokens at the replayed rate;
prefill: prefilling prompts back to back), what temperature does each CT
die settle at, how fast, and what ADC offset does that give. Each CT's
power is its average over the window (:mod:`.drive`); the ripple within one
window is bounded by ``ripple_bound_k``: the hottest CT's window energy over
its die's heat capacity alone (the largest swing a die could see if none of
that heat left it during the window).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from primal_compiler.errors import InputError
from primal_compiler.thermal.adc import adc_offset_lsb
from primal_compiler.thermal.drive import drive
from primal_compiler.executor.heat import network

if TYPE_CHECKING:
    from primal_compiler.executor.replay import Replay
    from primal_compiler.executor.steady import Steady

CURVE_POINTS = 48


def thermal_report(rp: Replay, phase: str = "decode", request: int = 0, steady: Steady | None = None) -> dict:
    """JSON-ready temperatures of every CT (degC) under request ``request``'s ``phase`` power, sustained (a
    decode over ``steady``'s generation, as the run report's ``power_w``)."""
    d = drive(rp, phase, request, steady)
    net = network(rp.topo, rp.target)
    rise = net.steady_rise(d.ct_w)
    die = net.ambient_c + rise[: net.num_cts]
    plate = net.ambient_c + rise[net.num_cts :]
    hot = int(np.argmax(die))
    rates, _ = net.modes()
    times = np.geomspace(0.1 / rates[-1], 5.0 / rates[0], CURVE_POINTS)
    curve = net.ambient_c + net.transient_rise(d.ct_w, times)[:, hot]
    offset = adc_offset_lsb(rp.target, die, "thermal")
    return {
        "phase": phase, "request": request, "window_s": d.window_s, "ambient_c": net.ambient_c,
        "power_w": float(d.ct_w.sum()), "offdie_w": d.offdie_w, "num_cts": net.num_cts,
        "die_mm2": net.die_mm2, "site_mm2": net.site_mm2,
        "die_c": _stats(die), "plate_c": _stats(plate), "hottest_ct": hot,
        "hottest_ct_power_w": float(d.ct_w[hot]),
        "ripple_bound_k": float(d.ct_w.max() * d.window_s / net.c[: net.num_cts].max()),
        "time_constants_s": {"fastest": float(1.0 / rates[-1]), "slowest": float(1.0 / rates[0])},
        "adc_offset_lsb": {"max": float(offset.max()), "min": float(offset.min()),
                           "at_ambient": float(adc_offset_lsb(rp.target, net.ambient_c, "thermal")[0])},
        "per_ct": {"power_w": d.ct_w.tolist(), "die_c": die.tolist()},
        "warmup": {"t_s": times.tolist(), "hottest_die_c": curve.tolist()},
    }


def _stats(values: np.ndarray) -> dict:
    return {"max": float(values.max()), "mean": float(values.mean()), "min": float(values.min())}


def render_thermal(report: dict) -> str:
    """The text form of :func:`thermal_report`."""
    die, tc, off = report["die_c"], report["time_constants_s"], report["adc_offset_lsb"]
    lines = [
        f"thermal: {report['phase']} power sustained ({report['num_cts']} CTs, dies of {report['die_mm2']:.1f} mm2 "
        f"on {report['site_mm2']:.1f} mm2 sites, ambient {report['ambient_c']:g} degC)",
        f"  power on the dies     {report['power_w']:.4g} W (off the dies {report['offdie_w']:.3g} W), hottest CT "
        f"{report['hottest_ct']} at {report['hottest_ct_power_w']:.4g} W",
        f"  die temperature       max {die['max']:.3f}  mean {die['mean']:.3f}  min {die['min']:.3f} degC "
        f"(plate max {report['plate_c']['max']:.3f} degC)",
        f"  settling              time constants {tc['fastest']:.3g} s .. {tc['slowest']:.3g} s; ripple within "
        f"one window at most {report['ripple_bound_k']:.3g} K",
        f"  ADC offset            {off['min']:.3f} .. {off['max']:.3f} LSB on the dies ({off['at_ambient']:.3f} LSB "
        f"at ambient)",
    ]
    return "\n".join(lines)


def run_power(saved: dict, path: str, report: dict, rp: Replay, own_ambient: bool, generated: int) -> dict:
    """The saved run report's (``path``) power over the window :func:`thermal_report` drew (decode: its ``power_w``;
    prefill: its ``prefill_energy_j`` over the window), and whether the dies' watts plus ``offdie_w`` equal
    it (within 1e-9): ``compared`` only when the run is this replay's (same target and control, the
    target's own ambient, the same ``generated`` tokens a sequence). InputError naming ``path`` when the report
    lacks those figures."""
    m = saved.get("metrics")
    if not isinstance(m, dict) or not all(isinstance(m.get(k), (int, float)) and not isinstance(m.get(k), bool)
                                          for k in ("power_w", "prefill_energy_j")):
        raise InputError(path, "not a run report: its metrics need numbers power_w and prefill_energy_j")
    mine = report["power_w"] + report["offdie_w"]
    run_w = m["power_w"] if report["phase"] == "decode" else m["prefill_energy_j"] / report["window_s"]
    compared = (own_ambient and saved.get("target") == rp.target.name and m.get("control") == rp.control.mode
                and m.get("decode_steps") == generated and report["window_s"] > 0)
    return {"report": path, "power_w": float(run_w), "compared": bool(compared),
            "agrees": bool(compared and abs(mine - run_w) <= 1e-9 * abs(run_w))}


def render_run(run: dict) -> str:
    """The line :func:`run_power` adds to the text report."""
    verdict = ("the dies' and off-die watts add up to it" if run["agrees"] else
               "the dies' and off-die watts do NOT add up to it" if run["compared"] else
               "not compared: another target, control, ambient or generation")
    return f"\n  the run's report      {run['power_w']:.4g} W over this window ({run['report']}): {verdict}"
