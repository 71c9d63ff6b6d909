"""DoRA in an ONNX graph: read and replayed exactly, or refused naming DoRA (it was refused as an attention variant).

PEFT's weight-decomposed LoRA computes ``c * (x W + s x A B)`` with ``c = m / ||W + s B A||`` per output
column: the dynamo exporter folds ``c`` and ``c - 1`` into constants, the TorchScript exporter computes the
norm at run time (``ReduceL2`` over the weights). Both forms are made here from a real dynamo LoRA export
by rewriting its key adapter the way each exporter writes DoRA (the graphs of ``peft`` 0.21 with
``use_dora=True`` through ``torch.onnx`` 2.13, compared by hand).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from primal_compiler.errors import InputError
from primal_compiler.frontend.onnx_import import load_onnx
from primal_compiler.ir.model import Role

LORA = Path(__file__).resolve().parents[1] / "fixtures" / "onnx" / "llama_lora_qkvo_r8_dynamo.onnx"
PLAIN = LORA.parent / "llama_dynamo.onnx"
# the key projection's adapter in that file: base x W, B's output, its scaled copy and their sum
BASE, B_OUT, SCALED, SUM, W, A, B, SCALE = ("linear_3", "linear_5", "node_mul_110", "node_add_154", "val_53",
                                            "val_54", "val_55", "val_38")


def _dora(run_time_norm: bool) -> onnx.ModelProto:
    model = onnx.load(str(LORA))
    graph = model.graph
    inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    nodes = list(graph.node)
    at = next(i for i, n in enumerate(nodes) if n.name == SCALED)
    assert nodes[at + 1].name == SUM
    magnitude = np.random.default_rng(0).uniform(0.5, 1.5, (1, 32)).astype(np.float32)
    if run_time_norm:  # c = m / ||W + s A B|| over each output column, computed by the graph
        graph.initializer.append(numpy_helper.from_array(magnitude, "dora_m"))
        new = [helper.make_node("MatMul", [A, B], ["dora_ab"]), helper.make_node("Mul", ["dora_ab", SCALE], ["dora_sab"]),
               helper.make_node("Add", [W, "dora_sab"], ["dora_w"]),
               helper.make_node("ReduceL2", ["dora_w", "dora_axis"], ["dora_n"], name="dora_norm", keepdims=1),
               helper.make_node("Div", ["dora_m", "dora_n"], ["dora_c"]),
               helper.make_node("Sub", ["dora_c", "dora_one"], ["dora_c1"])]
        graph.initializer.extend([numpy_helper.from_array(np.array([0], np.int64), "dora_axis"),
                                  numpy_helper.from_array(np.array(1.0, np.float32), "dora_one")])
    else:  # folded: c and c - 1 as constants
        w = inits[W] + float(inits[SCALE]) * inits[A] @ inits[B]
        c = magnitude / np.linalg.norm(w, axis=0, keepdims=True)
        graph.initializer.extend([numpy_helper.from_array(c, "dora_c"), numpy_helper.from_array(c - 1, "dora_c1")])
        new = []
    new += [helper.make_node("Mul", ["dora_c", B_OUT], ["dora_cb"], name="dora_scale"),
            helper.make_node("Mul", ["dora_cb", SCALE], ["dora_cbs"]),
            helper.make_node("Mul", ["dora_c1", BASE], ["dora_base"]),
            helper.make_node("Add", ["dora_base", "dora_cbs"], ["dora_sum"]),
            helper.make_node("Add", [BASE, "dora_sum"], list(nodes[at + 1].output))]
    del graph.node[:]
    graph.node.extend(nodes[:at] + new + nodes[at + 2:])
    onnx.checker.check_model(model)
    return model


def _check(tmp_path, model: onnx.ModelProto) -> dict:
    from primal_compiler.report.check import check_onnx
    from primal_compiler.target import load_primal_target

    path = tmp_path / "dora.onnx"
    onnx.save(model, str(path))
    return check_onnx(str(path), load_primal_target("primal-7nm"))


@pytest.mark.parametrize("run_time_norm", [False, True])
def test_a_dora_adapter_replays_to_onnxruntime(tmp_path, run_time_norm):
    """Folded or computed at run time, c is read as the file computes it and applied at the roots."""
    pytest.importorskip("onnxruntime")
    model = _dora(run_time_norm)
    path = tmp_path / "read.onnx"
    onnx.save(model, str(path))
    k = load_onnx(path).layers[0].linear(Role.K)
    assert k.lora.dora and k.lora.rank == 8 and k.lora_params == 8 * (32 + 32) + 32  # the magnitudes counted
    info = _check(tmp_path, model)
    assert info["verdict"] == "OK" and info["relative_error"] < 1e-5, info


def test_without_the_column_scale_the_replay_misses(tmp_path, monkeypatch):
    """The check can fail: the same program with ACT DORA as the identity does not match onnxruntime."""
    pytest.importorskip("onnxruntime")
    from primal_compiler.functional import compute

    monkeypatch.setattr(compute, "_dora", lambda m, r, x: x)
    info = _check(tmp_path, _dora(False))
    assert info["verdict"] == "MISMATCH", info


def test_a_program_with_dora_scales_at_the_adapted_roots_only(tmp_path):
    import primal_compiler as pc
    from primal_compiler.isa.opcodes import ActFn, Opcode

    path = tmp_path / "dora.onnx"
    onnx.save(_dora(False), str(path))
    program = pc.compile(str(path), target="primal-7nm")
    rec = program.stream.records
    acts = rec[(rec["op"] == Opcode.ACT) & (rec["arg"] == ActFn.DORA)]
    assert len(acts) and set(acts["layer"].tolist()) == {0}  # only layer 0's key carries DoRA here


def test_a_column_factor_of_the_base_that_is_not_c_minus_one_is_refused(tmp_path):
    model = _dora(False)
    less = next(t for t in model.graph.initializer if t.name == "dora_c1")
    less.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(less) + np.float32(0.01), "dora_c1"))
    with pytest.raises(InputError) as err:
        _check(tmp_path, model)
    assert "weight-decomposed LoRA (DoRA)" in err.value.problem and "not the column scale minus one" in err.value.problem


def test_a_sum_that_is_not_dora_s_is_refused_naming_dora(tmp_path):
    """c times the adapter, but the base never added back: refused naming DoRA, never read as a plain LoRA."""
    model = _dora(False)
    final = next(n for n in model.graph.node if n.input and n.input[0] == BASE and n.input[1] == "dora_sum")
    final.op_type = "Sub"
    path = tmp_path / "dora.onnx"
    onnx.save(model, str(path))
    with pytest.raises(InputError) as err:
        load_onnx(path)
    assert err.value.problem.startswith("weight-decomposed LoRA (DoRA)") and "node dora_scale" in err.value.problem


def test_the_plain_adapter_it_is_made_from_is_read():
    k = load_onnx(LORA).layers[0].linear(Role.K)
    assert k.lora is not None and k.lora.rank == 8


# --------------------------------------------------------------------------- PEFT adapter directories


def _dora_dir(tmp_path, with_magnitudes=True, use_dora=True, model=None) -> tuple[Path, dict, dict]:
    """A PEFT DoRA adapter (PEFT >= 0.12 names: ``<module>.lora_magnitude_vector``) on ``model`` (default: the
    plain Llama export)."""
    from safetensors.numpy import load_file, save_file

    from tests.frontend.test_weights import PEFT_NAMES, write_adapter

    base = load_onnx(model or PLAIN)
    directory = tmp_path / "dora"
    factors = write_adapter(directory, base, roles=(Role.Q, Role.V), rank=4, alpha=8.0,
                            config={"use_dora": use_dora})
    tensors = load_file(str(directory / "adapter_model.safetensors"))
    rng = np.random.default_rng(3)
    magnitudes = {key: rng.uniform(0.5, 1.5, base.layers[key[0]].linear(key[1]).out_features).astype(np.float32)
                  for key in factors}
    if with_magnitudes:
        for (layer, role), m in magnitudes.items():
            tensors[f"base_model.model.model.layers.{layer}.{PEFT_NAMES[role]}.lora_magnitude_vector"] = m
    save_file(tensors, str(directory / "adapter_model.safetensors"), metadata={"format": "pt"})
    return directory, factors, magnitudes



@pytest.mark.parametrize("model", [PLAIN, PLAIN.parent / "families" / "qwen2.onnx"], ids=["llama", "qwen2-biased-gqa"])
def test_a_peft_dora_adapter_replays_as_peft_merges_it(tmp_path, model):
    """c = m / ||W + s A B|| per output column, computed from the base file's W: the replay with the unmerged
    adapter equals onnxruntime on a copy whose weights are c * (W + s A B), the bias left as it is (PEFT
    rescales the projection without its bias: Qwen2's q and v have one)."""
    pytest.importorskip("onnxruntime")
    from tests.frontend.merged import replay_and_merged

    directory, factors, magnitudes = _dora_dir(tmp_path, model=model)

    def merge(key, w, summed):  # PEFT's get_weight_norm: ||W + s B A|| over dim 1 of its out x in weight
        peft_weight = summed.T
        return (peft_weight * (magnitudes[key] / np.linalg.norm(peft_weight, axis=1))[:, None]).T

    got, want, plain = replay_and_merged(model, directory, factors, lambda a, b: 2.0 * a @ b, tmp_path, merge)
    scale = np.abs(want).max()
    assert np.abs(got - want).max() / scale < 1e-5
    assert np.abs(plain - want).max() / scale > 1e-3  # the adapter moves the logits


@pytest.mark.parametrize("with_magnitudes, use_dora, message", [
    (False, True, "has no lora_magnitude_vector, which a DoRA adapter (use_dora) needs"),
    (True, False, "has a DoRA lora_magnitude_vector, but adapter_config.json does not set use_dora"),
])
def test_a_dora_adapter_and_its_config_must_agree(tmp_path, with_magnitudes, use_dora, message):
    from primal_compiler.frontend.peft import load_peft_adapter

    directory, _, _ = _dora_dir(tmp_path, with_magnitudes, use_dora)
    with pytest.raises(InputError) as err:
        load_peft_adapter(directory)
    assert message in err.value.problem and err.value.where.endswith("adapter_model.safetensors")


def test_inspect_says_dora_and_counts_the_magnitudes(tmp_path, capsys):
    from primal_compiler.cli import main

    directory, factors, _ = _dora_dir(tmp_path)
    assert main(["inspect", str(PLAIN), "--adapter", str(directory)]) == 0
    out = capsys.readouterr().out
    stored = sum(a.nbytes + b.nbytes for a, b in factors.values()) + sum(b.shape[1] * 4 for _, b in factors.values())
    assert f"{stored:,} bytes of LoRA tensors (DoRA: magnitudes included)" in out
    assert "DoRA 1,152 on q,v (magnitudes included)" in out  # 4 modules x (4 x (32 + 32) + 32)


def test_a_factor_of_the_base_that_is_not_c_minus_one_is_refused_when_read(tmp_path):
    """``2 * base + c * s * lora`` (c - 1 replaced by one) is not DoRA: refused by inspect and compile, not only
    by a replay that reads the weights."""
    model = _dora(False)
    less = next(t for t in model.graph.initializer if t.name == "dora_c1")
    less.CopyFrom(numpy_helper.from_array(np.ones_like(numpy_helper.to_array(less)), "dora_c1"))
    path = tmp_path / "dora.onnx"
    onnx.save(model, str(path))
    with pytest.raises(InputError) as err:
        load_onnx(path)
    assert "is not the column scale minus one" in err.value.problem


def test_dora_on_a_biased_base_is_refused(tmp_path):
    """A Gemm with a bias as the base: the graph scales the bias too (c * (x W + b) + ...), which PEFT never
    does and the replay would not; refused naming DoRA."""
    model = _dora(False)
    graph, nodes = model.graph, list(model.graph.node)
    at = next(i for i, n in enumerate(nodes) if BASE in n.output)
    x = nodes[at].input[0]
    gemm = [helper.make_node("Constant", [], ["gm_shape"], value=numpy_helper.from_array(np.array([-1, 32], np.int64))),
            helper.make_node("Reshape", [x, "gm_shape"], ["gm_x"]), helper.make_node("Gemm", ["gm_x", W, "gm_b"], ["gm_y"]),
            helper.make_node("Shape", [x], ["gm_s"]), helper.make_node("Reshape", ["gm_y", "gm_s"], [BASE])]
    graph.initializer.append(numpy_helper.from_array(np.full(32, 0.5, np.float32), "gm_b"))
    del graph.node[:]
    graph.node.extend(nodes[:at] + gemm + nodes[at + 1:])
    path = tmp_path / "dora.onnx"
    onnx.save(model, str(path))
    with pytest.raises(InputError) as err:
        load_onnx(path)
    assert err.value.problem.startswith("weight-decomposed LoRA (DoRA)") and "no bias" in err.value.problem


def test_several_adapters_with_dora_are_refused_in_either_order(tmp_path):
    from primal_compiler.frontend.peft import attach_adapter, read_adapter
    from tests.frontend.test_weights import write_adapter

    base = load_onnx(PLAIN)
    dora, _, _ = _dora_dir(tmp_path)
    plain = tmp_path / "plain"
    write_adapter(plain, base, roles=(Role.Q, Role.V), rank=4, alpha=8.0)
    adapters = [read_adapter(d, base) for d in (plain, dora)]
    for order in (adapters, adapters[::-1]):
        with pytest.raises(InputError) as err:
            attach_adapter(base, order)
        assert "DoRA adapters are compiled one at a time" in err.value.problem


@pytest.mark.parametrize("run_time_norm", [False, True])
def test_an_fp16_dora_export_compares_c_minus_one_within_fp16s_rounding(tmp_path, run_time_norm):
    """c and c - 1 stored (or computed) in float16 differ from an exact subtraction by up to fp16's epsilon:
    read, and replayed within the fp16 comparison's tolerance, not refused as another sum."""
    pytest.importorskip("onnxruntime")
    from tests.frontend.families import to_float16

    info = _check(tmp_path, to_float16(_dora(run_time_norm)))
    assert info["verdict"] == "OK", info
