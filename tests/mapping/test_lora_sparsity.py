"""lora-sparsity: exactly the SRAM tiles whose LoRA block is all zero get ``zero = 1``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from safetensors.numpy import save_file

from primal_compiler.api import compile_model
from primal_compiler.errors import InputError
from primal_compiler.frontend import load_model
from primal_compiler.frontend.onnx_import import recognise_onnx
from primal_compiler.ir.model import Role
from primal_compiler.ir.tiles import ROLE_CODES, ROLE_INDEX, Macro, Part
from primal_compiler.target import with_overrides

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "onnx"
PEFT_NAMES = {Role.Q: "q_proj", Role.V: "v_proj"}


def write_adapter(directory: Path, model, zero=None, rank=8, alpha=16) -> Path:
    """PEFT adapter for ``model``'s q,v LoRA; ``zero(layer, role, A, B)`` zeroes blocks of A (in x r) / B (r x out)."""
    rng = np.random.default_rng(3)
    tensors = {}
    for layer in model.layers:
        for role, name in PEFT_NAMES.items():
            lin = layer.linear(role)
            a = rng.uniform(0.5, 1.0, size=(lin.in_features, rank)).astype(np.float32)
            b = rng.uniform(0.5, 1.0, size=(rank, lin.out_features)).astype(np.float32)
            if zero is not None:
                zero(layer.index, role, a, b)
            key = f"base_model.model.model.layers.{layer.index}.self_attn.{name}"
            tensors[f"{key}.lora_A.weight"] = np.ascontiguousarray(a.T)
            tensors[f"{key}.lora_B.weight"] = np.ascontiguousarray(b.T)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    (directory / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "r": rank, "lora_alpha": alpha, "target_modules": list(PEFT_NAMES.values())})
    )
    return directory


def masked(tiles) -> set[tuple[int, str, str, int, int]]:
    idx = np.flatnonzero(tiles.zero == 1)
    return {(int(tiles.layer[i]), ROLE_CODES[tiles.role[i]].value, Part(tiles.part[i]).name, int(tiles.brow[i]),
             int(tiles.bcol[i])) for i in idx}


def record(program):
    return next(r for r in program.records if r.name == "lora-sparsity")


@pytest.fixture(scope="module")
def fine_target(target):
    """64-row SRAM macros: with 16-bit LoRA (4 ranks per tile) A and B of q,v are 4x2 tiles each.

    128x128 crossbars give each layer enough PEs (52) to host its 32 SRAM tiles.
    """
    return with_overrides(target, {"sram.rows": 64, "rram.rows": 128, "rram.cols": 128})


def test_exactly_the_zero_blocks_are_masked(tmp_path, tiny_model, fine_target):
    def zero(layer, role, a, b):
        if (layer, role) == (0, Role.Q):
            a[64:128, :] = 0  # input block 1, both rank blocks
            b[:, 0:64] = 0  # output block 0...
            b[5, 10] = 1.0  # ...except one weight in rank block 1
        if (layer, role) == (1, Role.V):
            a[:, 4:8] = 0  # rank block 1 of every input block
        if (layer, role) == (1, Role.Q):
            b[0:4, :] = 0  # rank block 0 of every output block
            a[192:256, 0:4] = 0  # one A tile
        if (layer, role) == (0, Role.V):
            b[:, 192:256] = 0  # output block 3
            a[0:64, 0:4] = 0
            a[63, 3] = -0.0  # negative zero is zero

    adapter = write_adapter(tmp_path / "ad", tiny_model, zero)
    prog = compile_model(tiny_model, fine_target, f"lower-tiles{{lora_bits=16}},lora-sparsity{{adapter={adapter}}}")
    t = prog.tiles
    expected = {(0, "q", "LORA_A", 1, 0), (0, "q", "LORA_A", 1, 1), (0, "q", "LORA_B", 0, 0)}
    expected |= {(1, "v", "LORA_A", i, 1) for i in range(4)}
    expected |= {(1, "q", "LORA_B", i, 0) for i in range(4)} | {(1, "q", "LORA_A", 3, 0)}
    expected |= {(0, "v", "LORA_B", 3, 0), (0, "v", "LORA_B", 3, 1), (0, "v", "LORA_A", 0, 0)}
    assert masked(t) == expected
    sram = t.macro == Macro.SRAM
    assert sram.sum() == 2 * 2 * 2 * 8  # layers x roles x (A, B) x 4x2 tiles
    assert set(np.unique(t.zero[sram])) == {0, 1} and (t.zero[~sram] == 0).all()
    details = record(prog).details
    assert details["lora_tiles"] == 64 and details["masked_tiles"] == len(expected) == 15
    assert details["masked_fraction"] == pytest.approx(15 / 64, abs=1e-6)
    assert details["masked_fraction_by_role"] == {"q": pytest.approx(8 / 32), "v": pytest.approx(7 / 32)}
    assert details["masked_a_tiles"] + details["masked_b_tiles"] == 15
    assert details["masked_bytes"] == int(t.bytes[t.zero == 1].sum())
    assert prog.facts >= {"tiles", "lora-sparsity"}
    # the other weight columns are untouched
    plain = compile_model(tiny_model, fine_target, "lower-tiles{lora_bits=16}").tiles
    assert (plain.zero == -1).all()
    for col in ("layer", "role", "part", "brow", "bcol", "rows", "cols", "bytes", "host"):
        assert np.array_equal(getattr(plain, col), getattr(t, col))


def test_each_replicated_layer_is_checked_against_its_own_weights(tmp_path, tiny_model, target):
    def zero(layer, role, a, b):
        if (layer, role) == (1, Role.Q):
            a[:] = 0

    adapter = write_adapter(tmp_path / "ad", tiny_model, zero)
    prog = compile_model(tiny_model, target, f"lower-tiles,lora-sparsity{{adapter={adapter}}}")
    t = prog.tiles
    q_a = (t.role == ROLE_INDEX[Role.Q]) & (t.part == Part.LORA_A)
    assert (t.layer[q_a] == 0).any() and (t.layer[q_a] == 1).any()
    assert masked(t) == {(1, "q", "LORA_A", 0, 0)}  # default macros: one 256x8 tile per factor
    assert record(prog).details["masked_fraction_by_role"] == {"q": 0.25, "v": 0.0}


def test_onnx_weights_route(tmp_path, target):
    name = "llama_lora_qv_r4_torchscript"
    path = FIXTURES / f"{name}.onnx"
    model = load_model(str(path))
    prog = compile_model(model, target, f"lower-tiles,lora-sparsity{{weights={path}}}")
    assert (prog.tiles.zero == 0).all() and record(prog).details["masked_tiles"] == 0

    found = recognise_onnx(path)
    a_node = found.graph.nodes[found.projections[(1, Role.V)].lora_nodes[0]]
    proto = onnx.load(str(path))
    init = next(t for t in proto.graph.initializer if t.name == a_node.input[1])
    init.CopyFrom(numpy_helper.from_array(np.zeros_like(numpy_helper.to_array(init)), init.name))
    zeroed = tmp_path / f"{name}.onnx"
    onnx.save(proto, str(zeroed))
    prog = compile_model(model, target, f"lower-tiles,lora-sparsity{{weights={zeroed}}}")
    assert masked(prog.tiles) == {(1, "v", "LORA_A", 0, 0)}
    assert record(prog).details["source"] == str(zeroed)


def test_option_and_contract_errors(tmp_path, tiny_model, target):
    for spec in ("lower-tiles,lora-sparsity", f"lower-tiles,lora-sparsity{{weights=a.onnx,adapter={tmp_path}}}"):
        with pytest.raises(InputError) as err:
            compile_model(tiny_model, target, spec)
        assert err.value.where == "pass lora-sparsity" and "weights" in err.value.problem
        assert "adapter" in err.value.problem
    with pytest.raises(InputError, match="requires tiles"):
        compile_model(tiny_model, target, f"lora-sparsity{{adapter={tmp_path}}}")
    adapter = write_adapter(tmp_path / "r4", tiny_model, rank=4)
    with pytest.raises(InputError, match="layer 0 q lora_A is 256x4, model expects 256x8"):
        compile_model(tiny_model, target, f"lower-tiles,lora-sparsity{{adapter={adapter}}}")
    onnx_lora = FIXTURES / "llama_lora_qv_r4_torchscript.onnx"
    with pytest.raises(InputError, match="lora_A is 32x4, model expects 256x8"):
        compile_model(tiny_model, target, f"lower-tiles,lora-sparsity{{weights={onnx_lora}}}")


def test_runs_after_placement_and_keeps_it(tmp_path, tiny_blocked, tiny_model, small_target):
    def zero(layer, role, a, b):
        if role == Role.V:
            b[:] = 0

    adapter = write_adapter(tmp_path / "ad", tiny_model, zero)
    prog = compile_model(tiny_model, small_target, f"lower-tiles,blocking,lora-sparsity{{adapter={adapter}}}",
                         verify=True)
    t = prog.tiles
    v_b = (t.role == ROLE_INDEX[Role.V]) & (t.part == Part.LORA_B)
    assert (t.zero[v_b] == 1).all() and (t.zero[~v_b] == 0).all()
    assert np.array_equal(t.ct, tiny_blocked.tiles.ct)


def test_synthetic_zero_fraction_masks_a_seeded_sample(tiny_model, target):
    from primal_compiler.ir.tiles import Macro

    runs = [compile_model(tiny_model, target, f"lower-tiles,lora-sparsity{{zero_fraction=0.25,seed={s}}}") for s in (0, 0, 1)]
    sram = runs[0].tiles.macro == Macro.SRAM
    assert runs[0].tiles.zero[sram].sum() == round(0.25 * sram.sum())
    assert (runs[0].tiles.zero[~sram] == 0).all()
    assert np.array_equal(runs[0].tiles.zero, runs[1].tiles.zero)
    assert not np.array_equal(runs[0].tiles.zero, runs[2].tiles.zero)
    assert "synthetic" in runs[0].records[-1].details["source"]
    with pytest.raises(InputError, match="zero_fraction must be >= 0.0 and <= 1.0"):
        compile_model(tiny_model, target, "lower-tiles,lora-sparsity{zero_fraction=1.5}")
