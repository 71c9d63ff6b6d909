"""GPU board power's memory slope from published readings, and each study scored by the others.

The engine-profile model draws ``P = min(tdp_w, idle_w + memory_dynamic_w * u_mem + compute_dynamic_w * u_tc)``
per phase (:mod:`.engine`). ``memory_dynamic_w`` is written as a *share* of the idle-to-TDP range that a decode
streaming HBM at the stream roof (``u_mem`` = :data:`U_REF`) draws: ``share * (tdp_w - idle_w) / U_REF``, one
dimensionless number for every GPU.

Each ``power_w`` point of ``measurements.toml`` implies the share that makes the model draw exactly the
measured power under the point's conditions (:func:`implied_share`; the model is linear in the slope below the
TDP cap). :func:`pooled_share` is the median over studies of each study's median: the value the GPU targets
carry (``tests/baselines/test_power.py`` holds them to it). :func:`leave_one_study_out` predicts every point
twice: with the targets as shipped (in-sample: its study helped choose the share) and with the share pooled
from the *other* studies only (out-of-sample), so a reader sees what the model is worth on a study it never saw.
"""

from __future__ import annotations

import statistics

from primal_compiler.baselines.calibration import Point, load_points, predict, tolerance
from primal_compiler.errors import InputError
from primal_compiler.target.gpu import GpuTarget

__all__ = ["U_REF", "implied_share", "leave_one_study_out", "pooled_share", "slope"]

#: HBM utilisation of a decode at the stream roof (the targets' ``stream_bandwidth_fraction``, 0.9).
U_REF = 0.9


def slope(gpu: GpuTarget, share: float) -> float:
    """``memory_dynamic_w`` of ``gpu`` for a decode at the stream roof drawing ``share`` of its idle-to-TDP range."""
    return share * (gpu.power.tdp_w - gpu.power.idle_w) / U_REF


def _gpu(point: Point) -> GpuTarget:
    from primal_compiler.target import load_gpu_target

    return load_gpu_target(point.gpu, f"point {point.id}")


def implied_share(point: Point) -> float:
    """The share at which the model draws ``point.value`` watts under the point's conditions."""
    gpu = _gpu(point)
    lo, hi = predict(point, 0.0), predict(point, 100.0)
    share = (point.value - lo) / ((hi - lo) / 100.0) * U_REF / (gpu.power.tdp_w - gpu.power.idle_w)
    if abs(predict(point, slope(gpu, share)) / point.value - 1) > 1e-6:  # linear only below the TDP cap
        raise InputError(f"point {point.id}", "its decode reaches the TDP cap in the model: no share gives its "
                                              "reading, so it cannot set or score the power slope")
    return share


def _studies(points: list[Point]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for p in points:
        out.setdefault(p.study, []).append(implied_share(p))
    return out


def pooled_share(points: list[Point] | None = None) -> float:
    """The median over studies of each study's median implied share (each study one vote, however many points)."""
    chosen = _power_points(points)
    return float(statistics.median(statistics.median(v) for v in _studies(chosen).values()))


def _power_points(points: list[Point] | None) -> list[Point]:
    return [p for p in (load_points() if points is None else points) if p.metric == "power_w"]


def leave_one_study_out(points: list[Point] | None = None) -> list[dict]:
    """Per power point: its study, the measured watts, the model's as shipped (``in_sample``) and with the share
    of the other studies (``held_out``, with that ``share``), and both relative errors."""
    chosen = _power_points(points)
    rows: list[dict] = []
    if len({p.study for p in chosen}) < 2:
        return rows  # one study leaves none to score it with
    for study in sorted({p.study for p in chosen}):
        others = [p for p in chosen if p.study != study]
        share = pooled_share(others)
        for p in (p for p in chosen if p.study == study):
            mine, theirs = predict(p), predict(p, slope(_gpu(p), share))
            rows.append({"id": p.id, "study": study, "batch": p.batch, "measured": p.value, "in_sample": mine,
                         "held_out": theirs, "share": share, "in_sample_error": mine / p.value - 1,
                         "held_out_error": theirs / p.value - 1, "tolerance": tolerance(p.metric)})
    return rows
