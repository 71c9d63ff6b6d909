"""lower-tiles: tile counts, bit slicing, LoRA SRAM tiles and their hosts."""

from __future__ import annotations

import numpy as np
import pytest

from primal_compiler.api import compile_model
from primal_compiler.frontend import load_model
from primal_compiler.ir.tiles import ROLE_INDEX, Macro, Part
from primal_compiler.ir.model import Role


def test_llama2_13b_tile_counts(target):
    prog = compile_model(load_model("llama2-13b", "q,v:8"), target, "lower-tiles")
    t = prog.tiles
    per_layer = 4 * 20 * 20 + 3 * 20 * 54  # q,k,v,o 5120x5120; gate/up/down with 13824
    head = 20 * 125 * 4  # 5120x32000 at 16 bits in 4-bit cells: 4 slices
    assert int((t.macro == Macro.RRAM).sum()) == 40 * per_layer + head
    # LoRA r=8 on q and v: A is 20 tiles of 256x8, B 20 tiles of 256x8, per matrix
    assert int((t.macro == Macro.SRAM).sum()) == 40 * 2 * 40
    assert int(t.bytes[t.macro == Macro.SRAM].sum()) == 6_553_600  # 8-bit LoRA weights
    assert int(t.bytes[(t.macro == Macro.RRAM) & (t.layer < 40)].sum()) * 2 == 40 * (4 * 5120**2 + 3 * 5120 * 13824)


def test_bit_slicing_when_weights_exceed_cells(target):
    model = load_model("tiny-llama")
    four = compile_model(model, target, "lower-tiles").tiles
    eight = compile_model(model, target, "lower-tiles{base_bits=8}").tiles
    base4 = (four.part == Part.BASE) & (four.layer == 0)
    base8 = (eight.part == Part.BASE) & (eight.layer == 0)
    assert base8.sum() == 2 * base4.sum()
    assert set(np.unique(eight.slice[base8])) == {0, 1}
    assert eight.bytes[base8].sum() == 2 * four.bytes[base4].sum()


def test_sram_tiles_have_distinct_hosts_sharing_input_or_output(target):
    t = compile_model(load_model("llama2-7b", "q,k,v,o:16"), target, "lower-tiles").tiles
    sram = np.flatnonzero(t.macro == Macro.SRAM)
    assert np.unique(t.host[sram]).size == sram.size
    hosts = t.host[sram]
    assert (t.role[hosts] == t.role[sram]).all()
    a = t.part[sram] == Part.LORA_A
    assert (t.brow[hosts[a]] == t.brow[sram[a]]).all()  # A shares its input block
    assert (t.bcol[hosts[~a]] == t.brow[sram[~a]]).all()  # B sits in its output column


def test_identical_layers_are_replicated(target):
    t = compile_model(load_model("llama2-7b", "q,v:8"), target, "lower-tiles").tiles
    l0, l5 = t.layer == 0, t.layer == 5
    for col in ("role", "part", "brow", "bcol", "slice", "bytes"):
        assert np.array_equal(getattr(t, col)[l0], getattr(t, col)[l5])
    assert (t.role[t.layer == 32] == ROLE_INDEX[Role.LM_HEAD]).all()


def test_lora_beyond_the_layers_crossbars_gets_pes_of_its_own(target):
    """tiny-llama, r=16 on q,k,v,o: 16 LoRA tiles per layer but 13 RRAM tiles; 3 are their own host."""
    prog = compile_model(load_model("tiny-llama", "q,k,v,o:16"), target, "lower-tiles,blocking,zcurve-order",
                         verify=True)
    t = prog.tiles
    rows = np.arange(len(t))
    sram = t.macro == Macro.SRAM
    own = sram & (t.host == rows)
    for layer in (0, 1):
        mine = t.layer == layer
        assert (~sram & mine).sum() == 13 and (sram & mine).sum() == 16 and (own & mine).sum() == 3
    hosted = sram & ~own
    assert (t.macro[t.host[hosted]] == Macro.RRAM).all() and np.unique(t.host[sram]).size == sram.sum()
    owners = ~sram | own
    key = t.ct[owners].astype(np.int64) * 1024 + t.pe[owners]
    assert np.unique(key).size == owners.sum()  # one PE each
    assert (t.pe[own] >= 0).all() and (t.seq[own] >= 0).all()
    assert (t.ct[t.layer == 0] == 0).all()  # 16 PEs: the layer still fits its one CT


def test_too_many_pes_names_the_need():
    from primal_compiler.errors import InputError
    from primal_compiler.mapping.lower import Geometry, check_size

    geo = Geometry(256, 256, 4, 1, 64, 4, 8, 16)  # one-row LoRA tiles: r=128 is 16 per row of A or B
    # 32 layers x 4 matrices x (4096 + 4096) rows x 16 = 2**24 LoRA tiles (each layer's 3,088 RRAM tiles host
    # some of them), plus the LM head's 16 x 125 x 4 = 8,000 tiles
    with pytest.raises(InputError, match=r"needs 16,785,216 PEs \(one per RRAM tile, and per SRAM tile beyond"):
        check_size(load_model("llama2-7b", "q,k,v,o:128"), geo)


def test_partial_sums_are_as_wide_as_the_widest_dot_product_needs(target):
    """a + w + ceil(log2 n) bits, the widest over the projections, at most FP32: Llama-2-13B's FP16 LM head
    needs 37 (so 32), its 8-bit LoRA A over 5,120 inputs 29, its 4-bit down projection over 13,824 inputs 26."""
    from primal_compiler.mapping.lower import psum_bits

    lora, base = load_model("llama2-13b", "q,v:8"), load_model("llama2-13b")
    assert psum_bits(lora, 8, 4, 8, 16) == 32
    assert psum_bits(lora, 8, 4, 8, 4) == 8 + 8 + 13
    assert psum_bits(base, 8, 4, 8, 4) == 8 + 4 + 14
    low = compile_model(base, target, "lower-tiles{lm_head_bits=4}")
    assert low.model.precision.psum_bits == 26  # lower-tiles sets what the model's projections need
