"""Fuzz targets with a long budget: how many cases each tried, how many escaped, and how.

An *escape* is any exception other than ``InputError`` (or a broken invariant,
an ``AssertionError``) raised while handling one generated input; the
test-suite runs the same targets with a short budget (tests/isa/test_loader_fuzz.py,
tests/frontend/test_onnx_fuzz.py, tests/test_option_fuzz.py).
Each target is a row of ``TARGETS``: a name, what it feeds, a function building
its hypothesis strategy (called once) and a function running one case in a
scratch directory and returning the stage it reached (a short label). Add a
target by adding a row.

Each case runs in a forked child (unless ``--in-process``), so one that kills
the process, as a segfault in a compiled kernel would, counts as an escape.

Run: python benchmarks/fuzz.py [--examples N] [--seed S] [--in-process] [TARGET ...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' mutators and consumers
from tests import test_option_fuzz as options  # noqa: E402
from tests.frontend import fuzzing as onnx_fuzzing  # noqa: E402
from tests.isa import fuzzing  # noqa: E402


class Target(NamedTuple):
    name: str
    feeds: str
    strategy: Callable[[], st.SearchStrategy]
    run: Callable[[Any, Path], str]
    warm: Callable[[Path], object] | None = None  # an unedited case, run here first so forks share compiled kernels


def _program(case: bytes, d: Path) -> str:
    path = d / "program.primal"
    path.write_bytes(case)
    return fuzzing.consume(path)


def _functional(case: bytes, d: Path) -> str:
    path = d / "program.primal"
    path.write_bytes(case)
    return fuzzing.consume_functional(path)


def _onnx(case: tuple[str, bytes], d: Path) -> str:
    name, data = case
    path = d / f"{name}.onnx"
    path.write_bytes(data)
    return onnx_fuzzing.consume(path)


def _checked(check: Callable[..., None], *args) -> str:
    """Run one of tests/test_option_fuzz.py's checks (an InputError is handled there; anything else escapes)."""
    check(*args)
    return "checked"


REQUESTS = "lower-tiles,blocking,zcurve-order,kv-ring{context=256,batch=2},codegen{requests=0;1;1,steps=2},srpg"
PLAIN = "lower-tiles,blocking,zcurve-order,kv-ring,codegen"
TARGETS = [
    Target("program-file", "edited tiny-llama (LoRA q,v:8, fast) program files: load, disasm/asm, run, viz, functional",
           lambda: fuzzing.mutants(), _program, lambda d: _program(fuzzing.base_program(), d)),
    Target("program-file-requests", "the same edits of a 3-request, 2-step, batch-2 program (adapter:1, no LoRA"
                                    " reuse)", lambda: fuzzing.mutants("q,v:8", REQUESTS), _program,
           lambda d: _program(fuzzing.base_program("q,v:8", REQUESTS), d)),
    Target("program-file-plain", "the same edits of a program without LoRA and without srpg",
           lambda: fuzzing.mutants(None, PLAIN), _program, lambda d: _program(fuzzing.base_program(None, PLAIN), d)),
    Target("asm-text", "edited disasm text (cut, lines deleted/duplicated/swapped, tokens changed): asm, then save, "
                       "load and every consumer", lambda: fuzzing.edited_texts(), fuzzing.assemble,
           lambda d: fuzzing.assemble(fuzzing.base_text(), d)),
    Target("functional-replay", "the same edits of an OPT LoRA fixture's program: load, then replay it numerically "
                                "on the fixture's weights",
           lambda: fuzzing.mutants(base=lambda: fuzzing.functional_setup()[0]), _functional,
           lambda d: _functional(fuzzing.functional_setup()[0], d)),
    Target("onnx-model", "mutated ONNX decoders (3 exporter fixtures, a hand-built opset-23 decoder inline and with "
                         "absent external data): load_model, inspect, load_onnx_weights",
           lambda: onnx_fuzzing.mutants(), _onnx),
    Target("pipeline-text", "mutated bundled and hand-written pipeline texts: parse, print, parse again",
           options.mutated_pipeline, lambda text, d: _checked(options._parse, text)),
    Target("pipeline-toml", "TOML pipelines of real and nonsense passes, options and values: load_pipeline_file",
           options.pipeline_tables, lambda text, d: _checked(options._load_pipeline, d / "p.toml", text.encode())),
    Target("target-toml", "bundled targets with values changed, lines dropped, duplicated or added: load_target",
           options.mutated_target, lambda text, d: _checked(options._load_target, d / "t.toml", text.encode())),
    Target("lora-spec", "random --lora texts: parse_lora_spec", lambda: st.text(max_size=40),
           lambda spec, d: _checked(options._lora, spec)),
]


def _where(exc: BaseException) -> str:
    """Exception type and the innermost frame inside primal_compiler (or the last frame)."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if "primal_compiler" in f.filename] or frames
    f = ours[-1]
    return f"{type(exc).__name__} at {Path(f.filename).name}:{f.lineno} ({f.name})"


def _one_case(target: Target, case, d: Path) -> tuple[str, str]:
    """(outcome, message) of one case in this process; outcome ``ESCAPED: <where>`` for an escape."""
    try:
        return target.run(case, d), ""
    except Exception as exc:  # noqa: BLE001 - counting escapes is the point
        return f"ESCAPED: {_where(exc)}", str(exc).splitlines()[0][:160] if str(exc) else ""


def _forked_case(target: Target, case, d: Path) -> tuple[str, str]:
    """:func:`_one_case` in a forked child, so a case that kills the process (a segfault) is an escape too."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        os.write(write, json.dumps(_one_case(target, case, d)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        answer = f.read()
    _, status = os.waitpid(pid, 0)
    if answer:
        return tuple(json.loads(answer))
    return f"ESCAPED: killed by signal {os.WTERMSIG(status) if os.WIFSIGNALED(status) else status}", ""


def fuzz(target: Target, examples: int, rng_seed: int, isolate: bool) -> tuple[int, Counter, Counter, dict]:
    """(cases tried, outcome counts, escape classes, an example message per class) of one target."""
    outcomes, escapes, examples_of = Counter(), Counter(), {}
    run = _forked_case if isolate else _one_case
    if target.warm is not None:
        with tempfile.TemporaryDirectory() as d:
            target.warm(Path(d))

    @seed(rng_seed)
    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(target.strategy())
    def one(case) -> None:
        with tempfile.TemporaryDirectory() as d:
            outcome, message = run(target, case, Path(d))
        if outcome.startswith("ESCAPED: "):
            key = outcome.removeprefix("ESCAPED: ")
            escapes[key] += 1
            examples_of.setdefault(key, message)
            outcome = "ESCAPED"
        outcomes[outcome] += 1

    one()
    return sum(outcomes.values()), outcomes, escapes, examples_of


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("targets", nargs="*", help=f"targets to run (default all: {', '.join(t.name for t in TARGETS)})")
    ap.add_argument("--examples", type=int, default=1000, help="cases per target (default 1000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--in-process", action="store_true",
                    help="run cases in this process (faster; a segfault then ends the run) instead of one fork each")
    args = ap.parse_args()
    unknown = set(args.targets) - {t.name for t in TARGETS}
    if unknown:
        ap.error(f"unknown target(s) {', '.join(sorted(unknown))}")
    rows = []
    for target in TARGETS:
        if args.targets and target.name not in args.targets:
            continue
        t = time.perf_counter()
        tried, outcomes, escapes, examples_of = fuzz(target, args.examples, args.seed, hasattr(os, "fork") and not args.in_process)
        seen = ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items()))
        rows.append(f"| {target.name} | {tried} | {outcomes['ESCAPED']} | {time.perf_counter() - t:.0f} | {seen} |")
        print(f"{target.name}: {target.feeds}: {tried} cases, {outcomes['ESCAPED']} escaped", flush=True)
        for key, count in escapes.most_common():
            print(f"  {count} x {key}: {examples_of[key]}", flush=True)
    print("\n| target | cases | escaped | seconds | outcomes |\n|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
