"""The reprogramming timeline of a mixed-adapter batch: drawn when a request rewrites its adapters, absent when
they stay resident, and each LoRA product attributed to the adapter its slot last received."""

from __future__ import annotations

import numpy as np

from primal_compiler.isa.opcodes import RECORD, Opcode
from primal_compiler.viz import adapters
from tests.viz.conftest import _compile

MIXED = "lower-tiles,blocking,zcurve-order,kv-ring{context=64,batch=4},codegen{requests=0+1+2+3,prompt=8,steps=3},srpg"


def test_a_product_reads_the_adapter_its_slot_last_received():
    r = np.zeros(7, RECORD)
    r["op"] = [Opcode.CONFIG, Opcode.SMAC_SRAM, Opcode.CONFIG, Opcode.SMAC_SRAM, Opcode.SMAC_SRAM, Opcode.CONFIG,
               Opcode.SMAC_SRAM]
    r["layer"] = [0, 0, 0, 0, 1, 1, 1]
    r["arg"] = [5 << 16, 0, 7 << 16, 0, 0, 9 << 16 | 1, 1]  # adapter << 16 | slot for a CONFIG, the slot otherwise
    smac = np.flatnonzero(r["op"] == Opcode.SMAC_SRAM)
    cfg = np.flatnonzero(r["op"] == Opcode.CONFIG)
    assert adapters.adapter_of_products(r, smac, cfg).tolist() == [5, 7, -1, 9]


def test_drawn_for_a_mixed_batch_and_not_for_resident_adapters(tmp_path, target, vdata):
    from primal_compiler.viz import data

    mixed = data.load(_compile(tmp_path / "mixed", MIXED, target))
    assert adapters.rewrites(mixed) and not adapters.rewrites(vdata)
    assert adapters.render(mixed, tmp_path, ("png",)) == ["adapters.png"]
    assert (tmp_path / "adapters.png").stat().st_size > 5000
    assert adapters.render(vdata, tmp_path / "none", ("png",)) == []
    lo, hi, w0, w1 = adapters.window(mixed)
    r = mixed.stream.records[lo:hi]
    assert int((r["op"] == Opcode.ACT).sum()) > 0 and w1 > w0
    assert len(np.unique(r["arg"][r["op"] == Opcode.CONFIG] >> 16)) == 4  # every adapter rewritten in the step


def test_the_window_is_one_step_with_or_without_a_pass_per_sequence(tmp_path, target):
    """Batch 2 rewriting its weights at every pass: pipelined, the first step is two passes (two ARGMAXes);
    one pass of both sequences, it is one."""
    from primal_compiler.isa.opcodes import ActFn
    from primal_compiler.viz import data

    for pipeline, argmaxes in (("true", 2), ("false", 1)):
        spec = ("lower-tiles,blocking,zcurve-order,kv-ring{context=64,batch=2},codegen{prompt=8,steps=3,"
                f"pipeline={pipeline},lora_residency=per-token}},srpg{{gating=false}}")
        d = data.load(_compile(tmp_path / pipeline, spec, target))
        lo, hi, _, _ = adapters.window(d)
        r = d.stream.records[lo:hi]
        assert int(((r["op"] == Opcode.ACT) & (r["arg"] == ActFn.ARGMAX)).sum()) == argmaxes
