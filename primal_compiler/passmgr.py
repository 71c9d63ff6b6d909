"""Passes, pipelines and the pass manager.

A pass is a frozen dataclass registered under a kebab-case ``name``; its typed
fields are its options. It declares the facts it ``requires`` and ``provides``;
``run(program, target)`` returns a new :class:`~primal_compiler.ir.program.Program`
and never mutates its input. The manager checks each contract before running a
pass (the error names the passes already run), times it, optionally verifies
the IR afterwards, and appends a :class:`PassRecord` so a report can replay the
pipeline. Pipelines print and parse as ``a,b{opt=1,flag=true},c`` and load from
``passes/*.toml``.
"""

from __future__ import annotations

import dataclasses
import time
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, get_type_hints

from primal_compiler.errors import InputError
from primal_compiler.resources import bundled

REGISTRY: dict[str, type[Pass]] = {}


@dataclass(frozen=True)
class Pass:
    """Base of every pass; subclasses set ``name``, ``requires``, ``provides`` and ``run``."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    requires: ClassVar[frozenset[str]] = frozenset()
    provides: ClassVar[frozenset[str]] = frozenset()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.name:
            if cls.name in REGISTRY and REGISTRY[cls.name] is not cls:
                raise RuntimeError(f"pass name {cls.name!r} registered twice")
            REGISTRY[cls.name] = cls

    def run(self, program: Any, target: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def options(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def spec(self) -> str:
        """This pass as pipeline text: options that differ from the defaults only."""
        changed = [
            f"{f.name}={_format(getattr(self, f.name))}"
            for f in fields(self)
            if getattr(self, f.name) != _default(f)
        ]
        return self.name + ("{" + ",".join(changed) + "}" if changed else "")


@dataclass(frozen=True)
class PassRecord:
    """What one pass did: its spec, wall time and the details it chose to log."""

    name: str
    spec: str
    seconds: float
    details: dict[str, Any] = field(default_factory=dict)


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _format(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ":".join(_format(v) for v in value)
    return str(value)


def _coerce(pass_name: str, opt: str, kind: Any, raw: Any) -> Any:
    """Option value of the annotated type; wrong values name the pass and option."""
    where = f"pass {pass_name}"
    try:
        if kind is bool:
            if isinstance(raw, bool):
                return raw
            if str(raw).lower() in ("true", "1", "yes", "on"):
                return True
            if str(raw).lower() in ("false", "0", "no", "off"):
                return False
            raise ValueError
        if kind is int:
            if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                raise ValueError
            return int(raw)
        if kind is float:
            if isinstance(raw, bool):
                raise ValueError
            return float(raw)
        if kind is str:
            if not isinstance(raw, (str, int, float)) or isinstance(raw, bool):
                raise ValueError
            return str(raw)
        if kind == tuple[str, ...]:
            items = raw if isinstance(raw, list) else [s for s in str(raw).split(":") if s]
            return tuple(str(s) for s in items)
    except ValueError:
        raise InputError(where, f"option {opt}={raw!r} is not a valid {getattr(kind, '__name__', kind)}") from None
    raise InputError(where, f"option {opt} has unsupported type {kind}")


def make_pass(name: str, options: dict[str, Any]) -> Pass:
    """Instantiate registered pass ``name``; unknown passes or options are :class:`InputError`."""
    cls = REGISTRY.get(name)
    if cls is None:
        raise InputError(f"pass {name}", f"unknown pass; known passes: {', '.join(sorted(REGISTRY))}")
    hints = get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    values = {}
    for opt, raw in options.items():
        if opt not in known:
            raise InputError(f"pass {name}", f"unknown option {opt!r}; options: {', '.join(sorted(known)) or 'none'}")
        values[opt] = _coerce(name, opt, hints[opt], raw)
    try:
        return cls(**values)
    except (ValueError, TypeError) as exc:
        raise InputError(f"pass {name}", str(exc)) from None


def parse_pipeline(text: str) -> tuple[Pass, ...]:
    """Passes of ``a,b{opt=1,other=x},c``; the inverse of :func:`print_pipeline`."""
    passes: list[Pass] = []
    i, text = 0, text.strip()
    while i < len(text):
        j = i
        while j < len(text) and text[j] not in ",{":
            j += 1
        name = text[i:j].strip()
        options: dict[str, str] = {}
        if j < len(text) and text[j] == "{":
            end = text.find("}", j)
            if end < 0:
                raise InputError("pipeline", f"unclosed '{{' after pass {name!r}")
            for item in filter(None, (s.strip() for s in text[j + 1 : end].split(","))):
                if "=" not in item:
                    raise InputError(f"pass {name}", f"option {item!r} is not key=value")
                key, value = item.split("=", 1)
                options[key.strip()] = value.strip()
            j = end + 1
        if not name:
            raise InputError("pipeline", f"empty pass name in {text!r}")
        passes.append(make_pass(name, options))
        while j < len(text) and text[j] in ", ":
            j += 1
        i = j
    return tuple(passes)


def print_pipeline(passes: tuple[Pass, ...]) -> str:
    return ",".join(p.spec() for p in passes)


def load_pipeline_file(path: Path) -> tuple[Pass, ...]:
    """Passes of a TOML pipeline: ``[[pass]]`` tables with ``name`` and options."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise InputError(str(path), f"cannot read pipeline: {exc}") from None
    unknown = set(data) - {"description", "pass"}
    if unknown:
        raise InputError(str(path), f"unknown key(s) {', '.join(sorted(unknown))}")
    passes = []
    for entry in data.get("pass", []):
        entry = dict(entry)
        name = entry.pop("name", None)
        if not isinstance(name, str):
            raise InputError(str(path), "every [[pass]] needs a name")
        try:
            passes.append(make_pass(name, entry))
        except InputError as exc:
            raise InputError(str(path), exc.args[0]) from None
    if not passes:
        raise InputError(str(path), "pipeline has no [[pass]] entries")
    return tuple(passes)


def resolve_pipeline(spec: str) -> tuple[Pass, ...]:
    """A bundled pipeline name (``default``), a TOML path, or pipeline text."""
    named = bundled("passes")
    if spec in named:
        return load_pipeline_file(named[spec])
    if spec.endswith(".toml"):
        return load_pipeline_file(Path(spec))
    return parse_pipeline(spec)


class PassManager:
    """Runs passes in order, checking contracts and recording each stage."""

    def __init__(self, passes: tuple[Pass, ...], verify: bool = False) -> None:
        self.passes = passes
        self.verify = verify

    def run(self, program: Any, target: Any) -> Any:
        for p in self.passes:
            missing = p.requires - program.facts
            if missing:
                done = ", ".join(r.name for r in program.records) or "none"
                raise InputError(
                    f"pass {p.name}",
                    f"requires {', '.join(sorted(missing))}, which no earlier pass provided (passes run: {done})",
                )
            start = time.perf_counter()
            out = p.run(program, target)
            seconds = time.perf_counter() - start
            if self.verify:
                out.verify()
            details = out.pending_details
            out = out.evolve(
                facts=out.facts | p.provides,
                records=program.records + (PassRecord(p.name, p.spec(), seconds, details),),
                pending_details={},
            )
            program = out
        return program
