"""How a pass option's value is read and checked: its type from pipeline text or TOML, its declared range or
choices, and the one-line wording of every refusal (``passmgr`` raises them naming the pass and the option)."""

from __future__ import annotations

import dataclasses
import re
from numbers import Integral, Real
from typing import Any

from primal_compiler.errors import InputError


def has_type(value: Any, kind: Any) -> bool:
    """Whether ``value`` is of option type ``kind`` (a bool is not an int, a tuple holds strings only)."""
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, Integral) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, Real) and not isinstance(value, bool)
    if kind is str:
        return isinstance(value, str)
    return isinstance(value, tuple) and all(isinstance(v, str) for v in value)


def bound_problem(f: dataclasses.Field, value: Any) -> str:
    """Why ``value`` breaks the declared range or choices of ``f`` (empty if it does not)."""
    if "range" in f.metadata:
        lo, hi = f.metadata["range"]
        if not lo <= value <= hi:  # also refuses NaN
            return f"must be >= {value_text(lo)} and <= {value_text(hi)}, got {cut(value_text(value))}"
    if "choices" in f.metadata and value not in f.metadata["choices"]:
        return f"must be one of {', '.join(map(value_text, f.metadata['choices']))}, got {shown(value)}"
    return ""


def type_name(kind: Any) -> str:
    """``kind`` as a message names it."""
    return "list of strings" if kind == tuple[str, ...] else kind.__name__


def value_text(value: Any) -> str:
    """``value`` as pipeline text writes it (``true``, ``a:b``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ":".join(value_text(v) for v in value)
    return str(value)


_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def coerce(pass_name: str, opt: str, kind: Any, raw: Any) -> Any:
    """Option value of the annotated type from pipeline text or TOML; wrong values name the pass and option."""
    try:
        return _convert(kind, raw)
    except (ValueError, OverflowError):
        raise InputError(pass_where(pass_name), f"option {opt}={shown(raw)} is not a valid {type_name(kind)}") from None


def _convert(kind: Any, raw: Any) -> Any:
    """``raw`` (a string, or a TOML value) as ``kind``; ``ValueError`` if it is not one."""
    if isinstance(raw, bool):
        if kind is bool:
            return raw
        raise ValueError
    if kind == tuple[str, ...]:
        items = raw if isinstance(raw, list) else [s for s in raw.split(":") if s] if isinstance(raw, str) else None
        if items is None or not all(isinstance(s, str) for s in items):
            raise ValueError
        return tuple(items)
    if not isinstance(raw, (str, int, float)):  # arrays, tables, dates
        raise ValueError
    if kind is bool:
        word = str(raw).lower()
        if word not in _TRUE + _FALSE:
            raise ValueError
        return word in _TRUE
    if kind is int:
        if isinstance(raw, float) and not raw.is_integer():
            raise ValueError
        return int(raw)
    if kind is float:
        return float(raw)  # NaN and infinities are refused by the option's range
    return str(raw)


_WORD = re.compile(r"[a-z0-9][a-z0-9-]*")


def pass_where(name: str) -> str:
    """``pass NAME`` for a message; a name that is not a plain word is quoted (so it stays one line)."""
    return f"pass {name}" if _WORD.fullmatch(name) else f"pass {shown(name)}"


def shown(value: Any) -> str:
    """``repr(value)`` for a one-line message, cut to 60 characters."""
    return cut(repr(value))


def cut(text: str, limit: int = 60) -> str:
    """``text`` cut to ``limit`` characters, ``...`` marking the cut."""
    return text if len(text) <= limit else text[: limit - 3] + "..."
