"""Numeric weights: ONNX initializers behind recognised projections, and PEFT adapter directories.

ONNX weights are checked against the graph itself: onnx's reference
evaluator (onnxruntime is not a dependency) computes every projection's
input and output, and ``y = x @ W (+ b)``, ``x @ A``, ``h @ B`` must hold.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator
from safetensors.numpy import load_file, save_file

from primal_compiler.errors import InputError
from primal_compiler.frontend import load_model
from primal_compiler.frontend.onnx_import import load_onnx, recognise_onnx
from primal_compiler.frontend.onnx_weights import load_onnx_weights
from primal_compiler.frontend.peft import load_peft_adapter
from primal_compiler.frontend.weights import check_lora
from primal_compiler.ir.model import Role

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "onnx"
ALL = sorted(p.stem for p in FIXTURES.glob("*.onnx"))
LORA = [n for n in ALL if "_lora_" in n]
PEFT_NAMES = {Role.Q: "self_attn.q_proj", Role.K: "self_attn.k_proj", Role.V: "self_attn.v_proj"}


def write_adapter(directory: Path, model, roles=(Role.Q, Role.V), rank=8, alpha=16.0, zero=None, names=None,
                  prefix="base_model.model.model.layers", config=None, dtype=np.float32) -> dict:
    """A PEFT adapter for ``model`` with random factors; ``zero(layer, role, A, B)`` may zero parts in place.

    A and B are handed to ``zero`` in the IR layout (``in x r``, ``r x out``); the
    file stores PEFT's (``r x in``, ``out x r``). Returns the IR-layout factors.
    """
    rng = np.random.default_rng(7)
    names = names or PEFT_NAMES
    tensors, factors = {}, {}
    for layer in model.layers:
        for role in roles:
            lin = layer.linear(role)
            a = rng.normal(size=(lin.in_features, rank)).astype(np.float32)
            b = rng.normal(size=(rank, lin.out_features)).astype(np.float32)
            if zero is not None:
                zero(layer.index, role, a, b)
            key = f"{prefix}.{layer.index}.{names[role]}"
            tensors[f"{key}.lora_A.weight"] = np.ascontiguousarray(a.T).astype(dtype)
            tensors[f"{key}.lora_B.weight"] = np.ascontiguousarray(b.T).astype(dtype)
            factors[(layer.index, role)] = (a, b)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "adapter_model.safetensors"), metadata={"format": "pt"})
    cfg = {"peft_type": "LORA", "r": rank, "lora_alpha": alpha,
           "target_modules": sorted({names[r].rsplit(".", 1)[-1] for r in roles}), "bias": "none"}
    cfg.update(config or {})
    (directory / "adapter_config.json").write_text(json.dumps(cfg))
    return factors


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-llama", "q,v:8")


# --------------------------------------------------------------------------- ONNX


def _feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Inputs for one 8-token sequence with an empty KV cache."""
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for inp in model.graph.input:
        if inp.name in inits:
            continue
        dims = []
        for d in inp.type.tensor_type.shape.dim:
            if d.dim_value:
                dims.append(d.dim_value)
            elif "past" in d.dim_param and "+" not in d.dim_param:
                dims.append(0)
            elif "batch" in d.dim_param:
                dims.append(1)
            else:
                dims.append(8)
        if inp.type.tensor_type.elem_type == onnx.TensorProto.INT64:
            value = np.ones(dims, np.int64)
            if "input_ids" in inp.name or "position" in inp.name:
                value = (np.arange(int(np.prod(dims))) % 7 + 1).reshape(dims).astype(np.int64)
        else:
            value = np.zeros(dims, np.float32)
        feeds[inp.name] = value
    return feeds


@pytest.mark.parametrize("name", ALL)
def test_onnx_weights_reproduce_the_graph(name):
    path = FIXTURES / f"{name}.onnx"
    found = recognise_onnx(path)
    g = found.graph
    weights = load_onnx_weights(path)
    assert set(weights.projections) == set(found.projections)
    wanted = sorted({t for p in found.projections.values() for n in p.nodes
                     for t in (g.nodes[n].input[0], *g.nodes[n].output)})
    bias_adds = {}
    for key, p in found.projections.items():
        node = g.nodes[p.node]
        users = g.consumers.get(node.output[0], [])
        if node.op_type == "MatMul" and p.bias and len(users) == 1 and g.nodes[users[0]].op_type == "Add":
            bias_adds[key] = g.nodes[users[0]].output[0]
    wanted += sorted(set(bias_adds.values()))
    values = dict(zip(wanted, ReferenceEvaluator(g.model).run(wanted, _feeds(g.model))))
    for key, p in found.projections.items():
        pw = weights.projections[key]
        node = g.nodes[p.node]
        assert pw.w.shape == (p.in_features, p.out_features) and pw.w.dtype == np.float32
        init = numpy_helper.to_array(g.inits[p.weight])
        assert np.array_equal(pw.w, init) or np.array_equal(pw.w, init.T)
        x = values[node.input[0]]
        assert np.abs(x).max() > 0
        y = x @ pw.w + (pw.bias if node.op_type == "Gemm" and pw.bias is not None else 0)
        np.testing.assert_allclose(values[node.output[0]].reshape(y.shape), y, atol=1e-5)
        if key in bias_adds:
            np.testing.assert_allclose(values[bias_adds[key]].reshape(y.shape), y + pw.bias, atol=1e-5)
        assert (pw.bias is not None) == p.bias
        if p.lora is None:
            assert pw.a is None and pw.b is None
            continue
        na, nb = (g.nodes[i] for i in p.lora_nodes)
        np.testing.assert_allclose(values[na.output[0]], values[na.input[0]] @ pw.a, atol=1e-5)
        np.testing.assert_allclose(values[nb.output[0]], values[nb.input[0]] @ pw.b, atol=1e-5)


@pytest.mark.parametrize("name", LORA)
def test_onnx_lora_factors_match_the_exporter(name):
    truth = json.loads((FIXTURES / f"{name}.json").read_text())["lora"]
    weights = load_onnx_weights(FIXTURES / f"{name}.onnx", base=False)
    model = weights.model
    check_lora(weights, model)
    assert {r.value for r in weights.lora_roles} == set(truth["targets"])
    for (layer, role), p in weights.lora.items():
        lin = model.layers[layer].linear(role)
        assert p.a.shape == (lin.in_features, truth["rank"]) and p.b.shape == (truth["rank"], lin.out_features)
        assert p.scale == pytest.approx(truth["alpha"] / truth["rank"])
        assert p.w is None and p.bias is None  # base=False
        assert np.abs(p.b).max() > 0 and np.abs(p.a).max() > 0


def test_external_data_is_read_and_its_absence_is_an_input_error(tmp_path):
    name = "llama_lora_qv_r4_torchscript"
    path = tmp_path / f"{name}.onnx"
    onnx.save(onnx.load(str(FIXTURES / f"{name}.onnx")), str(path), save_as_external_data=True,
              all_tensors_to_one_file=True, location="w.data", size_threshold=0)
    inline = load_onnx_weights(FIXTURES / f"{name}.onnx")
    external = load_onnx_weights(path)
    for key, p in inline.projections.items():
        assert np.array_equal(p.w, external.projections[key].w)
        if p.a is not None:
            assert np.array_equal(p.b, external.projections[key].b)
    (tmp_path / "w.data").unlink()
    load_onnx(path)  # shape-only import does not need the data
    with pytest.raises(InputError, match=r"w\.data.*absent") as err:
        load_onnx_weights(path, base=False)
    assert err.value.where == str(path) and "\n" not in str(err.value)


def test_onnx_errors(tmp_path, tiny):
    with pytest.raises(InputError, match="no such ONNX model"):
        load_onnx_weights(tmp_path / "missing.onnx")
    weights = load_onnx_weights(FIXTURES / "llama_lora_qkvo_r8_dynamo.onnx", base=False)
    other = load_onnx(FIXTURES / "llama_lora_qv_r4_torchscript.onnx")
    with pytest.raises(InputError, match="file has LoRA on q,k,v,o, model has LoRA on q,v"):
        check_lora(weights, other)
    with pytest.raises(InputError, match="has 2 decoder layers, model tiny-llama has 4"):
        check_lora(weights, replace(tiny, layers=tiny.layers * 2))


# --------------------------------------------------------------------------- PEFT


def test_peft_adapter_factors_in_ir_layout(tmp_path, tiny):
    factors = write_adapter(tmp_path / "ad", tiny, alpha=32.0)
    weights = load_peft_adapter(tmp_path / "ad")
    check_lora(weights, tiny)
    assert weights.kind == "adapter" and weights.source.endswith("adapter_model.safetensors")
    assert set(weights.lora) == {(i, r) for i in range(tiny.num_layers) for r in (Role.Q, Role.V)}
    for key, (a, b) in factors.items():
        p = weights.projections[key]
        assert np.array_equal(p.a, a) and np.array_equal(p.b, b)
        assert p.a.shape == (256, 8) and p.b.shape == (8, 256) and p.scale == 4.0
        assert p.module.endswith(PEFT_NAMES[key[1]])


def test_peft_scale_variants_and_bfloat16(tmp_path, tiny):
    write_adapter(tmp_path / "rs", tiny, alpha=16.0, config={"use_rslora": True})
    assert load_peft_adapter(tmp_path / "rs").get(0, Role.Q).scale == pytest.approx(16 / np.sqrt(8))
    write_adapter(tmp_path / "pat", tiny, alpha=16.0, config={"alpha_pattern": {"v_proj": 4}})
    pat = load_peft_adapter(tmp_path / "pat")
    assert pat.get(1, Role.Q).scale == 2.0 and pat.get(1, Role.V).scale == 0.5
    factors = write_adapter(tmp_path / "bf", tiny, dtype=ml_dtypes.bfloat16)
    bf = load_peft_adapter(tmp_path / "bf")
    a = factors[(0, Role.Q)][0].astype(ml_dtypes.bfloat16).astype(np.float32)
    assert bf.get(0, Role.Q).a.dtype == np.float32 and np.array_equal(bf.get(0, Role.Q).a, a)


def test_gpt2_and_opt_module_names(tmp_path):
    gpt2 = load_onnx(FIXTURES / "gpt2_lora_cattn_r4_dynamo.onnx")
    names = {Role.QKV: "attn.c_attn", Role.O: "attn.c_proj", Role.FC1: "mlp.c_fc", Role.FC2: "mlp.c_proj"}
    write_adapter(tmp_path / "g", gpt2, roles=tuple(names), rank=4, names=names,
                  prefix="base_model.model.transformer.h")
    weights = load_peft_adapter(tmp_path / "g")
    assert set(weights.lora_roles) == set(names)
    assert weights.get(1, Role.QKV).a.shape == (32, 4) and weights.get(1, Role.QKV).b.shape == (4, 96)
    assert weights.get(0, Role.FC2).a.shape == (128, 4)  # mlp.c_proj is fc2, not o
    write_adapter(tmp_path / "g2", gpt2, roles=(Role.QKV,), rank=4, alpha=6, names=names,
                  prefix="base_model.model.transformer.h")
    check_lora(load_peft_adapter(tmp_path / "g2"), gpt2)  # the fixture's own LoRA: c_attn r4

    opt = load_onnx(FIXTURES / "opt_lora_qv_r4_torchscript.onnx")
    names = {Role.Q: "self_attn.q_proj", Role.V: "self_attn.v_proj", Role.O: "self_attn.out_proj",
             Role.FC1: "fc1", Role.FC2: "fc2"}
    write_adapter(tmp_path / "o", opt, roles=tuple(names), rank=4, names=names,
                  prefix="base_model.model.model.decoder.layers")
    assert set(load_peft_adapter(tmp_path / "o").lora_roles) == set(names)


def _err(path, *, model=None) -> InputError:
    with pytest.raises(InputError) as err:
        weights = load_peft_adapter(path)
        check_lora(weights, model)
    assert "\n" not in str(err.value)
    return err.value


def test_peft_directory_errors(tmp_path, tiny):
    assert "no such adapter directory" in str(_err(tmp_path / "nope"))
    (tmp_path / "file").write_text("x")
    assert "not a directory" in str(_err(tmp_path / "file"))
    write_adapter(tmp_path / "a", tiny)
    (tmp_path / "a" / "adapter_config.json").unlink()
    e = _err(tmp_path / "a")
    assert e.where.endswith("adapter_config.json") and "missing" in e.problem
    write_adapter(tmp_path / "b", tiny)
    (tmp_path / "b" / "adapter_model.safetensors").unlink()
    e = _err(tmp_path / "b")
    assert e.where.endswith("adapter_model.safetensors") and "missing" in e.problem
    write_adapter(tmp_path / "c", tiny)
    (tmp_path / "c" / "adapter_config.json").write_text("{not json")
    assert "not readable JSON" in str(_err(tmp_path / "c"))
    write_adapter(tmp_path / "d", tiny)
    (tmp_path / "d" / "adapter_model.safetensors").write_bytes(b"garbage")
    assert "not a readable safetensors file" in str(_err(tmp_path / "d"))
    write_adapter(tmp_path / "e", tiny, config={"peft_type": "IA3"})
    assert "peft_type is IA3, not LORA" in str(_err(tmp_path / "e"))
    write_adapter(tmp_path / "f", tiny, config={"r": 4})
    assert "layer 0 q lora_A has rank 8, adapter_config.json says r=4" in str(_err(tmp_path / "f"))


def test_peft_mismatch_with_model(tmp_path, tiny):
    write_adapter(tmp_path / "r4", tiny, rank=4)
    e = _err(tmp_path / "r4", model=tiny)
    assert e.problem == "layer 0 q lora_A is 256x4, model expects 256x8"
    assert e.where == str(tmp_path / "r4" / "adapter_model.safetensors")
    write_adapter(tmp_path / "kv", tiny, roles=(Role.K, Role.V))
    assert _err(tmp_path / "kv", model=tiny).problem == "adapter targets k_proj, v_proj, model has LoRA on q,v"
    write_adapter(tmp_path / "plain", tiny)
    assert "model has no LoRA" in _err(tmp_path / "plain", model=load_model("tiny-llama")).problem

    def drop_layer1(directory):
        tensors = {k: v for k, v in load_file(str(directory / "adapter_model.safetensors")).items()
                   if ".layers.1.self_attn.v_proj." not in k}
        save_file(tensors, str(directory / "adapter_model.safetensors"))

    drop_layer1(tmp_path / "plain")
    assert "has no LoRA weights for layer 1 v" in _err(tmp_path / "plain", model=tiny).problem
    write_adapter(tmp_path / "deep", replace(tiny, layers=tiny.layers + (replace(tiny.layers[0], index=2),)))
    assert "has LoRA on layer 2 q, model tiny-llama has 2 layers" in _err(tmp_path / "deep", model=tiny).problem


def test_peft_key_errors(tmp_path, tiny):
    write_adapter(tmp_path / "x", tiny, roles=(Role.Q,), names={Role.Q: "self_attn.qkv_weird"})
    assert "adapter targets qkv_weird" in _err(tmp_path / "x").problem
    d = tmp_path / "onlya"
    write_adapter(d, tiny)
    tensors = {k: v for k, v in load_file(str(d / "adapter_model.safetensors")).items() if "lora_B" not in k}
    save_file(tensors, str(d / "adapter_model.safetensors"))
    assert "has no lora_B" in _err(d).problem
    save_file({"base_model.model.lm_head.weight": np.ones((2, 2), np.float32)}, str(d / "adapter_model.safetensors"))
    assert "holds base_model.model.lm_head.weight, which is not a LoRA factor" in _err(d).problem  # a saved module
    save_file({}, str(d / "adapter_model.safetensors"))
    assert "no LoRA weights" in _err(d).problem
