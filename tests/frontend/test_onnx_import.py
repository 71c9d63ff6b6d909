"""ONNX frontend against real exporter output (fixtures from tests/fixtures/make_fixtures.py).

Each fixture's JSON sidecar holds what the exporting side knew (the Hugging
Face config, ``num_parameters()``, PEFT's trainable parameters); the imported
IR must agree with it. Only onnx is needed here, never torch.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import onnx
import pytest

from primal_compiler.errors import InputError
from primal_compiler.frontend.onnx_import import load_onnx
from primal_compiler.ir.model import Positional, Role
from tests.frontend.decoders import fused_decoder

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "onnx"
ALL = sorted(p.stem for p in FIXTURES.glob("*.onnx"))


def sidecar(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def test_fixture_set_covers_every_exporter_and_family():
    seen = {(sidecar(n)["family"], sidecar(n)["exporter"], sidecar(n)["with_past"]) for n in ALL}
    for family in ("llama", "mistral", "gpt2", "opt"):
        for exporter, past in (("torchscript", False), ("dynamo", False), ("optimum", False), ("optimum", True)):
            assert (family, exporter, past) in seen
    lora = [sidecar(n)["lora"] for n in ALL if sidecar(n)["lora"]]
    assert len({(tuple(x["targets"]), x["rank"]) for x in lora}) >= 5
    assert sum(p.stat().st_size for p in FIXTURES.glob("*.onnx")) < 5 * 1024 * 1024


@pytest.mark.parametrize("name", ALL)
def test_import_matches_exporter_truth(name):
    truth = sidecar(name)
    model = load_onnx(FIXTURES / f"{name}.onnx")
    assert model.name == name
    assert model.source.startswith("onnx:pytorch")
    assert model.num_layers == truth["num_layers"]
    assert model.hidden_size == truth["hidden_size"]
    assert model.vocab_size == truth["vocab_size"]
    assert model.intermediate_size == truth["intermediate_size"]
    for layer in model.layers:
        att = layer.attention
        assert (att.num_heads, att.num_kv_heads, att.head_dim) == (
            truth["num_heads"],
            truth["num_kv_heads"],
            truth["head_dim"],
        )
        assert layer.norm == truth["norm"] and layer.num_norms == 2
        assert layer.activation == truth["activation"]
        assert all(lin.bias == truth["bias"] for lin in layer.linears)
    assert model.norm == truth["norm"]
    assert model.positional == truth["positional"]
    base_params = truth["base_params"]
    if model.positional == Positional.LEARNED:
        rows, max_pos = truth["num_pos_embeddings"], truth["max_position_embeddings"]
        if "static_seq_len" in truth:
            # The static-shape export folded wpe[:S] into a constant: only S positions exist in the graph.
            rows = max_pos = truth["static_seq_len"]
            base_params -= (truth["num_pos_embeddings"] - rows) * truth["hidden_size"]
        assert model.num_pos_embeddings == rows
        assert model.max_position_embeddings == max_pos
    assert model.tie_word_embeddings == truth["tie_word_embeddings"]
    assert not model.lm_head_bias
    assert model.base_params == base_params
    assert model.lora_params == truth["lora_params"]


@pytest.mark.parametrize("name", ALL)
def test_roles_and_lora(name):
    truth = sidecar(name)
    model = load_onnx(FIXTURES / f"{name}.onnx")
    family = truth["family"]
    expected_roles = {
        "llama": ["q", "k", "v", "o", "gate", "up", "down"],
        "mistral": ["q", "k", "v", "o", "gate", "up", "down"],
        "gpt2": ["qkv", "o", "fc1", "fc2"],
        "opt": ["q", "k", "v", "o", "fc1", "fc2"],
    }[family]
    lora = truth["lora"]
    for layer in model.layers:
        assert [lin.role.value for lin in layer.linears] == expected_roles
        for lin in layer.linears:
            if lora and lin.role.value in lora["targets"]:
                assert lin.lora is not None
                assert lin.lora.rank == lora["rank"]
                assert lin.lora.alpha == pytest.approx(lora["alpha"])
            else:
                assert lin.lora is None
    assert sorted(r.value for r in model.lora_targets) == sorted(lora["targets"] if lora else [])


def _scramble_names(model: onnx.ModelProto) -> None:
    """Rename every node, initializer and internal value: recognition must not need names."""
    keep = {i.name for i in model.graph.input} | {o.name for o in model.graph.output}
    mapping: dict[str, str] = {}

    def new(name: str) -> str:
        if not name or name in keep:
            return name
        return mapping.setdefault(name, f"t{len(mapping)}")

    for init in model.graph.initializer:
        init.name = new(init.name)
    for i, node in enumerate(model.graph.node):
        node.name = f"n{i}"
        node.input[:] = [new(x) for x in node.input]
        node.output[:] = [new(x) for x in node.output]
    for vi in model.graph.value_info:
        vi.name = new(vi.name)


@pytest.mark.parametrize(
    "name", ["llama_lora_qv_r4_torchscript", "gpt2_lora_cattn_r4_dynamo", "opt_optimum_past", "mistral_dynamo"]
)
def test_names_carry_no_meaning(name, tmp_path):
    model = onnx.load(str(FIXTURES / f"{name}.onnx"))
    _scramble_names(model)
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    assert load_onnx(path) == load_onnx(FIXTURES / f"{name}.onnx")


def _save_external(name: str, tmp_path: Path) -> Path:
    model = onnx.load(str(FIXTURES / f"{name}.onnx"))
    path = tmp_path / f"{name}.onnx"
    onnx.save(
        model,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=f"{name}.onnx.data",
        size_threshold=1024,
    )
    assert (tmp_path / f"{name}.onnx.data").stat().st_size > 0
    return path


@pytest.mark.parametrize("name", ["llama_lora_qkvo_r8_dynamo", "mistral_optimum_past", "opt_lora_qv_r4_torchscript"])
def test_external_data_absent_imports(name, tmp_path):
    path = _save_external(name, tmp_path)
    (tmp_path / f"{name}.onnx.data").unlink()
    model = load_onnx(path)
    reference = load_onnx(FIXTURES / f"{name}.onnx")
    if not sidecar(name)["tie_word_embeddings"]:
        assert model == reference
    else:
        # A head stored as a copy of the embedding cannot be compared without
        # its bytes: it counts as untied (documented in onnx_import).
        assert not model.tie_word_embeddings
        assert model.base_params == reference.base_params + model.vocab_size * model.hidden_size
        assert model.layers == reference.layers


def test_external_data_present_still_detects_tied_copy(tmp_path):
    path = _save_external("gpt2_torchscript", tmp_path)
    assert load_onnx(path).tie_word_embeddings


def test_tied_head_through_transpose_needs_no_bytes(tmp_path):
    # optimum rewires a tied head to Transpose(embedding): tied from structure alone.
    path = _save_external("gpt2_optimum", tmp_path)
    (tmp_path / "gpt2_optimum.onnx.data").unlink()
    assert load_onnx(path).tie_word_embeddings


def _assert_input_error(path: Path):
    with pytest.raises(InputError) as info:
        load_onnx(path)
    assert str(path) in str(info.value)
    assert info.value.where == str(path)
    assert "\n" not in str(info.value)
    return info.value


def test_missing_file(tmp_path):
    err = _assert_input_error(tmp_path / "nope.onnx")
    assert "no such ONNX model" in err.problem


def test_directory(tmp_path):
    _assert_input_error(tmp_path)


def test_garbage_bytes(tmp_path):
    path = tmp_path / "garbage.onnx"
    path.write_bytes(b"this is definitely not a protobuf \x00\xff\xfe" * 50)
    _assert_input_error(path)


def test_empty_file(tmp_path):
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    _assert_input_error(path)


@pytest.mark.parametrize("fraction", [0.3, 0.6, 0.97])
def test_truncated_file(tmp_path, fraction):
    data = (FIXTURES / "llama_torchscript.onnx").read_bytes()
    path = tmp_path / "truncated.onnx"
    path.write_bytes(data[: int(len(data) * fraction)])
    _assert_input_error(path)


def test_graph_without_decoder(tmp_path):
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 3], [0.0] * 12)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])], "mlp", [x], [y], [w]
    )
    path = tmp_path / "mlp.onnx"
    onnx.save(helper.make_model(graph), str(path))
    err = _assert_input_error(path)
    assert "no decoder layers" in err.problem


def test_unsupported_attention_variant(tmp_path):
    model = onnx.load(str(FIXTURES / "llama_torchscript.onnx"))
    softmax = next(n for n in model.graph.node if n.op_type == "Softmax")
    w, b = (t.name for t in model.graph.initializer[:2])
    fused = onnx.helper.make_node("Attention", [softmax.input[0], w, b], ["y"], domain="com.microsoft", num_heads=4)
    model.graph.node.insert(list(model.graph.node).index(softmax), fused)
    model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    path = tmp_path / "fused.onnx"
    onnx.save(model, str(path))
    err = _assert_input_error(path)
    assert "unsupported attention" in err.problem


def test_no_weights_is_input_error(tmp_path):
    model = onnx.load(str(FIXTURES / "opt_torchscript.onnx"))
    del model.graph.initializer[:]
    path = tmp_path / "stripped.onnx"
    onnx.save(model, str(path))
    _assert_input_error(path)


def test_lm_head_role_and_counts_consistent():
    model = load_onnx(FIXTURES / "llama_torchscript.onnx")
    q = model.layers[0].linear(Role.Q)
    assert (q.in_features, q.out_features) == (32, 32)
    assert model.layers[0].linear(Role.GATE).out_features == 88
    assert model.lm_head_params == model.vocab_size * model.hidden_size


def test_copy_in_place_is_independent(tmp_path):
    # The frontend reads the path it is given, not siblings: a copy imports identically under its own name.
    target = tmp_path / "renamed.onnx"
    shutil.copyfile(FIXTURES / "gpt2_dynamo.onnx", target)
    model = load_onnx(target)
    assert model.name == "renamed"
    assert model.layers == load_onnx(FIXTURES / "gpt2_dynamo.onnx").layers


def test_weights_behind_explicit_transpose(tmp_path):
    # Un-folded exports keep torch's [out, in] layout and transpose in the graph.
    from onnx import numpy_helper

    model = onnx.load(str(FIXTURES / "llama_lora_qv_r4_torchscript.onnx"))
    inits = {t.name: t for t in model.graph.initializer}
    nodes = []
    for node in model.graph.node:
        if node.op_type == "MatMul" and node.input[1] in inits and len(inits[node.input[1]].dims) == 2:
            weight = inits[node.input[1]]
            stored = numpy_helper.from_array(numpy_helper.to_array(weight).T.copy(), weight.name + "_oi")
            model.graph.initializer.append(stored)
            nodes.append(onnx.helper.make_node("Transpose", [stored.name], [weight.name + "_t"], perm=[1, 0]))
            node.input[1] = weight.name + "_t"
        nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    path = tmp_path / "transposed.onnx"
    onnx.save(model, str(path))
    reference = load_onnx(FIXTURES / "llama_lora_qv_r4_torchscript.onnx")
    got = load_onnx(path)
    assert got.layers == reference.layers
    assert got.base_params == reference.base_params and got.lora_params == reference.lora_params


def _fused_attention_decoder(path: Path, *, parallel: bool = False, rope: bool = True) -> None:
    """3 layers, hidden 64, 8 query heads, 2 kv heads, MLP 96, vocabulary 100 (``decoders.fused_decoder``)."""
    onnx.save(fused_decoder(parallel=parallel, rope=rope), str(path))


def test_fused_attention_op_and_opset23_ops(tmp_path):
    path = tmp_path / "fused.onnx"
    _fused_attention_decoder(path)
    model = load_onnx(path)
    assert model.num_layers == 3 and model.hidden_size == 64 and model.vocab_size == 100
    att = model.attention
    assert (att.num_heads, att.num_kv_heads, att.head_dim) == (8, 2, 8)
    layer = model.layers[0]
    assert [lin.role.value for lin in layer.linears] == ["q", "k", "v", "o", "fc1", "fc2"]
    assert layer.norm == "rmsnorm" and layer.activation == "gelu_new"
    assert model.positional == Positional.ROPE and not model.tie_word_embeddings
    assert model.source == "onnx"


def test_parallel_attention_mlp_is_read_as_parallel_blocks(tmp_path):
    """GPT-J style: the MLP reads the attention's normed input (the block's second norm is computed and unused)."""
    path = tmp_path / "parallel.onnx"
    _fused_attention_decoder(path, parallel=True)
    model = load_onnx(path)
    assert all(layer.parallel and layer.num_norms == 1 for layer in model.layers)
    _fused_attention_decoder(path)
    assert not any(layer.parallel for layer in load_onnx(path).layers)


def test_unknown_position_encoding_is_rejected(tmp_path):
    path = tmp_path / "nopos.onnx"
    _fused_attention_decoder(path, rope=False)
    err = _assert_input_error(path)
    assert "position encoding" in err.problem


def test_local_functions_are_inlined(tmp_path):
    # Exporters may wrap modules in model-local functions; the frontend inlines them first.
    from onnx import helper

    path = tmp_path / "plain.onnx"
    _fused_attention_decoder(path)
    model = onnx.load(str(path))
    body = helper.make_node("Gelu", ["x"], ["y"], approximate="tanh")
    model.functions.append(helper.make_function("local", "Act", ["x"], ["y"], [body], [helper.make_opsetid("", 23)]))
    model.opset_import.append(helper.make_opsetid("local", 1))
    for node in model.graph.node:
        if node.op_type == "Gelu":
            node.op_type, node.domain = "Act", "local"
            del node.attribute[:]
    wrapped = tmp_path / "wrapped.onnx"
    onnx.save(model, str(wrapped))
    assert load_onnx(wrapped).layers == load_onnx(path).layers
