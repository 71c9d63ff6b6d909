"""Hub shards and the distributed norm (docs/codegen.md, Hub shards): no PE holds more of a hidden vector than
one crossbar input block, and a norm gathers every shard's statistics before any shard normalises."""

from __future__ import annotations

import numpy as np
import pytest

from primal_compiler.api import compile_model
from primal_compiler.errors import InputError
from primal_compiler.frontend import load_model
from primal_compiler.isa.opcodes import CONTROLLER, ActFn, BufKind, HiddenBuf, Opcode, ReduceOp, hidden
from primal_compiler.target import with_overrides

ROWS = 64  # tiny-llama's 256-element hidden vector in four shards
PIPE = "lower-tiles,blocking,zcurve-order,kv-ring{context=64},codegen"


@pytest.fixture(scope="module")
def sharded(small_target):
    target = with_overrides(small_target, {"rram.rows": ROWS, "rram.cols": ROWS, "sram.rows": ROWS})
    return compile_model(load_model("tiny-llama", "q,v:8"), target, PIPE)


def _decode(program) -> np.ndarray:
    s = next(x for x in program.stream.sections if x.name == "decode:0")
    return program.stream.records[s.start:s.stop]


def test_no_pe_holds_more_than_one_shard_of_a_hidden_vector(sharded):
    r = _decode(sharded)
    on_pe = (r["ct"] != CONTROLLER) & (r["op"] == Opcode.ACT)
    hid = on_pe & ((r["src_buf"] >> 12) == BufKind.HIDDEN) & np.isin(r["src_buf"] & 0xF, (HiddenBuf.X, HiddenBuf.MID))
    assert hid.any() and (r["count"][hid] <= ROWS).all()  # one decode vector: count is the elements it covers
    moves = (r["op"] == Opcode.UNICAST) & ((r["dst_buf"] >> 12) == BufKind.HIDDEN) & (r["dst_ct"] != CONTROLLER)
    assert (r["nbytes"][moves] <= ROWS * sharded.model.precision.activation_bits // 8).all()


def test_each_norm_sums_every_shards_statistics_before_any_shard_normalises(sharded):
    r = _decode(sharded)
    stream, layer0 = sharded.stream, r["layer"] == 0
    stats = np.flatnonzero(layer0 & (r["op"] == Opcode.ACT) & ((r["arg"] & 0xFF) == ActFn.RMS_STATS))
    norms = np.flatnonzero(layer0 & (r["op"] == Opcode.ACT) & ((r["arg"] & 0xFF) == ActFn.RMSNORM))
    assert len(stats) == len(norms) == 2 * 4  # two norms a layer, four shards each
    assert sorted(((r["src_buf"][norms] & 0xFFF) >> 4).tolist()) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert ((r["arg"][norms] >> 8) == ROWS).all()
    total = hidden(HiddenBuf.TOTAL)
    sums = np.flatnonzero(layer0 & (r["op"] == Opcode.REDUCE) & (r["dst_buf"] == total))
    back = np.flatnonzero(layer0 & (r["op"] == Opcode.BCAST) & (r["dst_buf"] == total))
    assert ((r["arg"][sums] & 0xF) == ReduceOp.SUM).all() and len(back) >= 2
    for first, last in ((0, 4), (4, 8)):  # the in norm, then the mid norm
        mine = norms[first:last]
        assert stats[first:last].max() < sums[(sums > stats[first:last].max())].min() < mine.min()
        fed = back[(back > stats[last - 1]) & (back < mine.min())]
        members = set()
        for b in fed:
            g = int(r["group"][b])
            lo, hi = stream.group_ptr[g], stream.group_ptr[g + 1]
            members |= set(zip(stream.group_ct[lo:hi].tolist(), stream.group_pe[lo:hi].tolist()))
        at = set(zip((r["ct"][mine]).tolist(), r["pe"][mine].tolist()))
        assert at <= members  # every PE that normalises received the total


def test_a_hidden_vector_cut_into_more_shards_than_a_tag_names_is_refused(small_target, monkeypatch):
    """A HIDDEN tag names its shard in 8 bits; with that field narrowed to hold 3, four shards are refused."""
    from primal_compiler.transforms import codegen

    monkeypatch.setattr(codegen, "HIDDEN_SHARDS", 3)
    target = with_overrides(small_target, {"rram.rows": ROWS, "rram.cols": ROWS, "sram.rows": ROWS})
    with pytest.raises(InputError, match=r"^pass codegen: model tiny-llama: hidden size 256 needs 4 hub shards of "
                                         r"rram.rows 64, more than the 3 a buffer tag names$"):
        compile_model(load_model("tiny-llama"), target, PIPE)
