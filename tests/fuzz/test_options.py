"""Every verb's command line, mutated (:mod:`tests.fuzz.argv`).

What is guaranteed, besides the streams and the scratch tree of :mod:`tests.fuzz.harness`:

- a command line argparse must refuse (an unknown or abbreviated flag, a missing required argument, a
  non-number or non-finite number for a numeric flag, a value outside a flag's choices, an empty path)
  ends with exit 2 and exactly argparse's one line, ``primal: VERB: ... (primal VERB --help lists the
  options)``, fast;
- one that sets an option where it has no effect (``disasm --force`` without ``-o``, ``run --functional``
  with a cost-replay option, ...) ends with exit 2 before any work, fast;
- the unmutated command lines succeed (:func:`test_every_base_command_line_succeeds`), so a refusal is
  the mutation's doing; ``run MODEL -o``'s compile-time settings (:func:`test_run_model_settings`) are
  accepted or refused, and a refusal leaves no OUT behind.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.fuzz.argv import BASE, SLOW_CASES, Mutant, mutated_argv, outputs
from tests.fuzz.harness import (BUDGET_S, FUZZ, Result, check_streams, check_tree, copy_inputs, invoke, scratch,
                                snapshot, violation)


def option_case(assets: Path, case: str, m: Mutant, budget_s: float = BUDGET_S) -> Result:
    with scratch() as root:
        copy_inputs(assets, root, ("out", "prog.txt", "m.onnx", "t.jsonl", "s.toml"))
        (root / "keep.txt").write_text("the user's, never touched")
        argv = [a.replace("{s}", str(root)) for a in m.argv]
        before = snapshot(root)
        r = invoke(argv, root, budget_s)
        after = snapshot(root)
        r.note = m.what
        check_streams(case.split("-")[0], r, argparse_refusal=m.argparse)
        if m.refused and r.code != 2:
            violation("bad-option-accepted", f"mutation ({m.what}) must be refused with exit 2", r)
        if m.refused and r.over_budget:
            violation("slow-refusal", f"mutation ({m.what}) ran into the time budget instead of failing fast", r)
        check_tree(r, before, after, outputs(case, argv, root))
        return r


@pytest.mark.parametrize("case", [c for c in BASE if c not in SLOW_CASES])
@settings(max_examples=10, **FUZZ)
@given(data=st.data())
def test_option_mutations(assets, case, data):
    option_case(assets, case, data.draw(mutated_argv(case), label="argv"))


@pytest.mark.parametrize("case", SLOW_CASES)
@settings(max_examples=4, **FUZZ)
@given(data=st.data())
def test_option_mutations_slow_verbs(assets, case, data):
    option_case(assets, case, data.draw(mutated_argv(case), label="argv"))


@settings(max_examples=8, **FUZZ)
@given(generate=st.integers(1, 16), steps=st.integers(1, 4), context=st.sampled_from((32, 64)),
       batch=st.sampled_from((1, 2)))
@example(generate=8, steps=2, context=64, batch=1)  # compiles, then the replay refuses: OUT is never written
def test_run_model_settings(assets, generate, steps, context, batch):
    """``run MODEL -o OUT`` over its compile-time settings: whatever refuses them (the pass, or the replay
    finding that the decode has not settled), a refusal leaves no OUT behind."""
    argv = ["run", "tiny-llama", "-p", "fast", "--generate", str(generate), "--replay-steps", str(steps),
            "--context", str(context), "--batch", str(batch), "-o", "{s}/out"]
    option_case(assets, "run-model", Mutant(argv, False, False, "settings"))


@pytest.mark.parametrize("case", BASE)
def test_every_base_command_line_succeeds(assets, case):
    """The unmutated command lines are valid, so a mutation's refusal is the mutation's doing."""
    r = option_case(assets, case, Mutant(BASE[case].split(), False, False, "none"), budget_s=10.0)
    assert r.code == 0, r.shown()
