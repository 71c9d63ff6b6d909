"""A wrong or missing instruction gives a wrong result: the replay really executes the stream.

Each case edits one record of a correct program (sharpened weights, so
attention decides the logits) and expects either a replay error (a record
reads a buffer no record wrote, uses a gated CT, writes a KV slot outside
the step) or logits that move by more than 1e-4 of their scale, the band
a correct replay stays in.
"""

from __future__ import annotations

import numpy as np
import pytest

from primal_compiler.errors import InputError
from primal_compiler.functional import replay_functional
from primal_compiler.ir.model import Role
from primal_compiler.ir.tiles import ROLE_INDEX, Macro
from primal_compiler.isa.opcodes import CONTROLLER, ActFn, BufKind, DmacOp, Flag, HiddenBuf, Opcode, ReduceOp, buf, hidden
from primal_compiler.isa.stream import Section, Stream
from tests.functional.conftest import compiled

PROMPT = [3, 1, 4, 1, 5]
MOVED = 1e-4  # outside the band exact replays must stay in (they stay within 4e-7)


@pytest.fixture(scope="module")
def programs(replay_target, sharp):
    out = {}
    for name in ("opt_lora_qv_r4_optimum", "llama_dynamo"):  # biases and LoRA on q, v; RoPE
        program = compiled(name, replay_target, len(PROMPT), 3)
        logits = replay_functional(program, replay_target, sharp(name), prompt=PROMPT, generate=3).logits
        out[name] = (program, logits)
    return out


def edited(program, index: int, drop: bool = False, **fields):
    """``program`` with record ``index`` changed, or removed (sections shifted)."""
    s = program.stream
    rec = s.records.copy()
    for k, v in fields.items():
        rec[k][index] = v
    sections = s.sections
    if drop:
        rec = np.delete(rec, index)
        sections = tuple(Section(x.name, x.start - (x.start > index), x.stop - (x.stop > index)) for x in sections)
    return program.evolve(stream=Stream(rec, s.group_ptr, s.group_ct, s.group_pe, sections))


def other_pe(program, r) -> int:
    """A PE of the same CT holding another crossbar."""
    t = program.tiles
    return int(t.pe[(t.macro == Macro.RRAM) & (t.ct == r["ct"]) & (t.pe != r["pe"])][0])


PSUM_BASE, PSUM_LORA = buf(BufKind.PSUM, 0), buf(BufKind.PSUM, 1)
OPT, LLAMA = "opt_lora_qv_r4_optimum", "llama_dynamo"
CASES = {  # name: (program, section, which record, edit, expected outcome)
    "SMAC_RRAM on the wrong PE": (OPT, "prefill:0", lambda r: r["op"] == Opcode.SMAC_RRAM,
                                  lambda p, r: {"pe": other_pe(p, r)}, "error"),
    "dropped column REDUCE": (OPT, "prefill:0", lambda r: r["op"] == Opcode.REDUCE and r["src_buf"] == PSUM_BASE,
                              lambda p, r: {"drop": True}, "error"),
    "dropped LoRA B of v": (OPT, "decode:0", lambda r: r["op"] == Opcode.REDUCE and r["flags"] & Flag.ACCUMULATE
                            and r["src_buf"] == PSUM_LORA and (r["dst_buf"] & 0xFFF) >> 8 == ROLE_INDEX[Role.V],
                            lambda p, r: {"drop": True}, "diverge"),
    "embeddings sent from the wrong offset": (OPT, "prefill:0", lambda r: r["op"] == Opcode.UNICAST
                                              and r["ct"] == CONTROLLER and r["arg"] >> 16,
                                              lambda p, r: {"arg": 0}, "diverge"),
    "a shard's statistics written as the total": (OPT, "decode:0", lambda r: r["op"] == Opcode.ACT
                                                  and r["arg"] & 0xFF == ActFn.NORM_STATS,
                                                  lambda p, r: {"dst_buf": hidden(HiddenBuf.TOTAL)}, "error"),
    "dropped bias": (OPT, "decode:0", lambda r: r["op"] == Opcode.ACT and r["arg"] == ActFn.BIAS
                     and (r["dst_buf"] & 0xFFF) >> 8 == ROLE_INDEX[Role.FC1], lambda p, r: {"drop": True}, "diverge"),
    "merge into the wrong heads": (OPT, "prefill:0", lambda r: r["op"] == Opcode.REDUCE
                                   and r["arg"] & 0xF == ReduceOp.SOFTMAX_MERGE and r["arg"] >> 18,
                                   lambda p, r: {"arg": int(r["arg"]) & 0x3FFFF}, "error"),
    "key appended to the wrong token slot": (OPT, "decode:0", lambda r: r["op"] == Opcode.KV_APPEND,
                                             lambda p, r: {"arg": int(r["arg"]) ^ 1}, "error"),
    "dropped wake-up": (OPT, "prefill:0", lambda r: r["op"] == Opcode.PG_ON, lambda p, r: {"drop": True}, "error"),
    "dropped RoPE": (LLAMA, "decode:0", lambda r: r["op"] == Opcode.ACT and r["arg"] == ActFn.ROPE,
                     lambda p, r: {"drop": True}, "diverge"),
    "scores from the wrong K chunk": (LLAMA, "prefill:0", lambda r: r["op"] == Opcode.DMAC
                                      and r["arg"] & 0xFF == DmacOp.QK and r["arg"] >> 8 == 0,
                                      lambda p, r: {"arg": int(DmacOp.QK) | 1 << 8}, "error"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_corrupted_instruction_changes_the_outcome(case, programs, replay_target, sharp):
    name, section, which, edit, expected = CASES[case]
    program, logits = programs[name]
    s = next(x for x in program.stream.sections if x.name == section)
    rec = program.stream.records
    i = next(k for k in range(s.start, s.stop) if which(rec[k]))
    bad = edited(program, i, **edit(program, rec[i]))
    try:
        got = replay_functional(bad, replay_target, sharp(name), prompt=PROMPT, generate=3).logits
    except InputError as exc:
        assert expected == "error", f"expected diverging logits, got an error: {exc}"
        assert "record" in str(exc)
        return
    moved = float(np.abs(got - logits).max() / np.abs(logits).max())
    assert expected == "diverge" and moved > MOVED, f"logits moved by {moved:.1e}"
