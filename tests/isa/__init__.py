"""ISA tests; :func:`small_program` is the legal program they share."""

from __future__ import annotations

import numpy as np

from primal_compiler.isa.opcodes import (
    ALL_PES, CONTROLLER, ActFn, BufKind, DmacOp, Flag, HiddenBuf, Opcode, ReduceOp, buf,
)
from primal_compiler.isa.stream import Stream, StreamBuilder

META = {"format_version": 1, "model": "tiny-llama", "num_cts": 3, "mesh_rows": 4, "mesh_cols": 4,
        "num_layers": 2, "target": "primal-7nm", "target_hash": "ab" * 32, "seed": 0}


def small_program() -> tuple[dict, dict[str, np.ndarray], Stream]:
    """(meta, arrays, stream): 35 records of every opcode, 3 groups (one with the controller), 2 sections."""
    b = StreamBuilder()
    g = b.groups([4, 3, 1], [0, 0, 0, 0, 1, 1, 1, CONTROLLER], [1, 2, 3, 4, 5, 6, 7, ALL_PES])
    x, inp = buf(BufKind.HIDDEN, HiddenBuf.X), buf(BufKind.IN, 2)
    b.begin("prefill")
    b.records(2, op=Opcode.PG_ON, ct=[0, 1], pe=ALL_PES, flags=Flag.PREFILL)
    b.records(1, op=Opcode.ACT, ct=CONTROLLER, pe=ALL_PES, arg=ActFn.EMBED, count=8, dst_buf=x, flags=Flag.PREFILL)
    b.records(1, op=Opcode.UNICAST, ct=CONTROLLER, pe=ALL_PES, dst_ct=0, dst_pe=0, src_buf=x, dst_buf=inp,
              nbytes=512, layer=0, flags=Flag.PREFILL | Flag.D2D)
    b.records(1, op=Opcode.CONFIG, ct=CONTROLLER, pe=ALL_PES, dst_ct=1, dst_pe=5, dst_buf=buf(BufKind.SRAM, 3),
              nbytes=2048, arg=3, flags=Flag.PREFILL)
    b.records(3, op=Opcode.BCAST, ct=0, pe=[0, 1, 2], group=g[0], src_buf=inp, dst_buf=inp, nbytes=256, layer=0,
              flags=Flag.PREFILL)
    b.records(4, op=Opcode.SMAC_RRAM, ct=0, pe=[1, 2, 3, 4], src_buf=inp, dst_buf=buf(BufKind.PSUM, 2), count=8,
              layer=0, flags=Flag.PREFILL)
    b.records(2, op=Opcode.SMAC_SRAM, ct=1, pe=[5, 6], arg=[0, 1], count=8, layer=1,
              flags=[Flag.PREFILL, Flag.PREFILL | Flag.SKIPPED])
    b.records(2, op=Opcode.REDUCE, ct=1, pe=7, group=g[1], dst_ct=1, dst_pe=7,
              arg=[ReduceOp.SUM, ReduceOp.SOFTMAX_MERGE], src_buf=buf(BufKind.PSUM, 2), dst_buf=buf(BufKind.ROOT, 0x105), nbytes=64, layer=1, flags=Flag.PREFILL)
    b.begin("decode")
    b.records(3, op=Opcode.ACT, ct=[0, 1, 2], pe=[0, 5, 15], arg=[int(ActFn.RMSNORM) | 4096 << 8, ActFn.SWIGLU, ActFn.ARGMAX],
              count=4096, layer=[0, 1, 2], src_buf=x, dst_buf=buf(BufKind.HIDDEN, HiddenBuf.X_NORM))
    b.records(2, op=Opcode.DMAC, ct=2, pe=[8, 9], arg=[DmacOp.QK, DmacOp.PV], count=1 << 20, layer=1,
              src_buf=buf(BufKind.QVEC, 7), dst_buf=buf(BufKind.SCORE, 7))
    b.records(2, op=Opcode.KV_APPEND, ct=2, pe=10, dst_ct=2, dst_pe=[11, 12], arg=[0, 4095], count=1, nbytes=256,
              layer=1, src_buf=buf(BufKind.ROOT, 1), dst_buf=[buf(BufKind.KV_K, 0), buf(BufKind.KV_V, 4095)])
    b.records(1, op=Opcode.REDUCE, ct=CONTROLLER, pe=ALL_PES, group=g[2], arg=ReduceOp.SUM, layer=2,
              dst_ct=CONTROLLER, dst_buf=buf(BufKind.HIDDEN, HiddenBuf.LOGITS))
    b.records(3, op=Opcode.MASK, ct=1, pe=[5, 6, 7], arg=[0, 0b1010, 0xFFFFFFFF])
    b.records(1, op=Opcode.SYNC, ct=CONTROLLER, pe=ALL_PES, arg=1)
    b.records(4, op=Opcode.UNICAST, ct=[0, 1, 2, 0], pe=[0, 15, 3, 9], dst_ct=[1, 2, 0, 0], dst_pe=[0, 1, 2, 3],
              nbytes=[1, 2, 3, 0xFFFFFFFF], flags=Flag.D2D)
    b.records(2, op=Opcode.PG_OFF, ct=[0, 1], pe=ALL_PES)
    b.records(1, op=Opcode.SYNC, ct=CONTROLLER, pe=ALL_PES, arg=2)
    arrays = {
        "kv_map": np.arange(24, dtype=np.int32).reshape(2, 3, 4),
        "placement.ct": np.array([0, 1, 2, 2], dtype=np.uint16),
        "power_w": np.array([0.5, 1.25, np.inf]),
        "gated": np.array(True),
        "empty": np.zeros((0, 3), dtype=np.int64),
    }
    return dict(META), arrays, b.build()
