"""Published GPU measurements (``measurements.toml``) and what the engine-profile model predicts for each.

:func:`load_points` reads the file strictly (unknown or missing keys, wrong
types, by pydantic, and unknown metrics are :class:`InputError`); :func:`predict` runs
:func:`~primal_compiler.baselines.engine.serve` under a point's conditions and
returns the model's value of the point's metric; :func:`table` pairs them with
the relative error. Nothing here adjusts a constant: the points are what the
model is checked against, not fitted to.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from primal_compiler.errors import InputError
from primal_compiler.inputs import read_toml

__all__ = ["MEASUREMENTS", "METRICS", "REGIMES", "Point", "load_points", "predict", "regimes", "table", "tolerance"]

MEASUREMENTS = Path(__file__).resolve().parent / "measurements.toml"
METRICS = ("ttft_s", "itl_s", "end_to_end_tokens_per_s", "ratio", "power_w")
#: Largest |model / measured - 1| a point without ``miss`` may show.
TOLERANCE = 0.15
#: ... per metric where it differs: board power within 20% (issue 51's bar for published power readings).
TOLERANCES = {"power_w": 0.20}


def tolerance(metric: str) -> float:
    """The largest |model / measured - 1| a point of ``metric`` without ``miss`` may show."""
    return TOLERANCES.get(metric, TOLERANCE)


@dataclass(frozen=True)
class Point:
    """One published number and the conditions it was measured under."""

    id: str
    metric: str
    value: float
    model: str
    gpu: str
    engine: str
    precision: str
    batch: int
    prompt: int
    generate: int
    source: str
    study: str  # the publication or data set the point comes from (what leave-one-study-out leaves out)
    kv_bits: int = 16
    usable_fraction: float = 0.0  # 0: the target's own
    lora: str = ""  # adapters (a --lora spec), unmerged; "": none
    adapters: int = 1  # distinct adapters among the batch's sequences
    versus_precision: str = ""  # a ratio's other configuration: these differ, the rest is the same
    versus_kv_bits: int = 0  # 0: the same as ``kv_bits``
    versus_adapters: int = 0  # 0: the same as ``adapters``
    miss: str = ""
    held_out: bool = False  # no choice of the model was made with this point's source in view


def load_points(path: str | Path = MEASUREMENTS) -> list[Point]:
    """Every ``[[point]]`` of ``path``, validated as a :class:`Point` (:mod:`primal_compiler.target.validate`:
    unknown or missing keys, wrong types), then its cross-field rules."""
    from primal_compiler.target.validate import names, validated

    raw = read_toml(path, "measurements file")
    if set(raw) != {"point"} or not isinstance(raw["point"], list):
        raise InputError(str(path), "expected only [[point]] tables")
    out, seen = [], set()
    for i, entry in enumerate(raw["point"]):
        where = f"{path}: point {i + 1}"
        if not isinstance(entry, dict):
            raise InputError(where, "expected a table")
        valid, problem = validated(Point, entry)
        if problem is not None:
            raise InputError(where, f"{problem.key}: {problem.message}")
        point = Point(**{name: getattr(valid, name) for name in names(Point)})
        if point.metric not in METRICS:
            raise InputError(where, f"metric: must be one of {', '.join(METRICS)}, got {point.metric!r}")
        if (point.metric == "ratio") != bool(point.versus_precision or point.versus_kv_bits or point.versus_adapters):
            raise InputError(where, "versus_precision, versus_kv_bits or versus_adapters: required exactly when "
                                    "metric = \"ratio\"")
        if (point.adapters > 1 or point.versus_adapters > 1) and not point.lora:
            raise InputError(where, "adapters: several distinct adapters need lora")
        if point.id in seen:
            raise InputError(where, f"id: {point.id!r} appears twice")
        seen.add(point.id)
        out.append(point)
    return out


def predict(point: Point, memory_dynamic_w: float | None = None) -> float:
    """The model's value of ``point.metric`` under the point's conditions (``memory_dynamic_w``: the GPU's power
    slope replaced, as :mod:`.power` does to score a study with the other studies' share)."""
    from primal_compiler.baselines.engine import serve
    from primal_compiler.baselines.profile import load_engine
    from primal_compiler.target import GpuTarget, load_gpu_target, with_overrides

    overrides: dict[str, float] = {}
    if point.usable_fraction:
        overrides["memory.usable_fraction"] = point.usable_fraction
    if memory_dynamic_w is not None:
        overrides["power.memory_dynamic_w"] = memory_dynamic_w
    gpu = load_gpu_target(point.gpu, f"point {point.id}: gpu")
    if overrides:
        gpu = cast(GpuTarget, with_overrides(gpu, overrides))  # overrides keep a target's kind
    model, engine = _model(point.model, point.lora), load_engine(point.engine)

    def run(precision: str, kv_bits: int, adapters: int):
        return serve(model, gpu, engine, precision=precision, kv_bits=kv_bits, batch=point.batch,
                     prompt=point.prompt, generate=point.generate, lora_mode="unmerged" if point.lora else "merged",
                     adapters=adapters)

    s = run(point.precision, point.kv_bits, point.adapters)
    if point.metric == "ratio":
        versus = run(point.versus_precision or point.precision, point.versus_kv_bits or point.kv_bits,
                     point.versus_adapters or point.adapters)
        return s.end_to_end_tokens_per_s / versus.end_to_end_tokens_per_s
    return float(getattr(s, point.metric))


@functools.cache
def _model(name: str, lora: str):
    """The built-in model ``name`` with adapters ``lora`` ("": none), loaded once for every point that names it."""
    from primal_compiler.frontend import load_model

    return load_model(name, lora or None)


#: The regimes issue 51 names, each a rule on a point's conditions (a point may be in several, or in none).
REGIMES = ("grouped-query attention", "large static batch", "FP8 prefill", "eager engine", "board power",
           "INT4 weight-only")


def regimes(point: Point) -> tuple[str, ...]:
    """The :data:`REGIMES` ``point`` belongs to, from its conditions alone: a model with fewer KV heads than query heads
    in some layer; a batch of 256 or more; FP8 (either side of a ratio) with a first-token time or a prompt longer
    than the generation; the eager engine; a board-power reading; 4-bit weights (either side of a ratio)."""
    model = _model(point.model, point.lora)
    precisions = {point.precision, point.versus_precision}
    rules = (any(layer.attention.num_kv_heads < layer.attention.num_heads for layer in model.layers),
             point.batch >= 256,
             "fp8" in precisions and (point.metric == "ttft_s" or point.prompt > point.generate),
             point.engine == "hf-eager", point.metric == "power_w", bool(precisions & {"w4a16", "w4a8"}))
    return tuple(name for name, rule in zip(REGIMES, rules, strict=True) if rule)


def table(points: list[Point] | None = None) -> list[dict]:
    """``{id, metric, measured, model, error, within, miss, source, conditions}`` per point (error = model/measured - 1)."""
    rows = []
    for p in load_points() if points is None else points:
        got = predict(p)
        error = got / p.value - 1
        cond = (f"{p.model}, {p.gpu}, {p.engine}, {p.precision}" + (f" vs {p.versus_precision}" if p.versus_precision else "")
                + (f", LoRA {p.lora} unmerged, {p.adapters} adapters" if p.lora else "")
                + (f" vs {p.versus_adapters}" if p.versus_adapters else "")
                + f", KV {p.kv_bits}-bit, batch {p.batch}, {p.prompt}/{p.generate}")
        rows.append({"id": p.id, "metric": p.metric, "measured": p.value, "model": got, "error": error,
                     "within": abs(error) <= tolerance(p.metric), "miss": p.miss, "source": p.source, "conditions": cond,
                     "held_out": p.held_out, "study": p.study, "regimes": regimes(p)})
    return rows
