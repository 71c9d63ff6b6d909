"""Passes, pipelines and the pass manager.

A pass is a frozen dataclass registered under a kebab-case ``name``; its typed
fields are its options. Every option is declared with :func:`option`: its
default and, for a bounded value, its inclusive range ``(lo, hi)`` or its
choices, as field metadata. However a pass is made — parsed from pipeline
text, loaded from TOML, or built in code (``GaPlacement(...)``,
``dataclasses.replace``) — its ``__post_init__`` checks every option's type
and declared range before the pass's own rules (:meth:`Pass.check`), and any
violation is an :class:`~primal_compiler.errors.InputError` naming the pass,
the option and what is allowed; nothing else escapes parsing.

A pass declares the facts (:class:`~primal_compiler.ir.facts.Fact`) it
``requires``, ``provides`` and ``invalidates``; ``run(program, target)``
returns a new :class:`~primal_compiler.ir.program.Program` and never mutates
its input. Before any pass runs the manager checks the whole pipeline's
contracts: a pass needing a fact no earlier pass provides, or one an earlier
pass invalidated, and a pipeline ending with a fact made stale (codegen, then
a pass that moves the tiles), are errors naming the passes involved. It then
runs each pass, drops the facts it invalidates, times it, optionally
verifies every fact it provides (:mod:`primal_compiler.verify`), and appends
a :class:`PassRecord` so a report can replay the pipeline. Pipelines print and parse as ``a,b{opt=1,flag=true},c`` and load from
``passes/*.toml``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, get_type_hints

from primal_compiler.errors import InputError
from primal_compiler.inputs import read_toml
from primal_compiler.passopts import bound_problem, coerce, has_type, pass_where, shown, type_name, value_text
from primal_compiler.ir.facts import Fact, check_contracts, invalidated_by
from primal_compiler.resources import bundled
from primal_compiler.target.loader import require_primal

if TYPE_CHECKING:
    from primal_compiler.ir.program import Program
    from primal_compiler.target.spec import PrimalTarget

REGISTRY: dict[str, type[Pass]] = {}

#: Option types a pipeline can spell; any other field type is run-time wiring and must be ``internal``.
OPTION_TYPES = (bool, int, float, str, tuple[str, ...])

#: Ranges several passes share, so their options agree. Context in tokens: 128 Ki, the longest context of
#: current open LLMs (Llama 3.1, Mistral Large 2); the KV capacity check of kv-ring bounds it further per target.
CONTEXT_RANGE = (1, 131_072)
#: Tokens a sequence may generate (a million, past any context) and, by default, generates from decode steps replayed:
#: the first follows the prefill, two more show the decode settled (executor/steady.py), 61 repeats take it on.
MAX_GENERATE, DEFAULT_GENERATE, DEFAULT_REPLAYED = 1 << 20, 64, 3
#: Seeds: the unsigned 32-bit range numpy's generators and Python's ``random`` both take.
SEED_RANGE = (0, 2**32 - 1)


def option(default: Any, lo: int | float | None = None, hi: int | float | None = None,
           choices: tuple = ()) -> Any:
    """A pass option field: its default, and its inclusive range ``lo..hi`` or its ``choices`` as metadata.

    Every int and float option declares a range or choices (a test holds every registered pass to it).
    """
    meta: dict[str, Any] = {}
    if lo is not None or hi is not None:
        if lo is None or hi is None or not lo <= default <= hi:
            raise TypeError(f"range {lo}..{hi} must give both ends and hold the default {default!r}")
        meta["range"] = (lo, hi)
    if choices:
        if default not in choices:
            raise TypeError(f"choices {choices} must hold the default {default!r}")
        meta["choices"] = tuple(choices)
    return field(default=default, metadata=meta)


def internal(default: Any = None) -> Any:
    """A field that is not an option: run-time wiring, never parsed, printed, compared or checked."""
    return field(default=default, compare=False, repr=False, metadata={"internal": True})


@dataclass(frozen=True)
class Pass:
    """Base of every pass; subclasses set ``name``, ``requires``, ``provides`` and ``run``; ``invalidates`` follows
    from ``provides`` (:func:`~primal_compiler.ir.facts.invalidated_by`)."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    requires: ClassVar[frozenset[Fact]] = frozenset()
    provides: ClassVar[frozenset[Fact]] = frozenset()
    invalidates: ClassVar[frozenset[Fact]] = frozenset()
    workload_options: ClassVar[dict[str, str]] = {}  # option -> the Workload field that sets it

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "invalidates" in cls.__dict__:  # pragma: no cover - programming error
            raise TypeError(f"pass {cls.__name__}: invalidates is derived from provides (ir.facts.DEPENDS)")
        cls.invalidates = invalidated_by(cls.provides)
        if cls.name:
            if cls.name in REGISTRY and REGISTRY[cls.name] is not cls:
                raise RuntimeError(f"pass name {cls.name!r} registered twice")
            REGISTRY[cls.name] = cls

    def __post_init__(self) -> None:
        """Every option has its annotated type and lies in its declared range or choices, then :meth:`check`.

        Raises ``InputError("pass NAME", ...)``; a ``ValueError`` from :meth:`check` becomes one too.
        """
        where = f"pass {self.name}"
        for f, kind in option_fields(type(self)):
            value = getattr(self, f.name)
            if not has_type(value, kind):
                raise InputError(where, f"option {f.name}={shown(value)} is not a valid {type_name(kind)}")
            problem = bound_problem(f, value)
            if problem:
                raise InputError(where, f"{f.name} {problem}")
        try:
            self.check()
        except ValueError as exc:
            raise InputError(where, str(exc)) from None

    def check(self) -> None:
        """Rules tying options together (or beyond a range); raise ``ValueError`` naming the option."""

    def run(self, program: Program, target: PrimalTarget) -> Program:  # pragma: no cover - abstract
        raise NotImplementedError

    def workload_changes(self, workload: Any) -> dict[str, Any]:
        """The options ``workload`` (:class:`primal_compiler.pipeline.Workload`) sets: those named in
        ``workload_options`` that it gives; a pass whose other options follow overrides this."""
        return {opt: getattr(workload, name) for opt, name in self.workload_options.items()
                if getattr(workload, name) is not None}

    def for_workload(self, workload: Any) -> Pass:
        """This pass with the options ``workload`` sets (:meth:`workload_changes`), checked as any pass is."""
        changes = self.workload_changes(workload)
        return dataclasses.replace(self, **changes) if changes else self

    def spec(self) -> str:
        """This pass as pipeline text: options that differ from the defaults only."""
        changed = [
            f"{f.name}={value_text(getattr(self, f.name))}"
            for f, _ in option_fields(type(self))
            if getattr(self, f.name) != f.default
        ]
        return self.name + ("{" + ",".join(changed) + "}" if changed else "")


@dataclass(frozen=True)
class PassRecord:
    """What one pass did: its spec, wall time and the details it chose to log."""

    name: str
    spec: str
    seconds: float
    details: dict[str, Any] = field(default_factory=dict)


_OPTIONS: dict[type, tuple[tuple[dataclasses.Field, Any], ...]] = {}


def option_fields(cls: type) -> tuple[tuple[dataclasses.Field, Any], ...]:
    """(field, annotated type) of every option of pass class ``cls``, in declaration order (cached)."""
    cached = _OPTIONS.get(cls)
    if cached is None:
        hints = get_type_hints(cls)
        cached = tuple((f, hints[f.name]) for f in fields(cls) if not f.metadata.get("internal"))
        for f, kind in cached:
            if kind not in OPTION_TYPES:
                raise TypeError(f"{cls.__name__}.{f.name}: {kind} is no option type; declare it with internal()")
        _OPTIONS[cls] = cached
    return cached


def option_lines(cls: type) -> list[str]:
    """``name = default`` of every option of ``cls`` with its range or choices, as ``primal passes`` shows them."""
    lines = []
    for f, _ in option_fields(cls):
        bounds = f.metadata.get("range")
        rule = (f"  (range {value_text(bounds[0])}..{value_text(bounds[1])})" if bounds
                else f"  (one of {', '.join(map(value_text, f.metadata['choices']))})" if "choices" in f.metadata
                else "")
        lines.append(f"{f.name} = {f.default!r}{rule}")
    return lines


def make_pass(name: str, options: dict[str, Any]) -> Pass:
    """Instantiate registered pass ``name``; unknown passes or options, bad types or ranges are :class:`InputError`."""
    cls = REGISTRY.get(name)
    if cls is None:
        raise InputError(pass_where(name), f"unknown pass; known passes: {', '.join(sorted(REGISTRY))}")
    kinds = {f.name: kind for f, kind in option_fields(cls)}
    values = {}
    for opt, raw in options.items():
        if opt not in kinds:
            raise InputError(pass_where(name), f"unknown option {shown(opt)}; options: {', '.join(sorted(kinds)) or 'none'}")
        values[opt] = coerce(name, opt, kinds[opt], raw)
    return cls(**values)


def parse_pipeline(text: str) -> tuple[Pass, ...]:
    """Passes of ``a,b{opt=1,other=x},c``; the inverse of :func:`print_pipeline`.

    At least one pass; passes are separated by commas, each option is ``key=value`` and given once.
    """
    passes: list[Pass] = []
    i, text = 0, text.strip()
    if not text:
        raise InputError("pipeline", "empty pipeline; give passes such as lower-tiles,blocking,zcurve-order "
                                     "or a bundled name (default, fast, thorough)")
    while i < len(text):
        j = i
        while j < len(text) and text[j] not in ",{":
            j += 1
        name = text[i:j].strip()
        options: dict[str, str] = {}
        if j < len(text) and text[j] == "{":
            end = text.find("}", j)
            if end < 0:
                raise InputError("pipeline", f"unclosed '{{' after pass {shown(name)}")
            for item in filter(None, (s.strip() for s in text[j + 1 : end].split(","))):
                if "=" not in item:
                    raise InputError(pass_where(name), f"option {shown(item)} is not key=value")
                key, value = (s.strip() for s in item.split("=", 1))
                if key in options:
                    raise InputError(pass_where(name), f"option {shown(key)} given twice")
                options[key] = value
            j = end + 1
            if j < len(text) and text[j] not in ", ":
                raise InputError("pipeline", f"expected ',' after the options of pass {shown(name)}, got {text[j]!r}")
        if not name:
            raise InputError("pipeline", f"empty pass name in {shown(text)}")
        passes.append(make_pass(name, options))
        while j < len(text) and text[j] in ", ":
            j += 1
        i = j
    return tuple(passes)


def print_pipeline(passes: tuple[Pass, ...]) -> str:
    return ",".join(p.spec() for p in passes)


def load_pipeline_file(path: Path) -> tuple[Pass, ...]:
    """Passes of a TOML pipeline: optional ``description`` (a string) and ``[[pass]]`` tables with ``name`` and options.

    The file is read through :func:`primal_compiler.inputs.read_toml` (a regular UTF-8 file within
    ``TEXT_LIMIT_BYTES``); every problem is one :class:`InputError` naming the file.
    """
    where = str(path)
    data = read_toml(path, "pipeline file")
    unknown = set(data) - {"description", "pass"}
    if unknown:
        raise InputError(where, f"unknown key(s) {', '.join(sorted(unknown))}; a pipeline has description and [[pass]]")
    if not isinstance(data.get("description", ""), str):
        raise InputError(where, "description must be a string")
    entries = data.get("pass", [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise InputError(where, "pass must be an array of tables ([[pass]] entries)")
    passes = []
    for n, entry in enumerate(entries):
        entry = dict(entry)
        name = entry.pop("name", None)
        if not isinstance(name, str):
            raise InputError(where, f"[[pass]] number {n + 1} needs a name string")
        try:
            passes.append(make_pass(name, entry))
        except InputError as exc:
            raise InputError(where, str(exc)) from None
    if not passes:
        raise InputError(where, "pipeline has no [[pass]] entries")
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

    def run(self, program: Program, target: Any, progress: Callable[[str], None] | None = None) -> Program:
        """``program`` after every pass (``progress(name)`` called as each starts); a target that is not a PRIMAL
        target, or a pipeline whose contracts do not hold (:func:`check_contracts`), is refused before any pass
        runs."""
        require_primal(target, f"target {getattr(target, 'name', target)}")
        check_contracts(self.passes, program.facts, tuple(r.name for r in program.records))
        for p in self.passes:
            if progress is not None:
                progress(p.name)
            start = time.perf_counter()
            out = p.run(program, target)
            seconds = time.perf_counter() - start
            out = out.evolve(
                facts=(out.facts - p.invalidates) | p.provides,
                records=program.records + (PassRecord(p.name, p.spec(), seconds, out.pending_details),),
                pending_details={},
            )
            if self.verify:
                from primal_compiler.verify import verify_provided

                verify_provided(out, p)
            program = out
        return program
