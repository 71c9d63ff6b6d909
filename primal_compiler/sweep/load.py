"""Loading a sweep spec: the TOML file and its validation.

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
text or a model without the adapted projections, unknown metric, a
combination no pass accepts (every point is expanded) — and raises one
:class:`InputError` naming the spec file and the axis or point before any
point runs.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Literal, cast

from pydantic import AfterValidator, Field, TypeAdapter, ValidationError

from primal_compiler.errors import InputError
from primal_compiler.inputs import read_toml
from primal_compiler.sweep import MAX_POINTS
from primal_compiler.sweep.metrics import DEFAULT_METRICS, check_metric
from primal_compiler.target.validate import not_blank
from primal_compiler.sweep.spec import (
    DEFAULTS, FIELDS, GA_EXECUTORS, SWEEP_KEYS, Grid, SweepSpec, _coerce_option, _kind, _target_ref, resolve,
)


def load_spec(path: str | Path, max_points: int = MAX_POINTS) -> SweepSpec:
    """Read and fully validate a spec file; :class:`InputError` naming the file and key on any problem.

    The file is read as :func:`primal_compiler.inputs.read_toml` reads it (a regular UTF-8 file of at most
    ``TEXT_LIMIT_BYTES``); a spec of more than ``max_points`` points is refused before any point is expanded.
    """
    return spec_from_dict(read_toml(path, "sweep spec"), str(path), max_points)


def spec_from_dict(raw: dict[str, Any], where: str = "<spec>", max_points: int = MAX_POINTS) -> SweepSpec:
    """Validate a parsed spec (the TOML's tables) and build a :class:`SweepSpec` of at most ``max_points`` points."""
    if isinstance(max_points, bool) or not isinstance(max_points, int) or max_points < 1:
        raise InputError("--max-points", f"must be a positive integer, got {max_points!r}")
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
    validate, ga_executor, description = False, "serial", ""
    for key, value in sweep.items():
        here = f"sweep.{key}"
        if key == "metrics":
            for m in _valid(key, value, where, here):
                check_metric(m, f"{where}: {here}")
            metrics = tuple(dict.fromkeys(value))
        elif key == "validate":
            validate = _valid(key, value, where, here)
        elif key == "ga_executor":
            ga_executor = _valid(key, value, where, here)
        elif key in ("description", "name"):
            description = str(value)
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
    _check_size(grids, max_points, where)
    spec = SweepSpec(source=where, defaults=tuple(defaults.items()), grids=tuple(grids), metrics=metrics,
                     validate=validate, ga_executor=ga_executor, description=description)
    checker.check_spec(spec)
    clash = set(spec.axis_names) & {m.split(".")[0] for m in metrics}
    if clash:
        raise InputError(where, f"sweep.metrics: {', '.join(sorted(clash))} is an axis column already")
    return spec


def _typed(base: Any, what: str, *after: AfterValidator, **rules: Any) -> tuple[TypeAdapter, str]:
    return TypeAdapter(Annotated[base, Field(strict=True, **rules), *after]), f"expected {what}"


_TEXT = _typed(str, "a non-empty string", AfterValidator(not_blank))
#: The fixed keys of [sweep] and of the axes: pydantic's check of each, and what its message says is wanted.
_KEYS: dict[str, tuple[TypeAdapter, str]] = {
    "batch": _typed(int, "a positive integer", ge=1), "context": _typed(int, "a positive integer", ge=1),
    "seed": _typed(int, "a non-negative integer", ge=0),
    "lora": _typed(str, 'LoRA text like "q,v:8" or "none"'),
    "model": _TEXT, "target": _TEXT, "pipeline": _TEXT,
    "metrics": _typed(list[Annotated[str, Field(strict=True)]], "a non-empty array of metric names", min_length=1),
    "validate": _typed(bool, "a boolean"),
    "ga_executor": (TypeAdapter(cast(Any, Literal)[GA_EXECUTORS]), f"must be one of {', '.join(GA_EXECUTORS)}"),
}


def _valid(key: str, value: Any, where: str, label: str) -> Any:
    """``value`` of the fixed key ``key`` as pydantic validates it; else InputError naming ``label``."""
    adapter, what = _KEYS[key]
    try:
        return adapter.validate_python(value)
    except ValidationError:
        raise InputError(where, f"{label}: {what}, got {value!r}") from None


def _check_size(grids: list[Grid], max_points: int, where: str) -> None:
    """Refuse more than ``max_points`` points, counted from the axis lengths (nothing expanded)."""
    sizes = [math.prod(len(vals) for _, vals in g.axes) for g in grids]
    total = sum(sizes)
    if total <= max_points:
        return
    biggest = max(range(len(grids)), key=sizes.__getitem__)
    lengths = [str(len(vals)) for _, vals in grids[biggest].axes]
    shape = " x ".join(lengths[:12] + ["..."] * (len(lengths) > 12))
    raise InputError(where, f"{_count(total)} points (grid {grids[biggest].name!r}: {shape} values), more than "
                            f"the limit of {max_points:,}; raise it with --max-points N to run them anyway")


def _count(n: int) -> str:
    """``n`` with thousands separators, or its order of magnitude when it is astronomically large."""
    return f"{n:,}" if n < 10 ** 15 else f"about 10^{int(n.bit_length() * math.log10(2))}"


class _Checker:
    """Validates values against the targets, pipelines and models they apply to (each loaded once)."""

    def __init__(self, where: str, base: Path) -> None:
        self.where, self.base = where, base
        self._targets: dict[str, Any] = {}

    def fail(self, label: str, problem: str):
        raise InputError(self.where, f"{label}: {problem}")

    def field(self, key: str, value: Any, label: str) -> Any:
        value = _valid(key, value, self.where, label)
        if key == "lora":
            return None if value.strip().lower() in ("", "none") else value
        return value

    def target(self, ref: str, label: str):
        from primal_compiler.target import load_primal_target

        if ref not in self._targets:
            try:
                self._targets[ref] = load_primal_target(_target_ref(ref, self.base))
            except InputError as exc:
                self.fail(label, str(exc))
        return self._targets[ref]

    def check_spec(self, spec: SweepSpec) -> None:
        from primal_compiler.frontend import load_model
        from primal_compiler.target import with_overrides

        defaults = dict(spec.defaults)
        targets = {defaults["target"]} | {v for g in spec.grids for k, vs in g.axes if k == "target" for v in vs}
        pipes = {defaults["pipeline"]} | {v for g in spec.grids for k, vs in g.axes if k == "pipeline" for v in vs}
        for t in sorted(targets):
            self.target(t, f"target {t!r}")
        resolved = {}
        for p in sorted(pipes):
            try:
                resolved[p] = resolve(p, self.base)
            except InputError as exc:
                self.fail(f"pipeline {p!r}", str(exc))
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
        models = set()
        for point in spec.points():  # every combination the passes accept (InputError naming the point)
            models.add((point.model, point.lora))
        for m, lora in sorted(models, key=str):
            try:
                load_model(m, lora)
            except InputError as exc:
                self.fail(f"model {m!r}" + (f" with lora {lora!r}" if lora else ""), str(exc))
