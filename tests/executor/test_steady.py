"""Steady-state decode (executor/steady.py): a generation extended from a few replayed steps equals its full replay.

The independent check is the full replay itself: every fixture family is compiled for 24 generated tokens
(the 4-token KV chunks put the new token's K/V in six different chunks) and replayed record by record, and
for 3 steps, extended to 24. The prefill and the first step agree exactly in time. The rest agrees within
what the extension leaves out: where a step appends its K/V changes its time by up to 0.4% on these
fixtures (the append's route crosses other links), so the mean ITL, tokens/s and energy agree within 1%,
and the test also asserts that the full replays do vary, so that bound is exercised and not vacuous. The
prefill's energy agrees within 1% too: leakage is priced at the dies' steady temperature under the
replay's mean power (executor/leakage.py), and 3 replayed steps are a different mean than 24.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from primal_compiler.api import compile_model
from primal_compiler.compiled import program_file
from primal_compiler.errors import InputError
from primal_compiler.executor.critical import critical_path
from primal_compiler.executor.metrics import metrics
from primal_compiler.executor.replay import replay
from primal_compiler.executor.steady import periodic, steady
from primal_compiler.frontend import load_model
from tests.functional.conftest import fixture, replay_target  # noqa: F401  (replay_target: a fixture)

GENERATE, REPLAYED, CONTEXT = 24, 3, 32
EXACT = ("ttft_s", "itl_first_step_s")
CLOSE = ("prefill_energy_j", "itl_s", "itl_p50_s", "itl_p99_s", "tokens_per_s", "energy_per_token_j", "tokens_per_j", "power_w")
CASES = ["llama_lora_qv_r4_torchscript", "mistral_dynamo", "gpt2_lora_cattn_r4_dynamo", "opt_dynamo"]


def _replay(model, target, steps: int, kv: str = ""):
    pipeline = (f"lower-tiles,blocking,zcurve-order,kv-ring{{context={CONTEXT},chunk_tokens=4,reserve_bytes=0{kv}}},"
                f"codegen{{steps={steps}}},srpg")
    program = compile_model(model, target, pipeline)
    meta, arrays = program_file(program, target)
    return replay(meta, arrays, program.stream, target)


def _agree(full: dict, short: dict) -> None:
    for key in EXACT:
        assert short[key] == pytest.approx(full[key], rel=1e-12), key
    for key in CLOSE:
        assert short[key] == pytest.approx(full[key], rel=0.01), key
    assert short["decode_steps"] == full["decode_steps"] == GENERATE
    assert short["generation"] == {**short["generation"], "tokens": GENERATE, "replayed_steps": REPLAYED,
                                   "repeated_steps": GENERATE - REPLAYED}
    assert full["itl_p50_s"] * 0.99 <= short["generation"]["period_s"] <= full["itl_p99_s"] * 1.01


@pytest.mark.parametrize("case", CASES)
def test_an_extended_generation_agrees_with_its_full_replay(case, replay_target):  # noqa: F811
    model = load_model(fixture(case))
    full = metrics(_replay(model, replay_target, GENERATE))
    _agree(full, metrics(_replay(model, replay_target, REPLAYED), generate=GENERATE))
    if case == "mistral_dynamo":  # its gaps move with the append chunk (3106 to 3112 cycles)
        assert full["itl_p99_s"] > full["itl_p50_s"]


def test_a_pipelined_batch_extends_pass_by_pass(small_target):
    model = load_model("tiny-llama", "q,v:8")
    full = metrics(_replay(model, small_target, GENERATE, ",batch=2"))
    short = metrics(_replay(model, small_target, REPLAYED, ",batch=2"), generate=GENERATE)
    assert full["passes"] == short["passes"] == 2
    _agree(full, short)


@pytest.fixture(scope="module")
def short(replay_target):  # noqa: F811
    return _replay(load_model(fixture("opt_dynamo")), replay_target, REPLAYED)


def test_a_step_that_is_not_a_shifted_copy_is_not_periodic(short):
    r, dec = short.stream.records, short.section("decode:0")
    assert periodic(r, short.start, short.finish, dec, REPLAYED)[0] > 0
    late = short.finish.copy()
    late[dec[-1]] += 1  # one record of the last step finishes a cycle later
    period, why = periodic(r, short.start, late, dec, REPLAYED)
    assert period == 0 and "not settled" in why
    other = r.copy()
    other["count"][dec[-5]] += 1  # the last step does more work (a KV cache still growing)
    period, why = periodic(other, short.start, short.finish, dec, REPLAYED)
    assert period == 0 and "other work" in why and "count" in why


def test_a_generation_that_cannot_be_extended_is_refused(short):
    dec = short.section("decode:0")
    with pytest.raises(InputError, match="p.primal: cannot extend 1 replayed decode steps to 24 .* needs two"):
        steady(short.stream.records, short.start, short.finish, dec[: len(dec) // REPLAYED], 1, GENERATE, "p.primal")
    with pytest.raises(InputError, match="generates 2 tokens but replays 3"):
        metrics(short, generate=2)


def test_without_a_longer_generation_nothing_repeats(short):
    m = metrics(short)
    assert m["generation"] == {"tokens": REPLAYED, "replayed_steps": REPLAYED, "repeated_steps": 0, "period_s": 0.0,
                               "planned": REPLAYED, "unsettled": None}
    assert np.isclose(m["tokens_per_s"], metrics(short, generate=REPLAYED)["tokens_per_s"])


def test_the_critical_path_of_an_extended_generation_is_the_metrics_itl(short):
    m = metrics(short, generate=GENERATE)
    cp = critical_path(short, generate=GENERATE)["itl"]
    assert cp["steps"] == GENERATE and cp["replayed_steps"] == REPLAYED
    assert cp["total_s"] == pytest.approx(m["itl_s"], rel=1e-12)
    assert sum(cp["by_class_s"].values()) == pytest.approx(cp["total_s"], rel=1e-12)
    assert critical_path(short)["itl"]["total_s"] == pytest.approx(metrics(short)["itl_s"], rel=1e-12)


def test_a_planned_generation_that_has_not_settled_covers_the_replayed_steps_and_says_why(short):
    late = short.finish.copy()
    late[short.section("decode:0")[-1]] += 1
    unsettled = replace(short, finish=late)
    with pytest.raises(InputError, match="has not settled"):
        metrics(unsettled, generate=GENERATE)  # asked for: refused
    g = metrics(unsettled, generate=GENERATE, required=False)["generation"]  # only planned: the replayed steps
    assert g["tokens"] == REPLAYED and g["repeated_steps"] == 0 and g["planned"] == GENERATE
    assert "not step 2 shifted in time" in g["unsettled"]
