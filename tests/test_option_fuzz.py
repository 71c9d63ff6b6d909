"""Property fuzz of every option parser: nothing but ``InputError`` escapes, and every error is one line.

Four parsers a user feeds text to: pipeline text (``-p``), pipeline TOML files, target TOML files
(``--target``) and ``--lora`` specs. Each gets random input and structured mutations of valid input
(the bundled pipelines and targets, the README's specs): values replaced by huge, negative,
non-finite, mistyped or nested ones, lines dropped or duplicated, bytes flipped. A parse that
succeeds must give a value its own checks accept (a pipeline prints and re-parses to itself).
The strategies (``mutated_pipeline``, ``pipeline_tables``, ``mutated_target``) are module-level, so a
longer run can reuse them; here each property gets a short budget.
"""

from __future__ import annotations

import json
import math
import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import primal_compiler.transforms  # noqa: F401  (registers every pass)
from primal_compiler.errors import InputError
from primal_compiler.frontend.lora_spec import parse_lora_spec
from primal_compiler.passmgr import REGISTRY, load_pipeline_file, option_fields, parse_pipeline, print_pipeline
from primal_compiler.resources import bundled
from primal_compiler.target import bundled_targets, load_target

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

INTS = (0, 1, -1, 2, 3, 4, 7, 8, 32, 255, 256, 1024, 4096, 65_535, 65_536, 10**6, 2**31, 2**32, 2**63 - 1,
        -(2**63), 10**30)
FLOATS = (0.0, -0.0, 0.5, 1.0, -1.0, 1.5, 1e-300, 1e300, math.nan, math.inf, -math.inf)
WORDS = ("", "x", "true", "false", "median", "port", "serial", "q.0.0@0.0", "0;1", "primal-7nm", "h100",
         "{", "}", ",", "=", ":", ";", "\\", "\x00", "\xff", "é", "💥", " " * 3)
NAMES = tuple(sorted(REGISTRY)) + ("frobnicate", "", "lower-tiles ")
OPTIONS = tuple(sorted({f.name for name in REGISTRY for f, _ in option_fields(REGISTRY[name])})) + (
    "executor_override", "colour", "")

SCALARS = st.one_of(st.sampled_from(INTS), st.integers(), st.sampled_from(FLOATS), st.floats(),
                    st.booleans(), st.sampled_from(WORDS), st.text(max_size=12))
TOML_VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(OPTIONS + ("name",)), inner, max_size=3)),
    max_leaves=6)


def _one_line(exc: InputError) -> None:
    assert "\n" not in str(exc) and len(str(exc)) < 4000, str(exc)[:300]


def _toml(value) -> str:
    """A TOML value (inline tables and arrays); non-finite floats as TOML spells them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + "}"


@pytest.fixture(scope="module")
def scratch():
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


# --------------------------------------------------------------------------- pipeline text

VALID_TEXTS = tuple(print_pipeline(load_pipeline_file(p)) for p in bundled("passes").values()) + (
    "lower-tiles{lora_bits=4},blocking{context=512},zcurve-order{hubs=port},"
    "ga-placement{seed=1,generations=60,population=8,pins=q.0.0@0.0,executor=serial}",
    "lower-tiles,blocking,zcurve-order,lora-sparsity{zero_fraction=0.25,seed=3},kv-ring{context=64,batch=2},"
    "codegen{requests=0;1,prompt=5,steps=4},srpg{gating=false}",
    "lower-tiles,blocking,hilbert-order,exact-placement{max_tiles=8,deterministic_time=1.5}",
)


def _parse(text: str) -> None:
    try:
        passes = parse_pipeline(text)
    except InputError as exc:
        _one_line(exc)
        return
    assert parse_pipeline(print_pipeline(passes)) == passes


@FUZZ
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=80))
def test_random_pipeline_text(text):
    _parse(text)


@FUZZ
@given(st.text(alphabet=",{}=:;. -_0123456789abcdefghijklmnopqrstuvwxyz", max_size=80))
def test_pipeline_shaped_text(text):
    _parse(text)


@st.composite
def mutated_pipeline(draw) -> str:
    text = draw(st.sampled_from(VALID_TEXTS))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(("value", "option", "insert", "delete", "pass")))
        if kind == "value" and "=" in text:
            spots = [m.span(1) for m in re.finditer(r"=([^,}]*)", text)]
            a, b = draw(st.sampled_from(spots))
            value = draw(st.one_of(st.sampled_from(INTS).map(str), st.sampled_from(FLOATS).map(str),
                                   st.sampled_from(WORDS), st.integers().map(str)))
            text = text[:a] + value + text[b:]
        elif kind == "option":
            name = draw(st.sampled_from(NAMES))
            opt, value = draw(st.sampled_from(OPTIONS)), draw(st.sampled_from(INTS + FLOATS + WORDS))
            text += f",{name}{{{opt}={value}}}"
        elif kind == "insert":
            at = draw(st.integers(0, len(text)))
            text = text[:at] + draw(st.sampled_from(WORDS + tuple(",{}=:;"))) + text[at:]
        elif kind == "delete" and text:
            at = draw(st.integers(0, len(text) - 1))
            text = text[:at] + text[at + draw(st.integers(1, 5)):]
        else:
            text = ",".join(draw(st.permutations(text.split(","))))
    return text


@FUZZ
@given(mutated_pipeline())
def test_mutated_pipelines(text):
    _parse(text)


# --------------------------------------------------------------------------- pipeline TOML


def _load_pipeline(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    try:
        load_pipeline_file(path)
    except InputError as exc:
        _one_line(exc)
        assert str(exc).startswith(f"{path}: ")


@st.composite
def pipeline_tables(draw) -> str:
    """A TOML pipeline of inline tables: mostly real passes and options, some nonsense in every place."""
    top = {}
    if draw(st.booleans()):
        top["description"] = draw(st.one_of(st.text(max_size=10), SCALARS))
    if draw(st.integers(0, 9)):
        entries = []
        for _ in range(draw(st.integers(0, 4))):
            entry = {"name": draw(st.one_of(st.sampled_from(NAMES), SCALARS))} if draw(st.integers(0, 7)) else {}
            for _ in range(draw(st.integers(0, 3))):
                entry[draw(st.sampled_from(OPTIONS))] = draw(TOML_VALUES)
            entries.append(entry if draw(st.integers(0, 9)) else draw(SCALARS))
        top["pass"] = entries
    else:
        top["pass"] = draw(TOML_VALUES)
    if not draw(st.integers(0, 9)):
        top[draw(st.sampled_from(("colour", "passes", "Pass")))] = draw(SCALARS)
    return "\n".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in top.items()) + "\n"


@FUZZ
@given(pipeline_tables())
def test_pipeline_toml_schema(scratch, text):
    _load_pipeline(scratch / "p.toml", text.encode("utf-8"))


@FUZZ
@given(st.sampled_from(sorted(bundled("passes").values())), st.lists(st.tuples(st.integers(0, 10**6), st.binary(max_size=3)),
                                                                     min_size=1, max_size=4))
def test_pipeline_toml_byte_mutations(scratch, path, edits):
    data = bytearray(path.read_bytes())
    for at, new in edits:
        at %= len(data) + 1
        data[at:at + 1] = new
    _load_pipeline(scratch / "p.toml", bytes(data))


# --------------------------------------------------------------------------- target TOML

TARGETS = {name: path.read_text(encoding="utf-8") for name, path in bundled_targets().items()}
ASSIGNMENT = re.compile(r"^(\s*[\w\"]+\s*=\s*)([^#\n]*?)(\s*(#.*)?)$")


def _load_target(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    try:
        target = load_target(path)
    except InputError as exc:
        _one_line(exc)
        return
    assert target.content_hash  # a loaded target is complete and hashable


@st.composite
def mutated_target(draw) -> str:
    lines = TARGETS[draw(st.sampled_from(sorted(TARGETS)))].splitlines()
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(("value", "value", "value", "drop", "duplicate", "add", "table")))
        n = draw(st.integers(0, len(lines) - 1))
        m = ASSIGNMENT.match(lines[n])
        if kind == "value" and m:
            lines[n] = m.group(1) + _toml(draw(TOML_VALUES)) + m.group(3)
        elif kind == "drop":
            del lines[n]
        elif kind == "duplicate":
            lines.insert(n, lines[n])
        elif kind == "add":
            lines.insert(n, f"{draw(st.sampled_from(OPTIONS + ('extends', 'kind', 'name')))} = {_toml(draw(TOML_VALUES))}")
        else:
            lines.insert(n, draw(st.sampled_from(("[rram]", "[ct]", "[nowhere]", "[[ct]]", "[rram.rows]"))))
    return "\n".join(lines) + "\n"


@FUZZ
@given(mutated_target())
def test_mutated_targets(scratch, text):
    _load_target(scratch / "t.toml", text.encode("utf-8"))


@FUZZ
@given(st.sampled_from(sorted(TARGETS)), st.lists(st.tuples(st.integers(0, 10**6), st.binary(max_size=3)),
                                                   min_size=1, max_size=4))
def test_target_byte_mutations(scratch, name, edits):
    data = bytearray(TARGETS[name].encode("utf-8"))
    for at, new in edits:
        at %= len(data) + 1
        data[at:at + 1] = new
    _load_target(scratch / "t.toml", bytes(data))


# --------------------------------------------------------------------------- --lora


def _lora(spec: str) -> None:
    try:
        requests = parse_lora_spec(spec)
    except InputError as exc:
        _one_line(exc)
        assert exc.where == "--lora"
        return
    for r in requests:
        assert 1 <= r.lora.rank and math.isfinite(r.lora.alpha) and r.lora.alpha > 0


@FUZZ
@given(st.text(max_size=40))
def test_random_lora_specs(spec):
    _lora(spec)


NUMBERS = st.one_of(st.sampled_from(INTS + FLOATS).map(str), st.integers().map(str), st.floats().map(repr),
                    st.sampled_from(("", " 8 ", "8.0", "1e400", "-inf", "0x10", "1_000", "9" * 5000)))


@FUZZ
@given(st.lists(st.tuples(st.lists(st.sampled_from(("q", "v", "k", "o", "attn", "mlp", "all", "q_proj", "zz", "")),
                                   min_size=1, max_size=3), NUMBERS, st.one_of(st.none(), NUMBERS)),
                min_size=1, max_size=3))
def test_structured_lora_specs(parts):
    _lora(";".join(",".join(t) + ":" + r + ("" if a is None else ":" + a) for t, r, a in parts))
