"""Strict TOML loader for hardware targets.

``load_target("primal-7nm")`` or ``load_target("path/to/mine.toml")`` returns a
:class:`~primal_compiler.target.spec.PrimalTarget` or
:class:`~primal_compiler.target.spec.GpuTarget`. Every problem — missing file,
bad TOML, missing or unknown key, wrong type, impossible value, inconsistent
values — raises :class:`~primal_compiler.errors.InputError` with the file that
holds the offending value and a one-line ``"<table.key>: <problem>"``.

A file may start from another with ``extends = "<bundled name or path>"``: its
tables are merged key by key over the base (scalars replace, tables merge).
The extending file must set its own ``name`` and may contain only schema keys.

Tables map to nested dataclasses by field introspection: pydantic validates
presence, unknown keys, types (an int is accepted for a float, never a bool
for an int) and the field metadata rules with a model generated from each
table class (:mod:`.validate`); once every key holds a value of its type
within its rules, the stated ranges and each table's cross-field rules run,
table by table.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from primal_compiler.errors import InputError
from primal_compiler.inputs import read_toml
from primal_compiler.resources import bundled
from primal_compiler.target.gpu import GpuTarget
from primal_compiler.target.spec import KINDS, PrimalTarget, Target
from primal_compiler.target.table import is_table, type_hints
from primal_compiler.target.validate import describe, leaf, names, suggest, validated

__all__ = [
    "bundled_targets",
    "load_primal_target",
    "load_table",
    "load_target",
    "parse_override",
    "require_primal",
    "validate_all",
    "with_overrides",
]

_EXTENDS = "extends"
RANGE_SUFFIX = "_range"  # ``<key>_range = [low, high]``: the range the literature gives for a number


def bundled_targets() -> dict[str, Path]:
    """Bundled target files by name (file stem), sorted."""
    return bundled("targets")


def load_target(name_or_path: str | Path) -> Target:
    """Load and validate a target from a bundled name (``primal-7nm``) or a ``.toml`` path."""
    path = _resolve(name_or_path, base_dir=None, where=str(name_or_path))
    raw, prov = _load_merged(path, chain=())
    return _build_target(raw, prov, str(path))


def load_table(cls: type, path: str | Path, what: str) -> Any:
    """Load one TOML file into spec dataclass ``cls`` with the target files' strictness (GPU engine profiles).

    Missing, unknown or mistyped keys, values outside a field's rules and the
    class's cross-field problems raise :class:`InputError` naming ``path`` and the key.
    """
    raw = read_toml(Path(path), what)
    prov: dict[str, str] = {}
    _record(raw, "", str(path), prov)
    return _build(cls, raw, "", prov, str(path))


def load_primal_target(name_or_path: str | Path) -> PrimalTarget:
    """:func:`load_target`, refusing a GPU target with an :class:`InputError` (compile, run, map, inspect...)."""
    return require_primal(load_target(name_or_path), str(name_or_path))


def load_gpu_target(name_or_path: str | Path, where: str) -> GpuTarget:
    """:func:`load_target`, refusing anything but a GPU target with ``InputError(where, ...)``."""
    target = load_target(name_or_path)
    if not isinstance(target, GpuTarget):
        raise InputError(where, f"{name_or_path} is a {target.kind} target; give a GPU (a100, a100-40gb, h100, h200)")
    return target


def require_primal(target: Any, where: str) -> PrimalTarget:
    """``target`` if it is a PRIMAL target, else ``InputError(where, ...)`` naming what it is and what would do."""
    if isinstance(target, PrimalTarget):
        return target
    kind = getattr(target, "kind", type(target).__name__)
    raise InputError(where, f"is a {kind} target, a baseline for comparison; this needs a PRIMAL target "
                            f"(kind = \"primal\", e.g. primal-7nm or primal-5nm)")


def with_overrides(target: Target, overrides: Mapping[str, Any]) -> Target:
    """A copy of ``target`` with dotted keys replaced (``{"rram.adc_bits": 6}``), fully re-validated.

    An unknown key, a key that names a table, a wrong type or an impossible
    value raises :class:`InputError` naming the key. The stated ranges stay,
    except those of the replaced keys (an override may leave its range).
    """
    where = f"override of {target.name}"
    raw = target.to_dict()
    for dotted, (low, high) in target.ranges.items():  # the stated ranges stay, but not over a replaced value
        if dotted not in overrides:
            *path, last = dotted.split(".")
            table = raw
            for part in path:
                table = table[part]
            kind = type(table[last])
            table[last + RANGE_SUFFIX] = [kind(low), kind(high)]
    home = target.source or target.name
    prov: dict[str, str] = {}
    cls = type(target)
    for dotted, value in overrides.items():
        parts = dotted.split(".")
        node: dict[str, Any] = raw
        typ: Any = cls
        for depth, part in enumerate(parts):
            keys = names(typ)
            here = ".".join(parts[: depth + 1])
            if part not in keys:
                raise InputError(where, f"{here}: unknown key{suggest(part, keys)}")
            typ = type_hints(typ)[part]
            if depth < len(parts) - 1:
                if not is_table(typ):
                    raise InputError(where, f"{here}: is a value, not a table")
                node = node[part]
            elif is_table(typ):
                raise InputError(where, f"{dotted}: is a table; override its keys one by one")
        node[parts[-1]] = value
    # The target was valid, so whatever fails now is the overrides' doing.
    try:
        return _build_target(raw, prov, home)
    except InputError as exc:
        raise InputError(where, exc.problem) from None


def parse_override(text: str) -> tuple[str, Any]:
    """``"rram.adc_bits=6"`` -> ``("rram.adc_bits", 6)``; the value is parsed as a TOML value."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise InputError("override", f"{text!r}: expected KEY=VALUE, e.g. rram.adc_bits=6")
    try:
        parsed = tomllib.loads(f"v = {value.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        parsed = value.strip()  # a bare word is a string: routing=yx
    return key, parsed


def validate_all() -> list[tuple[str, bool, str]]:
    """Load every bundled target: ``(name, ok, message)`` per file, never raising."""
    results: list[tuple[str, bool, str]] = []
    for name, path in bundled_targets().items():
        try:
            target = load_target(path)
        except InputError as exc:
            results.append((name, False, str(exc)))
            continue
        if target.name != name:
            results.append((name, False, f"{path}: name: {target.name!r} does not match the file name {name!r}"))
        else:
            results.append((name, True, f"{target.kind} target, content hash {target.content_hash[:16]}"))
    return results


# --------------------------------------------------------------------------- files


def _resolve(ref: str | Path, base_dir: Path | None, where: str) -> Path:
    """Path of a target reference: a ``.toml`` path (relative to ``base_dir``) or a bundled name."""
    text = str(ref)
    if "\0" in text:
        raise InputError(where, "a target name or path cannot contain a NUL character")
    if isinstance(ref, Path) or text.endswith(".toml") or "/" in text or "\\" in text:
        path = Path(ref)
        if base_dir is not None and not path.is_absolute():
            path = base_dir / path
        return path
    if base_dir is not None and (base_dir / f"{text}.toml").is_file():
        return base_dir / f"{text}.toml"
    found = bundled_targets()
    if text in found:
        return found[text]
    names = ", ".join(found) or "(none)"
    raise InputError(where, f"unknown target {text!r}; bundled targets: {names} (or give a path to a .toml file)")


def _load_merged(path: Path, chain: tuple[Path, ...]) -> tuple[dict[str, Any], dict[str, str]]:
    """Raw tables of ``path`` with its ``extends`` chain merged in, and which file gave each key."""
    key = path.resolve()
    if key in chain:
        loop = " -> ".join(p.name for p in (*chain, key))
        raise InputError(str(path), f"{_EXTENDS}: cycle {loop}")
    raw = read_toml(path, "target file")
    prov: dict[str, str] = {}
    if _EXTENDS not in raw:
        _record(raw, "", str(path), prov)
        return raw, prov
    ref = raw.pop(_EXTENDS)
    if not isinstance(ref, str) or not ref:
        raise InputError(str(path), f"{_EXTENDS}: expected a target name or path string, got {describe(ref)}")
    if "name" not in raw:
        raise InputError(str(path), "name: missing key (a file that extends another must name itself)")
    base_path = _resolve(ref, base_dir=path.parent, where=f"{path}: {_EXTENDS}")
    base, prov = _load_merged(base_path, (*chain, key))
    _merge(base, raw, "", str(path), prov)
    return base, prov


def _record(raw: Mapping[str, Any], prefix: str, origin: str, prov: dict[str, str]) -> None:
    for k, v in raw.items():
        prov[prefix + k] = origin
        if isinstance(v, dict):
            _record(v, f"{prefix}{k}.", origin, prov)


def _merge(base: dict[str, Any], over: Mapping[str, Any], prefix: str, origin: str, prov: dict[str, str]) -> None:
    """Merge ``over`` into ``base`` in place: tables recursively, anything else replaced."""
    for k, v in over.items():
        dotted = prefix + k
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            prov[dotted] = origin
            _merge(base[k], v, f"{dotted}.", origin, prov)
        else:
            base[k] = v
            for stale in [p for p in prov if p.startswith(f"{dotted}.")]:
                del prov[stale]
            _record({k: v}, prefix, origin, prov)


# --------------------------------------------------------------------------- building


def _build_target(raw: dict[str, Any], prov: dict[str, str], origin: str) -> Target:
    kind = raw.get("kind")
    if kind is None:
        raise InputError(origin, "kind: missing key (one of " + ", ".join(map(repr, KINDS)) + ")")
    if not isinstance(kind, str) or kind not in KINDS:
        raise InputError(prov.get("kind", origin), f"kind: must be one of {', '.join(map(repr, KINDS))}, got {describe(kind)}")
    cls = KINDS[kind]
    ranges: dict[str, tuple[float, float]] = {}
    target = _build(cls, raw, "", prov, origin, ranges)
    object.__setattr__(target, "source", origin)
    object.__setattr__(target, "ranges", ranges)
    return target


def _build(cls: type, raw: Any, prefix: str, prov: dict[str, str], origin: str,
           ranges: dict[str, tuple[float, float]] | None = None) -> Any:
    """Instantiate dataclass ``cls`` from table ``raw``, validated by its pydantic model (:mod:`.validate`); a
    number's stated range (``<key>_range = [low, high]`` beside it) goes into ``ranges`` under its dotted key."""
    if not isinstance(raw, dict):
        raise InputError(prov.get(prefix[:-1], origin), f"{prefix[:-1]}: expected a table, got {describe(raw)}")
    stated: dict[str, Any] = {}
    clean = _without_ranges(cls, raw, prefix, stated) if ranges is not None else raw
    valid, problem = validated(cls, clean)
    if problem is not None:
        key = prefix + problem.key
        raise InputError(origin if problem.missing else prov.get(key, origin), f"{key}: {problem.message}")
    return _instantiate(cls, valid, prefix, prov, origin, ranges, stated)


def _without_ranges(cls: type, raw: dict[str, Any], prefix: str, stated: dict[str, Any]) -> dict[str, Any]:
    """``raw`` without the stated ranges of its numbers (nested tables too), which go into ``stated`` by dotted
    key; anything else, unknown keys included, stays for the validation to judge."""
    hints, keys = type_hints(cls), names(cls)
    out: dict[str, Any] = {}
    for k, v in raw.items():
        base = k.removesuffix(RANGE_SUFFIX)
        if k.endswith(RANGE_SUFFIX) and base in keys and hints[base] in (int, float):
            stated[prefix + base] = v
        elif k in keys and is_table(hints[k]) and isinstance(v, dict):
            out[k] = _without_ranges(hints[k], v, f"{prefix}{k}.", stated)
        else:
            out[k] = v
    return out


def _instantiate(cls: type, valid: Any, prefix: str, prov: dict[str, str], origin: str,
                 ranges: dict[str, tuple[float, float]] | None, stated: dict[str, Any]) -> Any:
    """The dataclass of a validated model, each stated range checked, then the class's cross-field rules."""
    hints, values = type_hints(cls), {}
    for name in names(cls):
        key, value = prefix + name, getattr(valid, name)
        if is_table(hints[name]):
            value = _instantiate(hints[name], value, f"{key}.", prov, origin, ranges, stated)
        elif key in stated and ranges is not None:
            ranges[key] = _range(cls, name, stated[key], value, key, prov.get(key + RANGE_SUFFIX, origin),
                                 prov.get(key, origin))
        values[name] = value
    obj = cls(**values)
    for name, problem in obj._problems():
        key = name if "." in name else prefix + name
        raise InputError(prov.get(key, origin), f"{key}: {problem}")
    return obj


def _range(cls: type, field: str, raw: Any, value: Any, key: str, where: str,
           value_where: str) -> tuple[float, float]:
    """The stated range ``[low, high]`` of ``key`` (from file ``where``): two values passing the field's rules,
    low <= value <= high; a value outside is an error naming the file that holds the value."""
    name = key + RANGE_SUFFIX
    if not isinstance(raw, list) or len(raw) != 2:
        raise InputError(where, f"{name}: expected [low, high], got {describe(raw)}")
    ends = []
    for v in raw:
        end, problem = leaf(cls, field, v)
        if problem is not None:
            raise InputError(where, f"{name}: {problem}")
        ends.append(end)
    low, high = ends
    if low > high:
        raise InputError(where, f"{name}: its low end {low} is above its high end {high}")
    if not low <= value <= high:
        stated = f"{name}" if where == value_where else f"{name} of {where}"
        raise InputError(value_where, f"{key}: {value} is outside its stated range {low}..{high} ({stated})")
    return float(low), float(high)

