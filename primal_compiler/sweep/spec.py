"""Sweep specifications: points, grids, the spec, and the expansion of a spec into points.

A :class:`SweepSpec` is built (and validated) by :mod:`primal_compiler.sweep.load`
from a TOML file (format in that module and ``docs/sweep.md``). Axis keys are
the point fields (:data:`FIELDS`), ``PASS.OPTION`` of a registered pass
(``srpg.gating``) or any other dotted key, a target field (``rram.adc_bits``).

Guarantees: expansion is deterministic (grid order, then axes in file
order, last axis fastest); a point's :attr:`Point.point_id` is a hash of its
configuration only (model, LoRA, batch, context, target reference, target
overrides, full pipeline text), stable across runs, machines and axis order,
so the same configuration in two grids runs once; a configuration no pass
accepts (e.g. a context that is not a multiple of the KV chunk) is an
:class:`InputError` naming the grid and the point, raised by :meth:`SweepSpec.points`.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import primal_compiler.transforms  # noqa: F401  (registers every pass, so pipelines resolve)
from primal_compiler.errors import InputError

#: Axes that name a point's fields rather than a target field or a pass option.
FIELDS = ("model", "lora", "batch", "context", "target", "pipeline", "seed")
DEFAULTS: dict[str, Any] = {
    "model": "tiny-llama", "lora": None, "batch": 1, "context": 64, "target": "primal-7nm",
    "pipeline": "lower-tiles,blocking,zcurve-order,kv-ring,codegen,srpg", "seed": None,
}
SWEEP_KEYS = set(FIELDS) | {"metrics", "validate", "ga_executor", "description", "name"}
GA_EXECUTORS = ("serial", "pipeline", "sweep")


@dataclass(frozen=True)
class Point:
    """One configuration to compile and replay; everything a worker needs, all plain picklable values.

    ``axes`` holds every axis column of the sweep with this point's resolved
    value (a pass option that is not swept in this point's grid shows the
    pipeline's value); ``pipeline`` is the full pipeline text the point
    compiles with (KV space, pass options and seed applied).
    """

    point_id: str
    grid: str
    axes: tuple[tuple[str, Any], ...]
    model: str
    lora: str | None
    batch: int
    context: int
    target: str
    overrides: tuple[tuple[str, Any], ...]
    pipeline: str
    metrics: tuple[str, ...]
    validate: bool = False
    ga_executor: str = "serial"


@dataclass(frozen=True)
class Grid:
    """A named cartesian product of axes: ``(key, values)`` in file order."""

    name: str
    axes: tuple[tuple[str, tuple[Any, ...]], ...]


@dataclass(frozen=True)
class SweepSpec:
    """A validated spec: defaults, grids, kept metrics. :meth:`points` expands it."""

    source: str
    defaults: tuple[tuple[str, Any], ...]
    grids: tuple[Grid, ...]
    metrics: tuple[str, ...]
    validate: bool = False
    ga_executor: str = "serial"
    description: str = ""

    @property
    def axis_names(self) -> tuple[str, ...]:
        """Every axis column: the point fields, then the other axes in first-seen order."""
        seen = [f for f in FIELDS if f != "seed"]
        for g in self.grids:
            for key, _ in g.axes:
                if key not in seen:
                    seen.append(key)
        return tuple(seen)

    def points(self) -> list[Point]:
        """Every distinct point, in grid order (a configuration in two grids runs once, under the first)."""
        out, seen = [], set()
        for g in self.grids:
            keys = [k for k, _ in g.axes]
            for combo in itertools.product(*(vals for _, vals in g.axes)):
                p = self._point(g.name, dict(zip(keys, combo)))
                if p.point_id not in seen:
                    seen.add(p.point_id)
                    out.append(p)
        return out

    def _point(self, grid: str, chosen: dict[str, Any]) -> Point:
        try:
            return self._make_point(grid, chosen)
        except (InputError, ValueError, TypeError) as exc:
            what = ", ".join(f"{k}={v!r}" for k, v in chosen.items())
            problem = exc.args[0] if isinstance(exc, InputError) else str(exc)
            raise InputError(self.source, f"grid {grid!r}: point {what}: {problem}") from None

    def _make_point(self, grid: str, chosen: dict[str, Any]) -> Point:
        vals = dict(self.defaults) | {k: v for k, v in chosen.items() if k in FIELDS}
        base = Path(self.source).parent
        target = _target_ref(vals["target"], base)
        overrides = {k: v for k, v in dict(self.defaults).items() if _kind(k) == "target"}
        overrides |= {k: v for k, v in chosen.items() if _kind(k) == "target"}
        # a value equal to the target's own is no override: same configuration, same id
        overrides = {k: v for k, v in overrides.items() if v != _target_value(target, k)}
        options = {k: v for k, v in dict(self.defaults).items() if _kind(k) == "pass"}
        options |= {k: v for k, v in chosen.items() if _kind(k) == "pass"}
        pipeline = build_pipeline(_pipeline_ref(str(vals["pipeline"]), base), vals["batch"], vals["context"],
                                  vals["seed"], options)
        axes = []
        for name in self.axis_names:
            if name in FIELDS:
                axes.append((name, vals[name]))
            elif _kind(name) == "target":
                axes.append((name, dict(chosen).get(name, overrides.get(name, _target_value(target, name)))))
            else:
                axes.append((name, _pass_value(pipeline, name)))
        config = {"model": vals["model"], "lora": vals["lora"], "batch": vals["batch"], "context": vals["context"],
                  "target": str(vals["target"]), "overrides": sorted(overrides.items()), "pipeline": pipeline}
        digest = hashlib.sha256(json.dumps(config, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
        return Point(point_id=digest[:20], grid=grid, axes=tuple(axes), model=str(vals["model"]), lora=vals["lora"],
                     batch=int(vals["batch"]), context=int(vals["context"]), target=target,
                     overrides=tuple(sorted(overrides.items())), pipeline=pipeline, metrics=self.metrics,
                     validate=self.validate, ga_executor=self.ga_executor)


# --------------------------------------------------------------------------- helpers


def _kind(key: str) -> str:
    """``field`` (a point field), ``pass`` (PASS.OPTION of a registered pass), ``target`` (dotted) or ``unknown``."""
    from primal_compiler.passmgr import REGISTRY

    if key in FIELDS:
        return "field"
    head, dot, _ = key.partition(".")
    if not dot:
        return "unknown"
    return "pass" if head in REGISTRY else "target"


def _target_ref(ref: str, base: Path) -> str:
    """A target name, or a .toml path made absolute against the spec's directory (workers may run elsewhere)."""
    if ref.endswith(".toml") or "/" in ref:
        p = Path(ref)
        return str(p if p.is_absolute() else (base / p).resolve())
    return ref


def _pipeline_ref(ref: str, base: Path) -> str:
    return _target_ref(ref, base) if ref.endswith(".toml") else ref


def resolve(ref: str, base: Path):
    from primal_compiler.passmgr import resolve_pipeline

    return resolve_pipeline(_pipeline_ref(ref, base))


def _coerce_option(name: str, opt: str, raw: Any) -> Any:
    """``raw`` as the typed value of option ``opt`` of pass ``name`` (InputError if unknown or mistyped)."""
    if isinstance(raw, (list, dict)):
        raise InputError(f"pass {name}", f"option {opt}={raw!r} is not a scalar")
    return _coerce_cached(name, opt, raw)


@lru_cache(maxsize=4096, typed=True)
def _coerce_cached(name: str, opt: str, raw: Any) -> Any:
    from primal_compiler.passmgr import make_pass

    return getattr(make_pass(name, {opt: raw}), opt)


def build_pipeline(path: str, batch: int, context: int, seed: int | None, options: dict[str, Any]) -> str:
    """The point's pipeline text: KV space set, then ``seed`` on every seeded pass, then the swept pass options."""
    return _build_pipeline(path, batch, context, seed, tuple(sorted(options.items())))


@lru_cache(maxsize=65536)
def _build_pipeline(path: str, batch: int, context: int, seed: int | None, options: tuple) -> str:
    from primal_compiler.api import for_workload
    from primal_compiler.passmgr import print_pipeline
    from primal_compiler.pipeline import Workload

    passes = list(_parse(for_workload(path, Workload(batch=batch, context=context))))
    for i, p in enumerate(passes):
        changes = {}
        if seed is not None and hasattr(p, "seed"):
            changes["seed"] = seed
        for key, raw in options:
            name, opt = key.split(".", 1)
            if name == p.name:
                changes[opt] = _coerce_option(name, opt, raw)
        if changes:
            passes[i] = replace(p, **changes)  # options were checked by _coerce_option; ranges by the pass
    return print_pipeline(tuple(passes))


@lru_cache(maxsize=4096)
def _parse(text: str):
    """Parsed pipeline text (passes are frozen, so sharing them is safe); parsing is slow (type hints)."""
    from primal_compiler.passmgr import parse_pipeline

    return parse_pipeline(text)


def _target_value(target_ref: str, key: str) -> Any:
    from functools import reduce

    return reduce(getattr, key.split("."), _load_target_cached(target_ref))


def _pass_value(pipeline: str, key: str) -> Any:
    name, opt = key.split(".", 1)
    for p in _parse(pipeline):
        if p.name == name:
            v = getattr(p, opt)
            return ":".join(v) if isinstance(v, tuple) else v
    return None


_TARGETS: dict[str, Any] = {}


def _load_target_cached(ref: str):
    from primal_compiler.target import load_target

    if ref not in _TARGETS:
        _TARGETS[ref] = load_target(ref)
    return _TARGETS[ref]
