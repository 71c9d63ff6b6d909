"""Sweep specifications: the TOML file, its validation and its expansion into points.

A spec is a TOML file::

    [sweep]                      # defaults of every point (all optional)
    target = "primal-7nm"        # bundled name or .toml path (relative to the spec)
    pipeline = "lower-tiles,blocking,zcurve-order,kv-ring,codegen,srpg"
    model = "tiny-llama"
    lora = "q,v:8"               # "none" for no adapters
    batch = 1
    context = 64
    metrics = ["tokens_per_s", "tokens_per_j", "power_w"]

    [axes]                       # one grid: the cartesian product of its axes
    model = ["llama2-7b", "llama2-13b"]
    "rram.adc_bits" = [4, 5]     # any target field, by dotted key
    "srpg.gating" = [true, false]  # PASS.OPTION of a pipeline pass
    seed = [0, 1]                # the seed option of every seeded pass

or several ``[[grid]]`` tables (each with an optional ``name`` and its own
axes) instead of ``[axes]``; the sweep is the union of the grids' products,
duplicate points (same configuration) run once.

Guarantees: :func:`load_spec` checks everything it can without compiling —
unknown ``[sweep]`` key, unknown axis key, empty or non-array axis, a value
of the wrong type or outside its range (each target value is applied to the
target alone, each pass option to its pass alone), unknown model, bad LoRA
text, unknown metric — and raises one :class:`InputError` naming the spec
file and the axis before any point runs. Expansion is deterministic (grid
order, then axes in file order, last axis fastest), and a point's
:attr:`Point.point_id` is a hash of its configuration only, stable across
runs, machines and axis order.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import primal_compiler.transforms  # noqa: F401  (registers every pass, so pipelines resolve)
from primal_compiler.errors import InputError
from primal_compiler.sweep.metrics import DEFAULT_METRICS, check_metric

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
        vals = dict(self.defaults) | {k: v for k, v in chosen.items() if k in FIELDS}
        base = Path(self.source).parent
        target = _target_ref(vals["target"], base)
        overrides = {k: v for k, v in dict(self.defaults).items() if _kind(k) == "target"}
        overrides |= {k: v for k, v in chosen.items() if _kind(k) == "target"}
        options = {k: v for k, v in dict(self.defaults).items() if _kind(k) == "pass"}
        options |= {k: v for k, v in chosen.items() if _kind(k) == "pass"}
        pipeline = build_pipeline(str(vals["pipeline"]), vals["batch"], vals["context"], vals["seed"], options,
                                  _pipeline_ref(str(vals["pipeline"]), base))
        axes = []
        for name in self.axis_names:
            if name in FIELDS:
                axes.append((name, vals[name]))
            elif _kind(name) == "target":
                axes.append((name, overrides.get(name, _target_value(target, name))))
            else:
                axes.append((name, _pass_value(pipeline, name)))
        config = {"model": vals["model"], "lora": vals["lora"], "batch": vals["batch"], "context": vals["context"],
                  "target": str(vals["target"]), "overrides": sorted(overrides.items()), "pipeline": pipeline}
        digest = hashlib.sha256(json.dumps(config, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
        return Point(point_id=digest[:20], grid=grid, axes=tuple(axes), model=str(vals["model"]), lora=vals["lora"],
                     batch=int(vals["batch"]), context=int(vals["context"]), target=target,
                     overrides=tuple(sorted(overrides.items())), pipeline=pipeline, metrics=self.metrics,
                     validate=self.validate, ga_executor=self.ga_executor)


# --------------------------------------------------------------------------- loading


def load_spec(path: str | Path) -> SweepSpec:
    """Read and fully validate a spec file; :class:`InputError` naming the file and key on any problem."""
    path = Path(path)
    where = str(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(where, "file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(where, f"cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(where, f"invalid TOML: {exc}") from None
    return spec_from_dict(raw, where)


def spec_from_dict(raw: dict[str, Any], where: str = "<spec>") -> SweepSpec:
    """Validate a parsed spec (the TOML's tables) and build a :class:`SweepSpec`."""
    unknown = set(raw) - {"sweep", "axes", "grid"}
    if unknown:
        raise InputError(where, f"unknown table(s) {', '.join(sorted(unknown))}; expected [sweep], [axes], [[grid]]")
    sweep = raw.get("sweep", {})
    if not isinstance(sweep, dict):
        raise InputError(where, "sweep: expected a table")
    if "axes" in raw and "grid" in raw:
        raise InputError(where, "give either [axes] or [[grid]] tables, not both")
    if "axes" in raw:
        if not isinstance(raw["axes"], dict):
            raise InputError(where, "axes: expected a table of KEY = [values]")
        grids_raw = [dict(raw["axes"], name="axes")]
    else:
        grids_raw = raw.get("grid", [])
        if not isinstance(grids_raw, list) or not grids_raw:
            raise InputError(where, "no axes: add an [axes] table or [[grid]] tables")
    base = Path(where).parent
    checker = _Checker(where, base)
    defaults = dict(DEFAULTS)
    metrics = tuple(DEFAULT_METRICS)
    opts = {"validate": False, "ga_executor": "serial", "description": ""}
    for key, value in sweep.items():
        here = f"sweep.{key}"
        if key == "metrics":
            if not isinstance(value, list) or not value or not all(isinstance(m, str) for m in value):
                raise InputError(where, f"{here}: expected a non-empty array of metric names")
            for m in value:
                check_metric(m, f"{where}: {here}")
            metrics = tuple(dict.fromkeys(value))
        elif key == "validate":
            if not isinstance(value, bool):
                raise InputError(where, f"{here}: expected a boolean, got {value!r}")
            opts["validate"] = value
        elif key == "ga_executor":
            if value not in GA_EXECUTORS:
                raise InputError(where, f"{here}: must be one of {', '.join(GA_EXECUTORS)}, got {value!r}")
            opts["ga_executor"] = value
        elif key in ("description", "name"):
            opts["description"] = str(value)
        elif key in FIELDS:
            defaults[key] = checker.field(key, value, here)
        elif _kind(key) in ("target", "pass"):
            defaults[key] = value  # checked below, against the default target / pipeline
        else:
            raise InputError(where, f"{here}: unknown key; expected {', '.join(sorted(SWEEP_KEYS))}, "
                                    "a target field (rram.adc_bits) or a pass option (srpg.gating)")
    grids = []
    for i, g in enumerate(grids_raw):
        if not isinstance(g, dict):
            raise InputError(where, f"grid[{i}]: expected a table")
        name = str(g.get("name", f"grid{i}"))
        axes = []
        for key, values in g.items():
            if key == "name":
                continue
            label = f"axes.{key}" if name == "axes" else f"grid {name!r}: {key}"
            if not isinstance(values, list):
                raise InputError(where, f"{label}: expected an array of values, got {values!r}")
            if not values:
                raise InputError(where, f"{label}: empty axis (give at least one value)")
            if key in FIELDS:
                vals = tuple(checker.field(key, v, f"{label}[{j}]") for j, v in enumerate(values))
            elif _kind(key) in ("target", "pass"):
                vals = tuple(values)
            else:
                raise InputError(where, f"{label}: unknown axis key; use {', '.join(FIELDS)}, a target field "
                                        "(e.g. rram.adc_bits) or PASS.OPTION (e.g. srpg.gating)")
            if len(set(map(repr, vals))) != len(vals):
                raise InputError(where, f"{label}: repeated value")
            axes.append((key, vals))
        if not axes:
            raise InputError(where, f"grid {name!r}: no axes")
        grids.append(Grid(name, tuple(axes)))
    spec = SweepSpec(source=where, defaults=tuple(defaults.items()), grids=tuple(grids), metrics=metrics,
                     validate=opts["validate"], ga_executor=opts["ga_executor"], description=opts["description"])
    checker.check_spec(spec)
    clash = set(spec.axis_names) & {m.split(".")[0] for m in metrics}
    if clash:
        raise InputError(where, f"sweep.metrics: {', '.join(sorted(clash))} is an axis column already")
    return spec


class _Checker:
    """Validates values against the targets, pipelines and models they apply to (each loaded once)."""

    def __init__(self, where: str, base: Path) -> None:
        self.where, self.base = where, base
        self._targets: dict[str, Any] = {}

    def fail(self, label: str, problem: str):
        raise InputError(self.where, f"{label}: {problem}")

    def field(self, key: str, value: Any, label: str) -> Any:
        if key in ("batch", "context"):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                self.fail(label, f"expected a positive integer, got {value!r}")
        elif key == "seed":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                self.fail(label, f"expected a non-negative integer, got {value!r}")
        elif key == "lora":
            if not isinstance(value, str):
                self.fail(label, f"expected LoRA text like \"q,v:8\" or \"none\", got {value!r}")
            return None if value.strip().lower() in ("", "none") else value
        elif not isinstance(value, str) or not value.strip():
            self.fail(label, f"expected a non-empty string, got {value!r}")
        return value

    def target(self, ref: str, label: str):
        from primal_compiler.target import load_target

        if ref not in self._targets:
            try:
                self._targets[ref] = load_target(_target_ref(ref, self.base))
            except InputError as exc:
                self.fail(label, str(exc))
        return self._targets[ref]

    def check_spec(self, spec: SweepSpec) -> None:
        from primal_compiler.frontend import load_model
        from primal_compiler.target import with_overrides

        defaults = dict(spec.defaults)
        targets = {defaults["target"]} | {v for g in spec.grids for k, vs in g.axes if k == "target" for v in vs}
        pipes = {defaults["pipeline"]} | {v for g in spec.grids for k, vs in g.axes if k == "pipeline" for v in vs}
        models = {defaults["model"]} | {v for g in spec.grids for k, vs in g.axes if k == "model" for v in vs}
        loras = {defaults["lora"]} | {v for g in spec.grids for k, vs in g.axes if k == "lora" for v in vs}
        for t in sorted(targets):
            self.target(t, f"target {t!r}")
        resolved = {}
        for p in sorted(pipes):
            try:
                resolved[p] = resolve(p, self.base)
            except InputError as exc:
                self.fail(f"pipeline {p!r}", str(exc))
        for m in sorted(models):
            for lora in sorted(loras, key=str):
                try:
                    load_model(m, lora)
                except InputError as exc:
                    self.fail(f"model {m!r}" + (f" with lora {lora!r}" if lora else ""), str(exc))
        target_values = [(k, "sweep." + k, [v]) for k, v in defaults.items() if _kind(k) == "target"]
        pass_values = [(k, "sweep." + k, [v]) for k, v in defaults.items() if _kind(k) == "pass"]
        for g in spec.grids:
            for k, vs in g.axes:
                label = f"axes.{k}" if g.name == "axes" else f"grid {g.name!r}: {k}"
                (target_values if _kind(k) == "target" else pass_values if _kind(k) == "pass" else []).append(
                    (k, label, list(vs)))
        for key, label, values in target_values:
            for t in sorted(targets):
                for j, v in enumerate(values):
                    try:
                        with_overrides(self.target(t, label), {key: v})
                    except InputError as exc:
                        self.fail(f"{label}[{j}]" if len(values) > 1 or label.startswith("axes") else label,
                                  exc.problem)
        for key, label, values in pass_values:
            name, opt = key.split(".", 1)
            for p, passes in resolved.items():
                if not any(x.name == name for x in passes):
                    self.fail(label, f"pipeline {p!r} has no {name} pass")
            for j, v in enumerate(values):
                try:
                    _coerce_option(name, opt, v)
                except InputError as exc:
                    self.fail(f"{label}[{j}]", exc.problem)
        if defaults["seed"] is not None or any(k == "seed" for g in spec.grids for k, _ in g.axes):
            for p, passes in resolved.items():
                if not any(hasattr(x, "seed") for x in passes):
                    self.fail("seed", f"pipeline {p!r} has no pass with a seed option")


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
    from primal_compiler.passmgr import make_pass

    if isinstance(raw, (list, dict)):
        raise InputError(f"pass {name}", f"option {opt}={raw!r} is not a scalar")
    if opt == "executor_override":
        raise InputError(f"pass {name}", f"unknown option {opt!r}")
    return getattr(make_pass(name, {opt: raw}), opt)


def build_pipeline(ref: str, batch: int, context: int, seed: int | None, options: dict[str, Any], path: str) -> str:
    """The point's pipeline text: KV space set, then ``seed`` on every seeded pass, then the swept pass options."""
    from primal_compiler.api import run_pipeline
    from primal_compiler.passmgr import parse_pipeline, print_pipeline

    passes = list(parse_pipeline(run_pipeline(path, batch, context)))
    for i, p in enumerate(passes):
        changes = {}
        if seed is not None and hasattr(p, "seed"):
            changes["seed"] = seed
        for key, raw in options.items():
            name, opt = key.split(".", 1)
            if name == p.name:
                changes[opt] = _coerce_option(name, opt, raw)
        if changes:
            try:
                passes[i] = replace(p, **changes)
            except (TypeError, ValueError) as exc:
                raise InputError(f"pass {p.name}", str(exc)) from None
    return print_pipeline(tuple(passes))


def _target_value(target_ref: str, key: str) -> Any:
    from functools import reduce

    return reduce(getattr, key.split("."), _load_target_cached(target_ref))


def _pass_value(pipeline: str, key: str) -> Any:
    from primal_compiler.passmgr import parse_pipeline

    name, opt = key.split(".", 1)
    for p in parse_pipeline(pipeline):
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
