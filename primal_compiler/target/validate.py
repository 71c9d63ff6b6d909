"""Validation of a table file by pydantic: models generated from the spec dataclasses' fields and rules.

Each table class (a frozen dataclass of :mod:`.spec`, :mod:`.gpu`, an
engine profile or a published GPU measurement) gets one pydantic model,
built once from its fields (a field with a default may be left out): strict
types (an int is accepted for a float, never a bool for an int; a float is
finite; a string not blank), the ``spec_field`` rules (``ge``, ``gt``,
``le``, ``lt``, ``multiple_of`` as pydantic constraints, ``choices`` after
the type), nested tables as nested models, unknown keys forbidden.
:func:`validated` validates raw TOML data with it, or returns the first
problem in the order a reader meets it (depth first; in each table its
unknown keys, by name, before its fields in declaration order) in the
loader's words: ``unknown key (did you mean 'adc_bits'?)``, ``missing key
(<the field's meaning>)``, ``expected an integer, got string "6"``, ``must be
>= 1, got 0``. :func:`leaf` checks one value of a leaf field (a stated range's
ends).
"""

from __future__ import annotations

import difflib
from dataclasses import MISSING, Field as DataField, dataclass, fields
from datetime import date, datetime, time
from functools import cache
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, create_model
from pydantic_core import PydanticCustomError

from primal_compiler.target.table import is_table, type_hints

_WORDS = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
_BOUNDS = {"greater_than_equal": ("ge", ">="), "greater_than": ("gt", ">"), "less_than_equal": ("le", "<="),
           "less_than": ("lt", "<"), "multiple_of": ("multiple_of", "a multiple of")}
_TABLE_ERRORS = frozenset({"model_type", "model_attributes_type", "dict_type"})
_CONFIG = ConfigDict(extra="forbid", strict=True, protected_namespaces=(), revalidate_instances="never")


@dataclass(frozen=True)
class Problem:
    """What is wrong, at which dotted key (relative to the validated table); ``missing`` when the key is absent."""

    key: str
    message: str
    missing: bool = False


def names(cls: type) -> list[str]:
    """The schema keys of table class ``cls`` in declaration order."""
    return [f.name for f in fields(cls) if not f.metadata.get("internal")]


def _choice(choices: tuple) -> AfterValidator:
    def check(value: Any) -> Any:
        if value not in choices:
            raise PydanticCustomError("choices", "must be one of {shown}", {"shown": ", ".join(map(repr, choices))})
        return value
    return AfterValidator(check)


def not_blank(value: str) -> str:
    """``value``, or a pydantic error when it is empty or only whitespace (as ``str.strip`` sees it)."""
    if not value.strip():
        raise PydanticCustomError("blank", "must not be empty")
    return value


def _annotation(typ: type, meta: dict[str, Any], optional: bool = False) -> Any:
    """A leaf field's type with its rules; a string must not be blank unless the field is ``optional`` (has a
    default, as "" for none)."""
    rules: dict[str, Any] = {k: meta[k] for k in ("ge", "gt", "le", "lt", "multiple_of") if k in meta}
    if typ is float:
        rules["allow_inf_nan"] = False
    parts: list[Any] = [Field(strict=True, **rules)]
    if typ is str and not optional:
        parts.append(AfterValidator(not_blank))
    if "choices" in meta:
        parts.append(_choice(tuple(meta["choices"])))
    return Annotated[typ, *parts]


@cache
def model(cls: type) -> type[BaseModel]:
    """The pydantic model of table class ``cls`` (module docstring)."""
    hints = type_hints(cls)
    spec: dict[str, Any] = {}
    for f in fields(cls):
        if f.metadata.get("internal"):
            continue
        typ = hints[f.name]
        default = ... if f.default is MISSING else f.default  # a field with a default may be left out
        spec[f.name] = (model(typ) if is_table(typ) else _annotation(typ, dict(f.metadata), default is not ...),
                        default)
    return create_model(f"{cls.__name__}File", __config__=_CONFIG, **spec)


@cache
def _leaf_adapter(cls: type, name: str) -> TypeAdapter:
    f = _field(cls, name)
    return TypeAdapter(_annotation(type_hints(cls)[name], dict(f.metadata), f.default is not MISSING))


def validated(cls: type, raw: dict[str, Any]) -> tuple[BaseModel | None, Problem | None]:
    """(the validated model of ``raw``, None) or (None, its first problem)."""
    try:
        return model(cls).model_validate(raw), None
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        return None, _problem(cls, min(errors, key=lambda e: _order(cls, e["loc"])))


def leaf(cls: type, name: str, value: Any) -> tuple[Any, str | None]:
    """(``value`` as field ``name`` of ``cls`` holds it, None) or (None, what is wrong with it)."""
    try:
        return _leaf_adapter(cls, name).validate_python(value), None
    except ValidationError as exc:
        return None, _words(exc.errors(include_url=False)[0], type_hints(cls)[name], _meta(cls, name))


def _order(cls: Any, loc: tuple) -> tuple:
    """Where a reader meets an error at ``loc``: per level, an unknown key (0, its name) before a field (1, its index)."""
    out: list[tuple[int, int, str]] = []
    for part in loc:
        keys = names(cls) if is_table(cls) else []
        if part in keys:
            out.append((1, keys.index(part), ""))
            cls = type_hints(cls)[part]
        else:
            out.append((0, 0, str(part)))
            cls = None
    return tuple(out)


def _problem(cls: type, err: Any) -> Problem:
    loc, parent = err["loc"], cls
    for part in loc[:-1]:
        parent = type_hints(parent)[part]
    key, last = ".".join(map(str, loc)), loc[-1]
    if err["type"] == "extra_forbidden":
        return Problem(key, f"unknown key{suggest(str(last), names(parent))}")
    if err["type"] == "missing":
        doc = _meta(parent, last).get("doc")
        return Problem(key, f"missing key ({doc})" if doc else "missing key", missing=True)
    typ = type_hints(parent)[last]
    if err["type"] in _TABLE_ERRORS or is_table(typ):
        return Problem(key, f"expected a table, got {describe(err['input'])}")
    return Problem(key, _words(err, typ, _meta(parent, last)))


def _field(cls: type, name: str) -> DataField:
    return next(f for f in fields(cls) if f.name == name)


def _meta(cls: type, name: str) -> dict[str, Any]:
    return dict(_field(cls, name).metadata)


def _words(err: Any, typ: type, meta: dict[str, Any]) -> str:
    """The loader's words for a leaf's pydantic error (a bound as the field declares it)."""
    kind, value = err["type"], err["input"]
    if kind in _BOUNDS:
        rule, op = _BOUNDS[kind]
        shown = describe(value).removeprefix("integer ") if isinstance(value, int) and typ is int \
            else repr(float(value) if typ is float else value)
        return f"must be {op} {meta.get(rule, err['ctx'][rule])}, got {shown}"
    if kind == "finite_number":
        return f"must be finite, got {float(value)}"
    if kind == "blank":
        return "must not be empty"
    if kind == "choices":
        return f"{err['msg']}, got {value!r}"
    return f"expected {_WORDS[typ]}, got {describe(value)}"


def describe(value: Any) -> str:
    """TOML-flavoured type and value, e.g. ``boolean true`` or ``string "6"``."""
    if isinstance(value, bool):
        return f"boolean {'true' if value else 'false'}"
    if isinstance(value, int):  # one far beyond any field's range is shown by its size, not its digits
        return f"integer {value}" if value.bit_length() < 128 else f"an integer of about {int(value.bit_length() * 0.30103)} digits"
    if isinstance(value, float):
        return f"float {value!r}"
    if isinstance(value, str):
        return "string " + quote(value)
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, (datetime, date, time)):
        return f"date/time {value.isoformat()}"
    return type(value).__name__  # pragma: no cover - tomllib yields nothing else


def quote(text: str, limit: int = 40) -> str:
    short = text if len(text) <= limit else text[: limit - 3] + "..."
    return '"' + short.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def suggest(name: str, keys: list[str]) -> str:
    close = difflib.get_close_matches(name, keys, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else f" (expected one of: {', '.join(keys)})"
