"""The refusals a property would meet only by luck, each as an explicit case.

What is guaranteed: each command line of :data:`REFUSALS` ends with exit 2 and exactly one
``primal: `` line naming the option or argument at fault, before any work (within the time budget,
nothing in the scratch tree changed, no output written); those argparse refuses (an empty path, a bad
scheduler address, an abbreviated flag, a bad value) in its one form
``primal: VERB: argument FLAG: ... (primal VERB --help lists the options)``, or
``primal: command line: unrecognized arguments: ... (primal --help lists the options)``.

The cases: an option set where it has no effect (``disasm --force`` without ``-o``, ``serve --force``
without ``--perfetto``, ``sweep --x``/``--y`` without ``--plot``, ``trace --think`` with single turns,
``reproduce --solve-budget-s`` without ``--solve``, ``baseline --lora-mode`` without ``--lora``,
``run MODEL`` with a ``--functional`` option and ``run --functional`` with a cost-replay option), an empty
path positional or path option, a scheduler address that is not one or where nothing listens, and flags
given abbreviated; a path (an input or an output) past the file system's limits.
"""

from __future__ import annotations

import pytest

from tests.fuzz.harness import (BUDGET_S, argparse_form, check_streams, check_tree, copy_inputs, error_lines, invoke,
                                scratch, snapshot, violation)

RUN_MODEL = "run tiny-llama -p fast --context 64"
RUN_FUNCTIONAL = "run {s}/in/m.onnx --functional --weights {s}/in/m.onnx --prompt 1,2,3"
SERVE = "serve tiny-llama --adapters ad b --trace {s}/in/t.jsonl --context 64 -p fast"
SWEEP = "sweep {s}/in/s.toml -o {s}/res --workers 1 --no-progress"
TRACE = "trace -o {s}/t.jsonl --adapters a b --requests 3 --rate 1"
BASELINE = "baseline tiny-llama --gpu h100 --precision fp16 --batch 1 --prompt 4 --generate 4"

#: (command line, what the line must name, whether argparse refuses it). ``''`` is an empty argument.
REFUSALS: list[tuple[str, str, bool]] = [
    ("disasm {s}/in/out --force", "--force", False),
    (SERVE + " --force", "--force", False),
    (SWEEP + " --x itl_s", "--x", False),
    (SWEEP + " --y tokens_per_s:min", "--y", False),
    (TRACE + " --think 5", "--think", False),
    (TRACE + " --turns 1:1 --think 0", "--think", False),
    ("reproduce --model tiny-llama --context 64 --batch8-context 32 -p fast --solve-budget-s 5", "--solve-budget-s",
     False),
    (BASELINE + " --lora-mode merged", "--lora-mode", False),
    *((RUN_MODEL + " " + option, option.split()[0], False)
      for option in ("--weights {s}/in/m.onnx", "--prompt 1,2,3", "--precision hardware", "--temperature-c 50",
                     "--save-logits {s}/l.npy")),
    ("run {s}/in/out --prompt 1,2,3", "--prompt", False),
    *((RUN_FUNCTIONAL + " " + option, option.split()[0], False)
      for option in ("-o {s}/out", "--batch 2", "--batch 1", "--no-validate", "--control central", "--memory strict",
                     "--critical-path", "--replay-steps 2", "--baseline-gpu a100", "--baselines vllm:fp16")),
    ("run ''", "model", True),
    ("disasm ''", "program", True),
    ("disasm '' -o {s}/p.txt", "program", True),
    ("asm '' -o {s}/p.primal", "text", True),
    ("viz ''", "out", True),
    ("viz {s}/in/out --compare ''", "--compare", True),
    ("thermal ''", "out", True),
    ("sweep '' -o {s}/res", "spec", True),
    ("serve tiny-llama --adapters ad --trace ''", "--trace", True),
    (SWEEP + " --scheduler notaurl", "--scheduler", True),
    (SWEEP + " --scheduler tcp://127.0.0.1:0", "--scheduler", True),
    (SWEEP + " --scheduler tcp://127.0.0.1:1", "--scheduler", False),
    ("disasm {s}/in/out -o {s}/p.txt --forc", "--forc", True),
    ("compile tiny-llama --lor q,v:8 -o {s}/out", "--lor", True),
    ("inspect tiny-llama --js", "--js", True),
    (RUN_MODEL + " --gen 2", "--gen", True),
    ("run tiny-llama --batch x", "--batch", True),
    ("run tiny-llama --memory lenient", "--memory", True),
    *((template, "", False) for template in (
        "run {long}", "disasm {long}", "viz {long}", "thermal {long}", "viz {s}/in/out --compare {long}",
        "asm {long} -o {s}/p.primal", "sweep {long} -o {s}/res", "check {long} --prompt 1", "inspect {long}",
        "inspect tiny-llama --target {long}", "inspect tiny-llama --adapter {long}", "compile tiny-llama -p {long} -o {s}/o",
        "serve tiny-llama --adapters {long} --trace {s}/in/t.jsonl -p fast --context 64",
        "serve tiny-llama --adapters ad --trace {long} -p fast --context 64",
        RUN_FUNCTIONAL.replace("--weights {s}/in/m.onnx", "--weights {long}"))),
]
#: Path values past the file system's limits: a 300-byte component, and a path past PATH_MAX.
LONG = {"name": "n" * 300, "path": "d/" * 2100 + "f"}


def _argv(template: str, root, long: str) -> list[str]:
    return [("" if word == "''" else word.replace("{s}", str(root)).replace("{long}", long))
            for word in template.split()]


CASES = [(t, n, a, k) for t, n, a in REFUSALS for k in (sorted(LONG) if "{long}" in t else ["-"])]


@pytest.mark.parametrize("template, names, by_argparse, long", CASES,
                         ids=[t.replace("{long}", f"{{long-{k}}}") for t, _, _, k in CASES])
def test_refused_before_any_work(assets, template, names, by_argparse, long):
    with scratch() as root:
        copy_inputs(assets, root, ("out", "m.onnx", "t.jsonl", "s.toml", "ad"))
        argv = _argv(template, root, LONG.get(long, ""))
        before = snapshot(root)
        r = invoke(argv, root, BUDGET_S)
        check_streams(argv[0], r, argparse_refusal=by_argparse)
        if r.code != 2:
            violation("not-refused", "this command line must be refused with exit 2", r)
        line = error_lines(argv[0], r)[0]
        if names not in line:
            violation("unnamed", f"the error line does not name {names}", r)
        if not by_argparse and argparse_form(line):
            violation("argparse-line", "a refusal of the verb's own reads like argparse's", r)
        if r.over_budget:
            violation("slow-refusal", "ran into the time budget instead of refusing before any work", r)
        check_tree(r, before, snapshot(root), ())
