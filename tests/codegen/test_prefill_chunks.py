"""codegen{prefill_chunk}: the prompt streams through the layer pipeline in chunks, computing the same thing."""

from __future__ import annotations

import numpy as np
import pytest

from primal_compiler.compiled import program_file
from primal_compiler.executor.metrics import metrics
from primal_compiler.executor.replay import replay
from primal_compiler.frontend import load_model
from primal_compiler.functional import compile_for_replay, replay_functional
from primal_compiler.isa.opcodes import CONTROLLER, ActFn, Opcode, step_ends
from primal_compiler.target import load_target

FILE = "tests/fixtures/onnx/llama_lora_qv_r4_torchscript.onnx"
PROMPT = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]


def _compile(chunk: int):
    pipeline = (f"lower-tiles,blocking,zcurve-order,kv-ring{{context=16,chunk_tokens=4}},"
                f"codegen{{prefill_chunk={chunk}}},srpg")
    return compile_for_replay(load_model(FILE), load_target("primal-7nm"), len(PROMPT), 3, pipeline)


@pytest.fixture(scope="module")
def programs():
    return {chunk: _compile(chunk) for chunk in (0, 4)}


def test_chunks_compute_exactly_what_one_pass_computes(programs):
    t = load_target("primal-7nm")
    whole, chunked = (replay_functional(programs[c], t, FILE, prompt=PROMPT, generate=3) for c in (0, 4))
    assert whole.tokens == chunked.tokens
    assert np.array_equal(whole.logits, chunked.logits)


def test_each_chunk_is_a_pass_and_only_the_last_runs_the_head(programs):
    p, model = programs[4], programs[4].model
    pre = p.stream.section("prefill:0")
    embed = pre[(pre["op"] == Opcode.ACT) & (pre["arg"] == ActFn.EMBED) & (pre["ct"] == CONTROLLER)]
    assert (embed["count"] // model.hidden_size).tolist() == [4, 4, 2]
    assert int(step_ends(pre).sum()) == 1
    head = pre[(pre["op"] == Opcode.SMAC_RRAM) & (pre["layer"] == model.num_layers)]
    assert len(head) and (head["count"] == 1).all()  # the LM head once, on the newest token
    whole = programs[0].stream.section("prefill:0")
    assert len(head) == int(((whole["op"] == Opcode.SMAC_RRAM) & (whole["layer"] == model.num_layers)).sum())


def test_chunks_overlap_in_the_layer_pipeline(programs):
    """Chunk t + 1 enters layer 0 while chunk t is in layer 1: the first token comes sooner than in one pass."""
    t = load_target("primal-7nm")
    ttft = {}
    for chunk, p in programs.items():
        meta, arrays = program_file(p, t)
        ttft[chunk] = metrics(replay(meta, arrays, p.stream, t))["ttft_s"]
    assert ttft[4] < ttft[0]
