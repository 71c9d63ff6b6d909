"""blocking: CT capacity, whole reduction columns per CT, W_Q beside W_K, CT count errors."""

from __future__ import annotations

import numpy as np
import pytest

from primal_compiler.api import compile_model
from primal_compiler.errors import InputError
from primal_compiler.frontend import load_model
from primal_compiler.ir.model import Role
from primal_compiler.ir.tiles import ROLE_INDEX, Macro
from primal_compiler.target import with_overrides


def test_llama2_13b_needs_five_cts_per_layer(target):
    prog = compile_model(load_model("llama2-13b", "q,v:8"), target, "lower-tiles,blocking")
    layout, t = prog.layout, prog.tiles
    assert (layout.ct_layer == 0).sum() == 5 and layout.num_cts == 40 * 5 + 11
    rram = t.macro == Macro.RRAM
    counts = np.bincount(t.ct[rram], minlength=layout.num_cts)
    assert counts.max() <= 1024
    key = (t.layer[rram].astype(np.int64) * 100 + t.role[rram]) * 1000 + t.bcol[rram]
    for k in np.unique(key)[:500]:  # a reduction column never straddles two CTs
        assert np.unique(t.ct[rram][key == k]).size == 1
    q = rram & (t.layer == 0) & (t.role == ROLE_INDEX[Role.Q])
    k = rram & (t.layer == 0) & (t.role == ROLE_INDEX[Role.K])
    assert t.seq[k].min() == t.seq[q].max() + 1 and t.ct[k].min() == t.ct[q].max()  # W_K follows W_Q
    assert len(layout.templates) == 5 + 11  # one layer solved, replicated 40 times


def test_fixed_ct_count_too_small_names_the_need(target):
    small = with_overrides(target, {"system.num_cts": 100})
    with pytest.raises(InputError, match="needs 211 CTs"):
        compile_model(load_model("llama2-13b", "q,v:8"), small, "lower-tiles,blocking")


def test_blocking_without_tiles_names_passes_run(target):
    with pytest.raises(InputError, match=r"pass blocking: requires tiles.*earlier passes: none"):
        compile_model(load_model("tiny-llama"), target, "blocking")


def test_every_flow_endpoint_in_its_ct(tiny_blocked):
    for tp in tiny_blocked.layout.templates:
        inst = tp.instance
        assert inst.num_tiles <= inst.rows * inst.cols
        assert len(inst.src) and inst.weight.min() > 0
