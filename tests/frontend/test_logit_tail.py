"""The logits' scale and soft-cap after the LM head (issue 52: Gemma 2's final soft-capping, Cohere's and
Granite's logit scale): recognised from the graph, replayed exactly by the controller's ACT LOGIT_CAP and
charged on the NMC's logits unit; anything else after the LM head is refused naming the node."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from primal_compiler.errors import InputError
from primal_compiler.frontend import load_model
from primal_compiler.functional import compile_for_replay, replay_functional
from primal_compiler.isa.opcodes import CONTROLLER, ActFn, Opcode
from tests.functional.conftest import fixture, replay_target  # noqa: F401  (replay_target: a fixture)
from tests.functional.reference import ort_greedy

BASE = "llama_lora_qkvo_r8_dynamo"
PROMPT = [3, 1, 4, 1, 5]


def _tail(tmp_path, steps: list[tuple[str, float | None]], name: str = "tailed.onnx") -> str:
    """The fixture with ``steps`` (op, scalar or None) applied to its logits before they leave the graph."""
    model = onnx.load(fixture(BASE))
    g = model.graph
    out = g.output[0]
    tensor = out.name
    for k, (op, value) in enumerate(steps):
        inputs = [tensor]
        if value is not None:
            g.initializer.append(numpy_helper.from_array(np.array(value, np.float32), f"tail.c{k}"))
            inputs.append(f"tail.c{k}")
        tensor = f"tail.{k}"
        g.node.append(helper.make_node(op, inputs, [tensor], name=f"tail_{op.lower()}_{k}"))
    out.name = tensor
    path = tmp_path / name
    onnx.save(model, path)
    return str(path)


CAPPED = [("Mul", 0.5), ("Div", 3.0), ("Tanh", None), ("Mul", 3.0)]


def test_a_scale_and_a_soft_cap_are_read(tmp_path):
    m = load_model(_tail(tmp_path, CAPPED))
    assert (m.logit_scale, m.logit_softcap) == (pytest.approx(0.5), pytest.approx(3.0))
    m = load_model(_tail(tmp_path, [("Div", 4.0)], "scaled.onnx"))
    assert (m.logit_scale, m.logit_softcap) == (pytest.approx(0.25), 0.0)


@pytest.mark.parametrize("steps", [CAPPED, [("Mul", 0.125)]], ids=["soft-capped", "scaled"])
def test_the_replay_computes_the_capped_logits_onnxruntime_does(tmp_path, replay_target, steps):  # noqa: F811
    path = _tail(tmp_path, steps)
    program = compile_for_replay(load_model(path), replay_target, len(PROMPT), 3,
                                 "lower-tiles,blocking,zcurve-order,kv-ring{context=32,chunk_tokens=4,reserve_bytes=0},"
                                 "codegen,srpg")
    rec = program.stream.records
    cap = np.flatnonzero((rec["op"] == Opcode.ACT) & (rec["arg"] == ActFn.LOGIT_CAP) & (rec["ct"] == CONTROLLER))
    argmax = np.flatnonzero((rec["op"] == Opcode.ACT) & (rec["arg"] == ActFn.ARGMAX))
    assert len(cap) == len(argmax) and (argmax - cap == 1).all()  # right before each pick
    result = replay_functional(program, replay_target, path, prompt=PROMPT, generate=3)
    want = ort_greedy(path, PROMPT, 3)
    assert np.abs(result.logits - want).max() / np.abs(want).max() < 1e-5  # as tests/functional/test_exact.py
    assert result.tokens == [int(t) for t in want.argmax(axis=1)]
    if steps is CAPPED:
        assert np.abs(want).max() < 3.0  # the cap bounds them: the replay did not pass raw logits through


def test_a_model_without_a_tail_has_no_logit_cap_record(replay_target):  # noqa: F811
    program = compile_for_replay(load_model(fixture(BASE)), replay_target, len(PROMPT), 2,
                                 "lower-tiles,blocking,zcurve-order,kv-ring{context=32,chunk_tokens=4,reserve_bytes=0},codegen")
    assert not ((program.stream.records["op"] == Opcode.ACT) & (program.stream.records["arg"] == ActFn.LOGIT_CAP)).any()


@pytest.mark.parametrize("steps, message", [
    ([("Div", 3.0), ("Tanh", None)], "Tanh after the LM head: not followed by the multiplication by its cap"),
    ([("Mul", -2.0)], "the logits multiplied by -2, not a positive scale"),
    ([("Div", 3.0), ("Tanh", None), ("Mul", 3.0), ("Mul", 2.0)], "a factor after the logits' soft-cap"),
    ([("Add", 1.0)], "unsupported constant added at node tail_add_0 (Add) after the LM head"),
])
def test_anything_else_after_the_lm_head_is_refused_naming_it(tmp_path, steps, message):
    path = _tail(tmp_path, steps)
    with pytest.raises(InputError) as err:
        load_model(path)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_cap_is_charged_on_the_nmc_logits_unit(tmp_path, replay_target):  # noqa: F811
    from primal_compiler.compiled import program_file
    from primal_compiler.executor.replay import replay

    program = compile_for_replay(load_model(_tail(tmp_path, CAPPED)), replay_target, len(PROMPT), 2,
                                 "lower-tiles,blocking,zcurve-order,kv-ring{context=32,chunk_tokens=4,reserve_bytes=0},codegen")
    meta, arrays = program_file(program, replay_target)
    rp = replay(meta, arrays, program.stream, replay_target)
    rec = program.stream.records
    cap = np.flatnonzero((rec["op"] == Opcode.ACT) & (rec["arg"] == ActFn.LOGIT_CAP))
    argmax = cap + 1
    ops = program.model.vocab_size * replay_target.act.logit_cap_ops_per_element
    assert (rp.busy[cap] == -(-ops // replay_target.router.dmac_macs_per_cycle)).all()
    assert (rp.unit[cap] == rp.unit[argmax]).all() and (rp.start[argmax] >= rp.finish[cap]).all()
    issue = replay_target.system.nmc_issue_energy_pj  # the NMC fetches and issues the record too
    assert rp.energy_pj["controller"][cap] == pytest.approx(ops * replay_target.router.dmac_energy_pj_per_op + issue)
