"""LoRA tiles without an RRAM host: a rank too large for the layer's crossbars gets PEs of its own.

The fixture is ``llama_lora_qkvo_r8_dynamo`` with its LoRA factors replaced by
rank-16 or rank-24 ones (random, built in-process). On 32x32 crossbars and
32-row LoRA tiles each layer has 13 RRAM tiles; rank 16 gives it 16 LoRA
tiles (tiny-llama's ratio on primal-7nm: 3 hold a PE alone), rank 24 gives
it 24 (11 alone, 8 of them in a CT of 4x4 PEs that holds no RRAM tile).
"""

from __future__ import annotations

import numpy as np
import pytest

from primal_compiler.executor.replay import replay
from primal_compiler.executor.validate import validate_hops
from primal_compiler.frontend import load_model
from primal_compiler.functional import compile_for_replay, replay_functional
from primal_compiler.ir.tiles import Macro
from primal_compiler.isa.schema import compiled_issue
from tests.functional.conftest import PLACE, fixture
from tests.functional.reference import ort_greedy
from tests.functional.test_exact import PROMPT, TOL, relative_error

OWN = {16: 3, 24: 11}  # LoRA tiles per layer that are their own host


@pytest.fixture(scope="module", params=sorted(OWN), ids=lambda r: f"r{r}")
def rank(request) -> int:
    return request.param


@pytest.fixture(scope="module")
def lora_file(tmp_path_factory, rank) -> str:
    """``llama_lora_qkvo_r8_dynamo`` with rank-``rank`` LoRA factors (A in x r, B r x out, std 0.05)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(fixture("llama_lora_qkvo_r8_dynamo"))
    rng = np.random.default_rng(rank)
    changed = 0
    for t in model.graph.initializer:
        shape = list(t.dims)
        if shape in ([32, 8], [8, 32]):
            new = [32, rank] if shape == [32, 8] else [rank, 32]
            value = (rng.standard_normal(new) * 0.05).astype(np.float32)
            t.CopyFrom(numpy_helper.from_array(value, t.name))
            changed += 1
    assert changed == 16  # A and B of q, k, v, o in two layers
    del model.graph.value_info[:]  # the rank-8 intermediate shapes
    out = tmp_path_factory.mktemp(f"rank{rank}") / f"llama_lora_qkvo_r{rank}.onnx"
    onnx.save(model, str(out))
    return str(out)


@pytest.fixture(scope="module")
def wide_target(replay_target):
    """The replay target with 32x32 crossbars and 32-row LoRA tiles: one RRAM tile per attention matrix."""
    from primal_compiler.target import with_overrides

    return with_overrides(replay_target, {"rram.rows": 32, "rram.cols": 32, "sram.rows": 32})


@pytest.fixture(scope="module")
def program(lora_file, rank, wide_target):
    model = load_model(lora_file)
    assert {lin.lora.rank for lin in model.layers[0].linears if lin.lora} == {rank}
    pipeline = PLACE.format(opts="", context=32)
    return compile_for_replay(model, wide_target, len(PROMPT), 4, pipeline)


def test_lora_tiles_beyond_the_crossbars_own_a_pe(program, rank):
    t = program.tiles
    rows = np.arange(len(t))
    sram = t.macro == Macro.SRAM
    own = sram & (t.host == rows)
    layer0 = t.layer == 0
    assert (~sram & layer0).sum() == 13 and (sram & layer0).sum() == 13 + OWN[rank]
    assert (own & layer0).sum() == OWN[rank]
    owners = ~sram | own
    key = t.ct[owners].astype(np.int64) * 16 + t.pe[owners]
    assert np.unique(key).size == owners.sum()  # one RRAM or self-hosted SRAM tile per PE
    hosted = sram & ~own
    assert (t.macro[t.host[hosted]] == Macro.RRAM).all() and np.unique(t.host[sram]).size == sram.sum()
    only_sram = [c for c in np.unique(t.ct[own]) if not (~sram & (t.ct == c)).any()]
    assert len(only_sram) == (2 if rank == 24 else 0)  # rank 24: a CT per layer holds only LoRA PEs


def test_program_passes_the_loader_checks_and_hop_validation(program, wide_target):
    from primal_compiler.compiled import program_file

    meta, arrays = program_file(program, wide_target)
    assert compiled_issue(meta, arrays, program.stream) is None
    counts = validate_hops(replay(meta, arrays, program.stream, wide_target))
    assert counts["mapped_legs"] > 0 and counts["d2d_legs"] > 0 and counts["kv_legs"] > 0


def test_exact_replay_matches_onnxruntime(program, wide_target, lora_file):
    result = replay_functional(program, wide_target, lora_file, prompt=PROMPT, generate=4)
    want = ort_greedy(lora_file, PROMPT, 4)
    assert relative_error(want, ort_greedy(fixture("llama_lora_qkvo_r8_dynamo"), PROMPT, 4)) > 1e-3  # LoRA matters
    assert relative_error(result.logits, want) < TOL
    assert result.tokens == [int(x) for x in want.argmax(axis=1)]
