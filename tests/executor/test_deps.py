"""Dependencies on element ranges: RAW to every slice, WAR, WAW on covering writes, and unwritten reads.

Each case is a hand-built stream whose edges follow from the rules of
``executor/deps.py`` by inspection; the oracle test (test_dep_oracle.py)
checks completeness against the functional replay on compiled models.
"""

from __future__ import annotations

import numpy as np
import pytest

from primal_compiler.errors import InputError
from primal_compiler.executor import deps
from primal_compiler.isa.opcodes import CONTROLLER, ActFn, BufKind, Flag, HiddenBuf, Opcode, ReduceOp, buf
from primal_compiler.isa.stream import StreamBuilder

X, ROOT0, ROOT1, IN = buf(BufKind.HIDDEN, HiddenBuf.X), buf(BufKind.ROOT, 0), buf(BufKind.ROOT, 1), buf(BufKind.IN, 0)


def _edges(stream) -> set[tuple[int, int]]:
    ptr, pred = deps.predecessors(stream)
    rec = np.repeat(np.arange(len(stream.records)), np.diff(ptr))
    return set(zip(rec.tolist(), pred.tolist()))


def _slices() -> StreamBuilder:
    """Records 0, 1: roots; 2, 3: their slices of X at PE 5 (offsets 0 and 256); 4: an activation reading all
    of X."""
    b = StreamBuilder()
    b.records(1, op=Opcode.ACT, ct=0, pe=1, dst_buf=ROOT0, arg=ActFn.EMBED, count=1)
    b.records(1, op=Opcode.ACT, ct=0, pe=2, dst_buf=ROOT1, arg=ActFn.EMBED, count=1)
    b.records(1, op=Opcode.UNICAST, ct=0, pe=1, dst_ct=0, dst_pe=5, src_buf=ROOT0, dst_buf=X, arg=0, nbytes=64)
    b.records(1, op=Opcode.UNICAST, ct=0, pe=2, dst_ct=0, dst_pe=5, src_buf=ROOT1, dst_buf=X, arg=256 // 8, nbytes=64)
    b.records(1, op=Opcode.ACT, ct=0, pe=5, src_buf=X, dst_buf=buf(BufKind.HIDDEN, HiddenBuf.X_NORM),
              arg=ActFn.SILU, count=512)
    return b


def test_a_reader_waits_for_every_slice_and_sibling_slices_are_unordered():
    e = _edges(_slices().build())
    assert {(4, 2), (4, 3)} <= e  # RAW on both slices, not only the last writer
    assert (3, 2) not in e  # disjoint slices of one buffer run in parallel
    assert {(2, 0), (3, 1)} <= e


def test_a_write_waits_for_the_reads_of_what_it_replaces():
    b = _slices()
    b.records(1, op=Opcode.UNICAST, ct=0, pe=1, dst_ct=0, dst_pe=5, src_buf=ROOT0, dst_buf=X, arg=0, nbytes=64)
    e = _edges(b.build())
    assert (5, 4) in e  # WAR: the next step's slice may not overwrite X before the activation read it
    assert {(5, 2), (5, 3)} <= e  # WAW: it replaces both earlier slices (its range covers them)


def test_read_modify_write_records_read_their_destination():
    b = StreamBuilder()
    psum = buf(BufKind.PSUM, 0)
    b.records(2, op=Opcode.ACT, ct=0, pe=[1, 2], dst_buf=psum, arg=ActFn.EMBED, count=1)
    g = b.groups([1], np.zeros(1), np.array([1]))
    b.records(1, op=Opcode.REDUCE, ct=0, pe=1, dst_ct=0, dst_pe=3, src_buf=psum, dst_buf=ROOT0, group=g[0],
              arg=int(ReduceOp.SUM), nbytes=8)
    g = b.groups([1], np.zeros(1), np.array([2]))
    b.records(1, op=Opcode.REDUCE, ct=0, pe=2, dst_ct=0, dst_pe=3, src_buf=psum, dst_buf=ROOT0, group=g[0],
              arg=int(ReduceOp.SUM), nbytes=8, flags=Flag.ACCUMULATE)
    b.records(1, op=Opcode.ACT, ct=0, pe=3, src_buf=ROOT1, dst_buf=ROOT0, arg=ActFn.RESIDUAL_ADD, count=8)
    stream = b.build()
    with pytest.raises(InputError, match=r"record 4 \(ACT\) reads ROOT\.0x1 at CT 0 PE 3, which no earlier record wrote"):
        deps.predecessors(stream)
    rec = stream.records.copy()
    rec["src_buf"][4] = ROOT0
    e = _edges(type(stream)(rec, stream.group_ptr, stream.group_ct, stream.group_pe))
    assert {(2, 0), (3, 1), (3, 2), (4, 3)} <= e  # ACCUMULATE reads what the first REDUCE wrote


def test_kv_chunks_and_the_mask_register_start_defined():
    b = StreamBuilder()
    kv = buf(BufKind.KV_K, 0)
    b.records(1, op=Opcode.DMAC, ct=0, pe=4, src_buf=IN, dst_buf=buf(BufKind.SCORE, 0), arg=0, count=4)
    with pytest.raises(InputError, match=r"record 0 \(DMAC\) reads IN\.0x0"):
        deps.predecessors(b.build())
    b = StreamBuilder()
    b.records(1, op=Opcode.ACT, ct=0, pe=4, dst_buf=IN, arg=ActFn.EMBED, count=1)
    b.records(1, op=Opcode.DMAC, ct=0, pe=4, src_buf=IN, dst_buf=buf(BufKind.SCORE, 0), arg=0, count=4)
    b.records(1, op=Opcode.KV_APPEND, ct=0, pe=4, dst_ct=0, dst_pe=4, src_buf=IN, dst_buf=kv, arg=0, count=1, nbytes=2)
    b.records(1, op=Opcode.DMAC, ct=0, pe=4, src_buf=IN, dst_buf=buf(BufKind.SCORE, 0), arg=0, count=4)
    e = _edges(b.build())
    assert (2, 1) in e and (3, 2) in e  # WAR on the chunk, then RAW on the token slot


def test_the_controller_token_orders_decode_steps():
    b = StreamBuilder()
    logits = buf(BufKind.HIDDEN, HiddenBuf.LOGITS)
    b.records(1, op=Opcode.ACT, ct=CONTROLLER, pe=0, dst_buf=logits, arg=ActFn.EMBED, count=1, flags=Flag.PREFILL)
    for seq in (0, 1):
        b.records(1, op=Opcode.ACT, ct=CONTROLLER, pe=0, src_buf=logits, dst_buf=buf(BufKind.TOKEN, seq),
                  arg=ActFn.ARGMAX, count=1)
    for seq in (0, 1):
        b.records(1, op=Opcode.ACT, ct=CONTROLLER, pe=0, src_buf=buf(BufKind.TOKEN, seq), dst_buf=X,
                  arg=ActFn.EMBED, count=1)
    e = _edges(b.build())
    assert (3, 1) in e and (4, 2) in e  # a decode EMBED reads the token its sequence's ARGMAX picked
    assert (3, 2) not in e  # and not the other sequence's: sequences pipeline


def test_a_stream_without_accesses_has_no_edges():
    """No footprint rows at all (an empty stream; a stream of controller SYNCs only): no edges, nothing read from
    the empty columns (the sweep's location runs have the rows' length, not one more)."""
    assert _edges(StreamBuilder().build()) == set()
    b = StreamBuilder()
    b.records(2, op=Opcode.SYNC, ct=CONTROLLER, pe=0)
    ptr, pred = deps.predecessors(b.build())
    assert ptr.tolist() == [0, 0, 0] and pred.tolist() == []
