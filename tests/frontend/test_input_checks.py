"""What the frontend refuses up front, each in one line: odd files, graphs onnx's checker rejects, cycles,
absurd sizes, values that are not numbers (issue 21)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from safetensors.numpy import load_file, save_file

from primal_compiler import cli
from primal_compiler.errors import InputError
from primal_compiler.frontend import load_model, onnx_check, onnx_graph
from primal_compiler.frontend.builtin import BUILTIN, ArchConfig, build_model
from primal_compiler.frontend.onnx_import import load_onnx, recognise_onnx
from primal_compiler.frontend.onnx_weights import load_onnx_weights
from primal_compiler.frontend.peft import load_peft_adapter
from primal_compiler.inputs import ONNX_LIMIT_BYTES
from primal_compiler.ir.model import SIZE_LIMITS, Role
from tests.frontend.decoders import fused_decoder
from tests.frontend.test_weights import write_adapter

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "onnx"
LLAMA_LORA = FIXTURES / "llama_lora_qv_r4_torchscript.onnx"


def refused(call, *args, where: str | os.PathLike | None = None) -> InputError:
    with pytest.raises(InputError) as info:
        call(*args)
    err = info.value
    assert "\n" not in str(err) and err.problem
    if where is not None:
        assert err.where == str(where), str(err)
    return err


def save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, str(path))
    return path


# --------------------------------------------------------------------------- files that are not ONNX files


def test_devices_fifos_directories_and_oversized_files_are_refused_without_reading(tmp_path):
    fifo = tmp_path / "f.onnx"
    os.mkfifo(fifo)
    sparse = tmp_path / "huge.onnx"
    with open(sparse, "wb") as f:
        f.truncate(ONNX_LIMIT_BYTES + 1)  # sparse: nothing is written, nothing may be read
    cases = {"/dev/zero": "is a device or socket", fifo: "is a FIFO", tmp_path: "is a directory",
             sparse: f"may be at most {ONNX_LIMIT_BYTES:,} bytes"}
    for path, message in cases.items():
        start = time.monotonic()
        err = refused(load_model, str(path), where=path)
        assert message in err.problem and time.monotonic() - start < 1


def test_paths_the_system_refuses_are_input_errors():
    long = "m" * 5000
    assert "unknown built-in model" in refused(load_model, long, where=long).problem
    assert "File name too long" in refused(load_model, long + ".onnx").problem
    assert "File name too long" in refused(load_peft_adapter, long, where=long).problem
    assert refused(load_peft_adapter, "", where="''").problem == "empty path where a PEFT adapter directory was expected"


@pytest.mark.parametrize("kind", ["device", "fifo"])
def test_inspect_ends_in_one_line_for_dev_zero_and_a_fifo(tmp_path, kind):
    path = "/dev/zero"
    if kind == "fifo":
        path = str(tmp_path / "f.onnx")
        os.mkfifo(path)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "primal_compiler.cli", "inspect", path], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(f"primal: {path}: is a ")
    assert time.monotonic() - start < 20  # the interpreter's start; the refusal itself is a stat call


def test_external_data_that_is_not_a_regular_file_is_refused(tmp_path):
    # gpt2_torchscript stores its tied head as a copy: the importer samples both tables' bytes.
    path = tmp_path / "gpt2.onnx"
    onnx.save(onnx.load(str(FIXTURES / "gpt2_torchscript.onnx")), str(path), save_as_external_data=True,
              all_tensors_to_one_file=True, location="w.data", size_threshold=1024)
    (tmp_path / "w.data").unlink()
    os.mkfifo(tmp_path / "w.data")
    err = refused(load_onnx, path, where=tmp_path / "w.data")
    assert "is a FIFO" in err.problem
    (tmp_path / "w.data").unlink()
    (tmp_path / "w.data").mkdir()
    assert "is a directory" in refused(load_onnx_weights, path, where=tmp_path / "w.data").problem


def test_external_reads_are_bounded_by_the_tensor_shape(tmp_path):
    path = tmp_path / "llama.onnx"
    onnx.save(onnx.load(str(LLAMA_LORA)), str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location="w.data", size_threshold=0)
    model = onnx.load(str(path), load_external_data=False)
    for tensor in model.graph.initializer:  # no lengths: each read takes what the shape needs, not the file's rest
        kept = [e for e in tensor.external_data if e.key != "length"]
        del tensor.external_data[:]
        tensor.external_data.extend(kept)
    save(model, path)
    inline = load_onnx_weights(LLAMA_LORA).projections
    assert all(np.array_equal(p.w, inline[k].w) for k, p in load_onnx_weights(path).projections.items())
    name = recognise_onnx(path).projections[(0, Role.Q)].weight
    tensor = next(t for t in model.graph.initializer if t.name == name)
    tensor.external_data.add(key="length", value=str(1 << 30))
    err = refused(load_onnx_weights, save(model, path), where=path)
    assert err.problem.endswith(f"has 1,073,741,824 bytes of external data, its shape needs {32 * 32 * 4:,}")


@pytest.mark.parametrize("location", ["/dev/zero", "../w.data", "a/../../w.data", ""])
def test_external_data_outside_the_model_directory_is_refused(tmp_path, location):
    model = fused_decoder(external=True)
    del model.graph.initializer[3].external_data[:]
    model.graph.initializer[3].external_data.add(key="location", value=location)
    path = save(model, tmp_path / "m.onnx")
    err = refused(load_onnx, path, where=path)
    assert ("outside the model's directory" if location else "names no file") in err.problem


def test_a_name_that_is_not_utf8_is_refused(tmp_path):
    # Found by the fuzz: protobuf hands such a name back as bytes, and building the checker's probe failed.
    data = bytearray(fused_decoder(external=True).SerializeToString())
    data[data.rfind(b"l0_Wq")] = 0x9D  # the initializer's own name
    path = tmp_path / "bad.onnx"
    path.write_bytes(bytes(data))
    err = refused(load_onnx, path, where=path)
    assert err.problem == "not a readable ONNX model (a name is not UTF-8 text: b'\\x9d0_Wq')"


# --------------------------------------------------------------------------- graphs onnx's checker rejects, cycles


def test_a_cycle_is_refused_naming_a_node_on_it(tmp_path):
    model = fused_decoder(layers=2)
    nodes = model.graph.node
    add = next(n for n in nodes if n.output[0] == "l0_h1")  # h1 = h0 + o  ->  h1 = h2 + o: a loop over layer 0
    add.input[0] = "l0_h2"
    err = refused(load_onnx, save(model, tmp_path / "cyclic.onnx"))
    assert err.problem.startswith("the graph has a cycle: node #")
    named = int(err.problem.split("#")[1].split()[0])
    assert nodes[named].output[0].startswith("l0_")  # on the loop, not a node of layer 1 merely after it
    assert "l1_" not in nodes[named].output[0]


def test_graphs_the_checker_rejects_are_refused_with_its_message(tmp_path):
    model = onnx.load(str(LLAMA_LORA))
    relu = next(n for n in model.graph.node if n.op_type == "Softmax")
    relu.op_type = "Foo"
    err = refused(load_onnx, save(model, tmp_path / "foo.onnx"))
    assert err.problem.startswith("rejected by onnx's checker: No Op registered for Foo")
    unsorted = fused_decoder()
    nodes = list(unsorted.graph.node)
    del unsorted.graph.node[:]
    unsorted.graph.node.extend(reversed(nodes))
    assert "topologically sorted" in refused(load_onnx, save(unsorted, tmp_path / "unsorted.onnx")).problem
    bad_shape = fused_decoder()
    w = next(t for t in bad_shape.graph.initializer if t.name == "l0_W2")
    w.CopyFrom(helper.make_tensor("l0_W2", onnx.TensorProto.FLOAT, [95, 64], [0.0] * 95 * 64))
    assert "ShapeInferenceError" in refused(load_onnx, save(bad_shape, tmp_path / "shape.onnx")).problem


def test_a_projection_serving_two_layers_is_refused(tmp_path):
    # Layer 1's attention reads its keys from layer 0's output projection (and has no key projection of its own):
    # before, layer 1 imported with two k projections and no o, and the mapping died with an AttributeError.
    model = fused_decoder(layers=2)
    nodes = [n for n in model.graph.node if n.output[0] not in ("l1_k", "l1_kr")]
    next(n for n in nodes if n.output[0] == "l1_a").input[1] = "l0_o"
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    model.graph.initializer.remove(next(t for t in model.graph.initializer if t.name == "l1_Wk"))
    err = refused(load_onnx, save(model, tmp_path / "shared.onnx"))
    assert err.problem == "unsupported structure: one 64x64 projection serves layer 0 and layer 1"


def test_layers_that_differ_in_attention_geometry_are_refused(tmp_path):
    err = refused(load_onnx, save(fused_decoder(layers=2, kv_heads=(2, 4)), tmp_path / "mixed.onnx"))
    assert err.problem == ("unsupported model: its layers differ in attention geometry (8 heads, 2 kv heads, head "
                           "size 8; 8 heads, 4 kv heads, head size 8)")


def test_the_checker_does_not_need_external_data(tmp_path):
    absent = load_onnx(save(fused_decoder(external=True), tmp_path / "absent.onnx"))
    assert absent.layers == load_onnx(save(fused_decoder(), tmp_path / "inline.onnx")).layers


def _functions(model: onnx.ModelProto, depth: int, recursive: bool = False) -> onnx.ModelProto:
    """Each Gelu followed by a call of local function f0; f_k calls f_(k+1) twice (2^depth Identities inlined)."""
    opset = [helper.make_opsetid("", 23), helper.make_opsetid("local", 1)]
    for k in range(depth):
        callee = f"f{0 if recursive else k + 1}" if k + 1 < depth or recursive else None
        body = ([helper.make_node(callee, ["x"], ["t"], domain="local"), helper.make_node(callee, ["t"], ["y"],
                                                                                          domain="local")]
                if callee else [helper.make_node("Identity", ["x"], ["y"])])
        model.functions.append(helper.make_function("local", f"f{k}", ["x"], ["y"], body, opset))
    model.opset_import.append(helper.make_opsetid("local", 1))
    nodes = []
    for node in model.graph.node:
        nodes.append(node)
        if node.op_type == "Gelu":
            out = node.output[0]
            node.output[0] = out + "_gelu"
            nodes.append(helper.make_node("f0", [out + "_gelu"], [out], domain="local"))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


def test_local_functions_are_counted_as_inlined_and_may_not_recurse(tmp_path):
    assert load_onnx(save(_functions(fused_decoder(), 3), tmp_path / "f3.onnx")).num_layers == 3
    err = refused(load_onnx, save(_functions(fused_decoder(), 24), tmp_path / "f24.onnx"))
    assert err.problem == f"has over {onnx_check.MAX_NODES:,} nodes (local functions inlined), the most the " \
                          "frontend accepts (docs/frontend.md)"
    err = refused(load_onnx, save(_functions(fused_decoder(), 2, recursive=True), tmp_path / "rec.onnx"))
    assert err.problem == "local function local.f0 calls itself"


def test_node_and_walk_limits(tmp_path, monkeypatch):
    monkeypatch.setattr(onnx_check, "MAX_NODES", 100)
    assert "has over 100 nodes" in refused(load_onnx, LLAMA_LORA).problem
    monkeypatch.undo()
    monkeypatch.setattr(onnx_graph, "WALK_LIMIT", 100)
    assert "graph too irregular to recognise" in refused(load_onnx, LLAMA_LORA).problem


# --------------------------------------------------------------------------- absurd sizes


@pytest.mark.parametrize("dims, message", [
    ({"hidden": 10**7}, "hidden size 10,000,000 is over the limit of 65,536"),
    ({"inter": 10**12}, "projection width 1,000,000,000,000 is over the limit of 262,144"),
    ({"vocab": 2**40}, "vocabulary 1,099,511,627,776 is over the limit of 2,097,152"),
    ({"hidden": 16384, "heads": 2048, "kv_heads": 2048}, "attention heads 2,048 is over the limit of 1,024"),
    ({"layers": 1025, "hidden": 8, "heads": 1, "kv_heads": 1, "inter": 8, "vocab": 8},
     "decoder layers 1,025 is over the limit"),
    ({"layers": 16, "hidden": 65536, "heads": 512, "kv_heads": 512, "inter": 262144, "vocab": 2**21},
     "parameters "),
])
def test_absurd_onnx_sizes_are_refused_naming_the_limit(tmp_path, dims, message):
    path = save(fused_decoder(**dims, external=True), tmp_path / "big.onnx")
    start = time.monotonic()
    err = refused(load_model, str(path), where=path)
    assert err.problem.startswith(message) and err.problem.endswith(" (docs/frontend.md)")
    assert time.monotonic() - start < 10


def test_the_limits_admit_the_largest_builtin_and_refuse_absurd_configs():
    big = load_model("llama2-70b")
    assert big.num_layers <= SIZE_LIMITS["decoder layers"] and big.base_params <= SIZE_LIMITS["parameters"]
    llama = BUILTIN["llama2-7b"]
    fields = {f: getattr(llama, f) for f in llama.__dataclass_fields__}
    for change, message in (({"num_layers": 10**12}, "decoder layers 1,000,000,000,000"),
                            ({"hidden_size": 2**40, "num_heads": 1, "num_kv_heads": 1}, "hidden size"),
                            ({"intermediate_size": 10**7}, "projection width 10,000,000"),
                            ({"vocab_size": 10**12}, "vocabulary"),
                            ({"max_position_embeddings": 2**40}, "positions")):
        start = time.monotonic()
        err = refused(build_model, ArchConfig(**(fields | change)), "absurd", where="model absurd")
        assert err.problem.startswith(message) and time.monotonic() - start < 1


# --------------------------------------------------------------------------- values that are not numbers


def _nan_in(path: Path, out: Path, name_of) -> str:
    model = onnx.load(str(path))
    tensor = next(t for t in model.graph.initializer if t.name == name_of(recognise_onnx(path)))
    value = numpy_helper.to_array(tensor).copy()
    value.flat[3] = np.nan
    tensor.CopyFrom(numpy_helper.from_array(value, tensor.name))
    save(model, out)
    return tensor.name


@pytest.mark.parametrize("part", ["w", "lora_a", "embed"])
def test_non_finite_onnx_initializers_are_refused_by_the_weight_reader(tmp_path, part):
    def pick(found):
        p = found.projections[(1, Role.Q)]
        if part == "embed":
            return found.embed_table.name
        return p.weight if part == "w" else found.graph.nodes[p.lora_nodes[0]].input[1]

    path = tmp_path / "nan.onnx"
    name = _nan_in(LLAMA_LORA, path, pick)
    load_onnx(path)  # shapes only: no weight is decoded
    err = refused(load_onnx_weights, path, where=path)
    assert err.problem.endswith(f"initializer {name!r} holds NaN or infinite values")


def test_a_lora_scale_that_is_not_a_number_is_refused(tmp_path):
    model = onnx.load(str(LLAMA_LORA))
    found = recognise_onnx(LLAMA_LORA)
    b = found.graph.nodes[found.projections[(0, Role.Q)].lora_nodes[1]]
    mul = found.graph.nodes[found.graph.consumers[b.output[0]][0]]
    const = next(n for n in model.graph.node if mul.input[1] in n.output)
    const.attribute[0].t.CopyFrom(numpy_helper.from_array(np.array(np.nan, np.float32)))
    assert "is scaled by nan, not a finite number" in refused(load_onnx, save(model, tmp_path / "s.onnx")).problem


def test_a_nan_adapter_is_refused_naming_the_tensor(tmp_path, capsys):
    model = load_onnx(LLAMA_LORA)

    def poison(layer, role, a, b):
        if (layer, role) == (1, Role.V):
            b[0, 2] = np.nan

    write_adapter(tmp_path / "ad", model, rank=4, alpha=8.0, zero=poison)
    weights = tmp_path / "ad" / "adapter_model.safetensors"
    err = refused(load_peft_adapter, tmp_path / "ad", where=weights)
    assert err.problem == "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight holds NaN or infinite values"
    argv = ["run", str(LLAMA_LORA), "--functional", "--weights", str(LLAMA_LORA), "--adapter", str(tmp_path / "ad"),
            "--prompt", "1,2,3", "--generate", "2"]
    assert cli.main(argv) == 2
    assert capsys.readouterr().err == f"primal: {weights}: {err.problem}\n"
    tensors = load_file(str(weights))
    tensors = {k: np.where(np.isnan(v), np.inf, v) for k, v in tensors.items()}
    save_file(tensors, str(weights))
    assert "holds NaN or infinite values" in refused(load_peft_adapter, tmp_path / "ad").problem


@pytest.mark.parametrize("config, message", [
    ({"lora_alpha": -16}, "lora_alpha must be a positive finite number, got -16"),
    ({"lora_alpha": 0}, "lora_alpha must be a positive finite number, got 0"),
    ({"lora_alpha": float("nan")}, "lora_alpha must be a positive finite number, got nan"),
    ({"lora_alpha": float("inf")}, "lora_alpha must be a positive finite number, got inf"),
    ({"lora_alpha": "16"}, "lora_alpha must be a positive finite number, got '16'"),
    ({"r": 0}, "r must be a positive integer, got 0"),
    ({"r": -8}, "r must be a positive integer, got -8"),
    ({"r": True}, "r must be a positive integer, got True"),
    ({"alpha_pattern": {"q_proj": -1}}, "alpha_pattern['q_proj'] must be a positive finite number, got -1"),
    ({"rank_pattern": {"q_proj": 0}}, "rank_pattern['q_proj'] must be a positive integer, got 0"),
    ({"alpha_pattern": {"(a+)+$": 4}}, "alpha_pattern key '(a+)+$' is not a module name"),
    ({"use_rslora": "yes"}, "use_rslora must be true or false, got 'yes'"),
])
def test_adapter_configs_with_values_that_are_not_sane_numbers_are_refused(tmp_path, config, message):
    write_adapter(tmp_path / "ad", load_onnx(LLAMA_LORA), rank=4, config=config)
    err = refused(load_peft_adapter, tmp_path / "ad", where=tmp_path / "ad" / "adapter_config.json")
    assert err.problem.startswith(message), err.problem


def test_alpha_pattern_keys_name_modules(tmp_path):
    model = load_onnx(LLAMA_LORA)
    pattern = {"model.layers.1.self_attn.v_proj": 2.0, "^base_model.model.model.layers.0.self_attn.q_proj": 4.0}
    write_adapter(tmp_path / "ad", model, rank=4, alpha=8.0, config={"alpha_pattern": pattern})
    scales = {k: p.scale for k, p in load_peft_adapter(tmp_path / "ad").lora.items()}
    assert scales == {(0, Role.Q): 1.0, (0, Role.V): 2.0, (1, Role.Q): 2.0, (1, Role.V): 0.5}


def test_adapter_files_that_are_not_regular_or_not_utf8_are_refused(tmp_path):
    directory = tmp_path / "ad"
    write_adapter(directory, load_onnx(LLAMA_LORA), rank=4)
    config, weights = directory / "adapter_config.json", directory / "adapter_model.safetensors"
    text = json.loads(config.read_text())
    config.write_bytes(json.dumps(text).encode() + b" \xff\xfe")
    assert "is not UTF-8 text" in refused(load_peft_adapter, directory, where=config).problem
    config.write_text("[" * 100_000 + "]" * 100_000)
    assert "not readable JSON (RecursionError" in refused(load_peft_adapter, directory, where=config).problem
    config.unlink()
    os.mkfifo(config)
    start = time.monotonic()
    assert "is a FIFO" in refused(load_peft_adapter, directory, where=config).problem
    assert time.monotonic() - start < 1
    config.unlink()
    config.write_text(json.dumps(text))
    weights.unlink()
    weights.mkdir()
    assert "is a directory" in refused(load_peft_adapter, directory, where=weights).problem
    weights.rmdir()
    weights.symlink_to("/dev/zero")
    assert "is a device or socket" in refused(load_peft_adapter, directory, where=weights).problem
