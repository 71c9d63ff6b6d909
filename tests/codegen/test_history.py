"""codegen{history}: a request continuing a saved conversation prefills only its own prompt, over the saved KV."""

from __future__ import annotations

import numpy as np
import pytest

from primal_compiler.compiled import program_file
from primal_compiler.errors import InputError
from primal_compiler.executor.metrics import metrics
from primal_compiler.executor.replay import replay
from primal_compiler.frontend import load_model
from primal_compiler.functional import replay_functional
from primal_compiler.ir.program import Program
from primal_compiler.isa.legality import stream_problem
from primal_compiler.isa.opcodes import ARG_ENUM_MASK, CONTROLLER, ActFn, DmacOp, Opcode
from primal_compiler.isa.text import asm, disasm
from primal_compiler.passmgr import PassManager, parse_pipeline
from primal_compiler.target import load_target

FILE = "tests/fixtures/onnx/llama_lora_qv_r4_torchscript.onnx"
HEAD = "lower-tiles,blocking,zcurve-order,kv-ring{context=32,chunk_tokens=4}"


def _compile(prompt: int, history: int = 0):
    pipeline = f"{HEAD},codegen{{prompt={prompt},history={history},steps=2}},srpg"
    return PassManager(parse_pipeline(pipeline)).run(Program(model=load_model(FILE)), load_target("primal-7nm"))


@pytest.fixture(scope="module")
def programs():
    """The whole conversation of 12 tokens prefilled at once, its first 8 alone, and its last 4 resumed."""
    return {"whole": _compile(12), "first": _compile(8), "resumed": _compile(4, history=8)}


def _prefill(p) -> np.ndarray:
    return p.stream.section("prefill:0")


def _macs(rec: np.ndarray, op: DmacOp) -> int:
    hit = (rec["op"] == Opcode.DMAC) & ((rec["arg"] & 0xFF) == op)
    return int(rec["count"][hit].astype(np.int64).sum())


def test_resumed_prefill_does_the_whole_prefills_attention_less_the_saved_prefix(programs):
    """Causal attention of queries 8..11 = that of queries 0..11 less that of queries 0..7: the saved prefix's
    attention is not recomputed, and the new queries see every saved key."""
    whole, first, resumed = (_prefill(programs[k]) for k in ("whole", "first", "resumed"))
    for op in (DmacOp.QK, DmacOp.PV):
        assert _macs(resumed, op) == _macs(whole, op) - _macs(first, op) > 0


def test_resumed_prefill_appends_and_embeds_only_its_own_tokens(programs):
    """The resumed prefill embeds its 4 tokens and appends their keys and values; the whole one all 12."""
    model, appended = programs["whole"].model, {}
    for key, tokens in (("whole", 12), ("resumed", 4)):
        pre = _prefill(programs[key])
        embed = pre[(pre["op"] == Opcode.ACT) & (pre["ct"] == CONTROLLER)
                    & ((pre["arg"] & ARG_ENUM_MASK[Opcode.ACT]) == ActFn.EMBED)]
        assert int(embed["count"].sum()) == tokens * model.hidden_size
        appended[key] = int(pre["count"][pre["op"] == Opcode.KV_APPEND].astype(np.int64).sum())
    assert appended["whole"] == 3 * appended["resumed"] > 0


def test_the_embed_names_where_the_prompt_starts(programs):
    pre = _prefill(programs["resumed"])
    embed = pre[(pre["op"] == Opcode.ACT) & (pre["ct"] == CONTROLLER) & ((pre["arg"] & 0xFF) == ActFn.EMBED)]
    assert (embed["arg"] >> 8).tolist() == [8]
    whole = _prefill(programs["whole"])
    embeds = (whole["op"] == Opcode.ACT) & ((whole["arg"] & 0xFF) == ActFn.EMBED)
    assert embeds.sum() == 1 and (whole["arg"][embeds] >> 8 == 0).all()


def test_resumed_decode_continues_after_the_prompt(programs):
    """The decode steps sit at positions 12 and 13 in both programs: the same decode records."""
    a, b = (programs[k].stream.section("decode:0") for k in ("whole", "resumed"))
    assert np.array_equal(a, b)


def test_resuming_is_faster_than_recomputing_the_prefix(programs):
    t = load_target("primal-7nm")
    ttft = {}
    for key in ("whole", "resumed"):
        p = programs[key]
        meta, arrays = program_file(p, t)
        ttft[key] = metrics(replay(meta, arrays, p.stream, t))["ttft_s"]
    assert ttft["resumed"] < ttft["whole"]


def test_text_form_and_legality_keep_the_position(programs):
    p = programs["resumed"]
    meta, arrays = program_file(p, load_target("primal-7nm"))
    assert stream_problem(p.stream, meta) is None
    text = disasm(meta, arrays, p.stream)
    assert "arg=EMBED+0x800" in text
    assert np.array_equal(asm(text)[2].records, p.stream.records)


def test_a_position_on_any_other_activation_is_illegal(programs):
    p = programs["whole"]
    rec = p.stream.records.copy()
    add = np.flatnonzero((rec["op"] == Opcode.ACT) & (rec["arg"] == ActFn.RESIDUAL_ADD))[0]
    rec["arg"][add] |= 8 << 8
    bad = type(p.stream)(rec, p.stream.group_ptr, p.stream.group_ct, p.stream.group_pe, p.stream.sections)
    problem = stream_problem(bad, program_file(p, load_target("primal-7nm"))[0])
    assert problem is not None and "only a prefill's EMBED" in problem.message


def test_a_position_on_a_decode_embed_is_illegal(programs):
    """Decode embeds its one token at the position the step's phase says; a position in its arg is refused."""
    p = programs["resumed"]
    rec = p.stream.records.copy()
    start = next(s.start for s in p.stream.sections if s.name == "decode:0")
    embed = start + np.flatnonzero((rec["op"][start:] == Opcode.ACT) & (rec["arg"][start:] == ActFn.EMBED))[0]
    rec["arg"][embed] |= 8 << 8
    bad = type(p.stream)(rec, p.stream.group_ptr, p.stream.group_ct, p.stream.group_pe, p.stream.sections)
    problem = stream_problem(bad, program_file(p, load_target("primal-7nm"))[0])
    assert problem is not None and "only a prefill's EMBED" in problem.message


def test_functional_replay_refuses_a_saved_conversation(programs):
    with pytest.raises(InputError, match=r"codegen\{history=8\}.*no record of this stream wrote"):
        replay_functional(programs["resumed"], load_target("primal-7nm"), FILE, prompt=[1, 2, 3, 4], generate=2)


def test_history_and_prompt_must_fit_the_context():
    with pytest.raises(InputError, match=r"history 24 \+ prompt 8 \+ 1 decoded token exceeds the KV context 32"):
        _compile(8, history=24)


@pytest.mark.parametrize("history", [31, 40])
def test_a_history_leaving_no_prompt_is_refused(history):
    with pytest.raises(InputError, match=rf"codegen.history: history {history} leaves no room for a prompt token"):
        _compile(0, history=history)


def test_the_default_prompt_fills_the_context_after_the_history():
    assert next(r for r in _compile(0, history=30).records if r.name == "codegen").details["prompt"] == 1
