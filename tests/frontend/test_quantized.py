"""Quantized ONNX files: QDQ, MatMulNBits and MatMulInteger weights read as the file stores them.

The fixtures (``tests/fixtures/make_quantized.py``) are the tiny Llama export quantized by ONNX
Runtime's own tools. Decoding is checked against ONNX Runtime itself, op by op on single-node graphs,
and end to end by ``primal check`` (the exact replay against ONNX Runtime on the same file).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from primal_compiler.errors import InputError
from primal_compiler.frontend import onnx_quant, quant_codes
from primal_compiler.frontend.onnx_import import load_onnx
from primal_compiler.frontend.onnx_weights import load_onnx_weights
from primal_compiler.ir.model import Role
from primal_compiler.ir.quant import WeightQuant

ort = pytest.importorskip("onnxruntime")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "onnx"
QUANTIZED = FIXTURES / "quantized"
BASE = FIXTURES / "llama_dynamo.onnx"
#: What each fixture stores: 15 projections (7 per layer and the LM head) in one format.
FORMATS = {
    "llama_nbits4_sym": WeightQuant("MatMulNBits", 4, 32, False, 15),
    "llama_nbits4_asym_b16": WeightQuant("MatMulNBits", 4, 16, True, 15),
    "llama_nbits8_asym": WeightQuant("MatMulNBits", 8, 32, True, 15),
    "llama_qdq4_asym": WeightQuant("DequantizeLinear", 4, 32, True, 15),
    "llama_dynamic_int8": WeightQuant("MatMulInteger", 8, 0, True, 15),
    "llama_dynamic_int8_per_channel": WeightQuant("MatMulInteger", 8, 0, True, 15),
    "llama_fake_quant_int8": WeightQuant("DequantizeLinear", 8, 0, True, 15),
}


@pytest.fixture(scope="module")
def target():
    from primal_compiler.target import load_primal_target

    return load_primal_target("primal-7nm")


def test_every_fixture_is_listed_and_small():
    assert sorted(p.stem for p in QUANTIZED.glob("*.onnx")) == sorted(FORMATS)
    assert sum(p.stat().st_size for p in QUANTIZED.glob("*.onnx")) < 1024 * 1024
    for name in FORMATS:
        assert json.loads((QUANTIZED / f"{name}.json").read_text())["base"] == BASE.name


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_a_quantized_file_imports_as_its_base_architecture_with_its_format(name):
    base, model = load_onnx(BASE), load_onnx(QUANTIZED / f"{name}.onnx")
    assert model.weight_quant == (FORMATS[name],)
    assert replace(model, name=base.name, source=base.source, weight_quant=()) == base


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_dequantized_weights_are_close_to_the_float_weights(name):
    """The quantized weights are within one quantization step of the base file's (and are not them: a
    symmetric quantizer may clip its largest value by up to a step)."""
    base, q = load_onnx_weights(BASE), load_onnx_weights(QUANTIZED / f"{name}.onnx")
    for key, p in base.projections.items():
        got = q.projections[key]
        assert got.stored is not None and got.stored.bits == FORMATS[name].bits
        err = np.abs(got.w - p.w)
        assert err.max() > 0 and (err <= np.abs(got.stored.scale) * (1 + 1e-5)).all(), key
        if got.stored.codes is not None:
            np.testing.assert_allclose(got.stored.codes * got.stored.scale, got.w, rtol=1e-6, atol=1e-7)


def _run_single(node, inits, outputs, opset=21, inputs=None, feeds=None):
    graph = helper.make_graph([node], "g", inputs or [], [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                                                          for o in outputs], inits)
    domains = [helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=domains, ir_version=10)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds or {})[0]


def _reader(inits):
    table = {t.name: t for t in inits}
    return lambda name: numpy_helper.to_array(table[name])


@pytest.mark.parametrize("bits,block,k,zp", [(4, 16, 40, "packed"), (4, 32, 32, None), (8, 32, 88, "packed"),
                                             (2, 16, 48, "packed"), (4, 128, 200, "float"), (8, 64, 64, None)])
def test_matmulnbits_decodes_as_onnxruntime_multiplies(bits, block, k, zp):
    rng = np.random.default_rng(bits * block + k)
    n, blocks = 6, -(-k // block)
    codes = rng.integers(0, 1 << bits, size=(n, blocks * block))
    per = 8 // bits
    packed = (codes.reshape(n, -1, per) << (np.arange(per) * bits)).sum(axis=2).astype(np.uint8)
    scales = rng.uniform(0.01, 0.1, size=(n, blocks)).astype(np.float32)
    inits = [numpy_helper.from_array(packed.reshape(n, blocks, -1), "B"), numpy_helper.from_array(scales, "S")]
    names = ["A", "B", "S"]
    if zp == "packed":
        z = rng.integers(0, 1 << bits, size=(n, -(-blocks // per) * per))
        zb = (z.reshape(n, -1, per) << (np.arange(per) * bits)).sum(axis=2).astype(np.uint8)
        inits.append(numpy_helper.from_array(zb, "Z"))
        names.append("Z")
    elif zp == "float":
        inits.append(numpy_helper.from_array(rng.uniform(0, 15, size=(n, blocks)).astype(np.float32), "Z"))
        names.append("Z")
    node = helper.make_node("MatMulNBits", names, ["Y"], domain="com.microsoft", K=k, N=n, bits=bits,
                            block_size=block)
    eye = np.eye(k, dtype=np.float32)  # A = I makes onnxruntime print the dequantized weight, K x N
    want = _run_single(node, inits, ["Y"], inputs=[helper.make_tensor_value_info("A", TensorProto.FLOAT, [k, k])],
                       feeds={"A": eye})
    spec = quant_codes.QuantWeight("MatMulNBits", "n", "B", "S", "Z" if zp else "", 0, block, bits, k, n)
    got = quant_codes.decode(spec, _reader(inits))
    np.testing.assert_allclose(got.w, want, rtol=1e-6, atol=1e-7)
    assert (got.codes is None) == (zp == "float")


@pytest.mark.parametrize("dtype,axis,block,per", [
    (TensorProto.INT8, 1, 0, "tensor"), (TensorProto.UINT8, 1, 0, "axis"), (TensorProto.INT8, 0, 0, "axis"),
    (TensorProto.INT4, 0, 32, "block"), (TensorProto.UINT4, 0, 16, "block"), (TensorProto.INT16, 1, 0, "axis"),
    (TensorProto.UINT8, 1, 8, "block"),
])
def test_dequantize_linear_decodes_as_onnxruntime_does(dtype, axis, block, per):
    rng = np.random.default_rng(dtype * 10 + axis)
    lo, hi = quant_codes.CODE_RANGE[dtype]
    dims = (40, 24)
    codes = rng.integers(lo, hi + 1, size=dims)
    if per == "block":
        shape = tuple(-(-d // block) if i == axis else d for i, d in enumerate(dims))
    else:
        shape = () if per == "tensor" else (dims[axis],)
    scale = rng.uniform(0.01, 0.1, size=shape).astype(np.float32)
    zp = rng.integers(lo, hi + 1, size=shape)
    inits = [helper.make_tensor("C", dtype, dims, codes.reshape(-1).tolist()),
             numpy_helper.from_array(scale, "S"), helper.make_tensor("Z", dtype, list(shape), zp.reshape(-1).tolist())]
    attrs = {"axis": axis, **({"block_size": block} if block else {})}
    want = _run_single(helper.make_node("DequantizeLinear", ["C", "S", "Z"], ["Y"], **attrs), inits, ["Y"])
    spec = quant_codes.QuantWeight("DequantizeLinear", "n", "C", "S", "Z", axis, block, quant_codes.CODE_BITS[dtype],
                                  code_type=dtype)
    np.testing.assert_allclose(quant_codes.decode(spec, _reader(inits)).w, want, rtol=1e-6, atol=1e-7)


def test_quantize_then_dequantize_of_a_float_constant_folds_as_onnxruntime_computes_it():
    rng = np.random.default_rng(7)
    w = rng.normal(size=(16, 8)).astype(np.float32)
    scale = (np.abs(w).max(axis=0) / 100).astype(np.float32)  # some codes saturate? no: 127 > 100
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(scale, "S"),
             numpy_helper.from_array(np.full(8, 3, np.int8), "Z")]
    graph = helper.make_graph([helper.make_node("QuantizeLinear", ["W", "S", "Z"], ["Q"], axis=1),
                               helper.make_node("DequantizeLinear", ["Q", "S", "Z"], ["Y"], axis=1)], "g", [],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {})[0]
    table = onnx_quant.dequantize_graph(model)
    assert list(table.weights) == ["Y"] and len(model.graph.node) == 0  # both nodes folded away
    np.testing.assert_allclose(quant_codes.decode(table.weights["Y"], _reader(inits)).w, want, rtol=1e-6)


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_exact_replay_matches_onnxruntime_on_the_file(name, target):
    from primal_compiler.report.check import check_onnx

    info = check_onnx(str(QUANTIZED / f"{name}.onnx"), target)
    assert info["verdict"] == "OK" and info["relative_error"] < 1e-5, info
    dynamic = FORMATS[name].dynamic_inputs
    assert (info["runtime_quantization"] is not None) == dynamic
    if dynamic:  # onnxruntime's own run quantizes the activations: measurably away, but not wildly
        assert 1e-4 < info["runtime_quantization"]["moves_logits_by"] < 0.5


def test_the_check_catches_a_zero_point_off_by_one(target, monkeypatch):
    from primal_compiler.frontend import onnx_tensors
    from primal_compiler.report.check import check_onnx

    def off_by_one(spec, read):
        d = quant_codes.decode(spec, read)
        return quant_codes.Decoded(d.w + d.scale, d.codes, d.scale, d.bits)

    monkeypatch.setattr(onnx_tensors, "decode", off_by_one)
    info = check_onnx(str(QUANTIZED / "llama_nbits4_asym_b16.onnx"), target)
    assert info["verdict"] == "MISMATCH"


def _edited(tmp_path: Path, name: str, edit) -> Path:
    model = onnx.load(QUANTIZED / f"{name}.onnx")
    edit(model)
    path = tmp_path / f"{name}_edited.onnx"
    onnx.save(model, path)
    return path


def _first(model, op):
    return next(n for n in model.graph.node if n.op_type == op)


def _set_attr(node, name, value):
    next(a for a in node.attribute if a.name == name).i = value


def _activation_qdq(model):
    mm = next(i for i, n in enumerate(model.graph.node) if n.op_type == "MatMul" and n.input[1].endswith("_output"))
    node = model.graph.node[mm]
    model.graph.initializer.extend([numpy_helper.from_array(np.array(0.05, np.float32), "act_s"),
                                    numpy_helper.from_array(np.array(128, np.uint8), "act_zp")])
    q = helper.make_node("QuantizeLinear", [node.input[0], "act_s", "act_zp"], ["act_q"], name="act_quant")
    model.graph.initializer.append(numpy_helper.from_array(np.array(0.1, np.float32), "act_s2"))
    dq = helper.make_node("DequantizeLinear", ["act_q", "act_s2", "act_zp"], ["act_dq"], name="act_dequant")
    node.input[0] = "act_dq"
    model.graph.node.insert(mm, dq)
    model.graph.node.insert(mm, q)


def _float8_codes(model):
    node = _first(model, "DequantizeLinear")
    codes = next(t for t in model.graph.initializer if t.name == node.input[0])
    codes.CopyFrom(helper.make_tensor(codes.name, TensorProto.FLOAT8E4M3FN, list(codes.dims),
                                      np.zeros(int(np.prod(codes.dims)), np.float32).tolist()))
    del node.input[2:]


def _gidx(model):
    _first(model, "MatMulNBits").input.extend(["", "gidx"])
    model.graph.initializer.append(numpy_helper.from_array(np.zeros(32, np.int32), "gidx"))


@pytest.mark.parametrize("name,edit,problem", [
    ("llama_nbits4_sym", lambda m: _set_attr(_first(m, "MatMulNBits"), "block_size", 24),
     "node node_linear_Q4: MatMulNBits block_size 24 is not supported (a power of two, at least 16)"),
    ("llama_nbits4_sym", lambda m: _set_attr(_first(m, "MatMulNBits"), "bits", 3),
     "node node_linear_Q4: MatMulNBits with bits=3 is not supported (2, 4 or 8)"),
    ("llama_nbits4_sym", _gidx, "node node_linear_Q4: MatMulNBits with g_idx (act-order) is not supported"),
    ("llama_nbits4_sym", lambda m: _set_attr(_first(m, "MatMulNBits"), "K", 64),
     "node node_linear_Q4: MatMulNBits input 'val_43_Q4' has 512 elements, K=64, N=32, bits=4, block_size=32 "
     "need 1024"),
    ("llama_qdq4_asym", _float8_codes, "DequantizeLinear of FLOAT8E4M3FN codes is not supported"),
    ("llama_qdq4_asym", _activation_qdq, "quantized activations: node act_quant (QuantizeLinear) quantizes the "
                                         "computed tensor"),
])
def test_an_unsupported_quantization_is_one_line_naming_the_node(tmp_path, name, edit, problem):
    path = _edited(tmp_path, name, edit)
    with pytest.raises(InputError) as err:
        load_onnx(path)
    assert problem in str(err.value) and "\n" not in str(err.value)


def test_the_command_line_refuses_an_unsupported_quantization_in_one_line(tmp_path):
    path = _edited(tmp_path, "llama_nbits4_sym", lambda m: _set_attr(_first(m, "MatMulNBits"), "block_size", 24))
    out = subprocess.run([sys.executable, "-m", "primal_compiler.cli", "inspect", str(path)], capture_output=True,
                         text=True)
    assert out.returncode == 2 and out.stdout == "" and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and str(path) in out.stderr and "block_size 24" in out.stderr


def test_inspect_reports_the_file_quantization(capsys):
    from primal_compiler.cli import main

    main(["inspect", str(QUANTIZED / "llama_dynamic_int8.onnx"), "--json"])
    info = json.loads(capsys.readouterr().out)
    assert info["weight_quant"] == [{"op": "MatMulInteger", "bits": 8, "group": 0, "zero_points": True,
                                     "projections": 15, "dynamic_inputs": True,
                                     "description": FORMATS["llama_dynamic_int8"].describe()}]
    main(["inspect", str(QUANTIZED / "llama_nbits4_sym.onnx")])
    assert ("file quantization: 15 projections MatMulNBits 4-bit, blocks of 32 rows, no zero points"
            in capsys.readouterr().out)


def test_shape_only_import_decodes_no_weight(monkeypatch):
    def refuse(spec, read):
        raise AssertionError("decoded a weight")

    from primal_compiler.frontend import onnx_tensors

    monkeypatch.setattr(quant_codes, "decode", refuse)
    monkeypatch.setattr(onnx_tensors, "decode", refuse)
    assert load_onnx(QUANTIZED / "llama_nbits8_asym.onnx").layers[0].linear(Role.DOWN).in_features == 88


def test_quantized_weights_in_external_data_decode_and_a_missing_file_is_named(tmp_path, target):
    from primal_compiler.report.check import check_onnx

    model = onnx.load(QUANTIZED / "llama_dynamic_int8.onnx")
    path = tmp_path / "ext.onnx"
    onnx.save(model, path, save_as_external_data=True, location="ext.data", size_threshold=256)
    assert check_onnx(str(path), target)["verdict"] == "OK"
    (tmp_path / "ext.data").rename(tmp_path / "moved.data")
    assert load_onnx(path).weight_quant == (FORMATS["llama_dynamic_int8"],)  # shapes need no weight bytes
    with pytest.raises(InputError, match=r"initializer '.*' is in external data file 'ext.data', which is absent"):
        load_onnx_weights(path)


def test_a_quantize_static_export_is_read_as_stored(tmp_path, target):
    """ONNX Runtime's quantize_static (QDQ, int8 activations and weights, every constant too) on the family
    decoder: each activation's QuantizeLinear/DequantizeLinear pair is read as the float it rounds, the weights
    and constants as the file stores them (its RoPE frequencies rounded to int8, the last to zero), and the
    replay matches onnxruntime on the float-activation twin (refused before); the file's own run is reported
    beside it."""
    from primal_compiler.report.check import check_onnx, render_check
    pytest.importorskip("onnxruntime")
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    from tests.frontend.families import family_decoder

    class Calibration(CalibrationDataReader):
        def __init__(self) -> None:
            self.left = 2

        def get_next(self):
            self.left -= 1
            if self.left < 0:
                return None
            ids = np.random.default_rng(self.left).integers(0, 64, (1, 5)).astype(np.int64)
            return {"input_ids": ids, "position_ids": np.arange(5, dtype=np.int64)[None]}

    onnx.save(family_decoder(), str(tmp_path / "float.onnx"))
    quantize_static(str(tmp_path / "float.onnx"), str(tmp_path / "static.onnx"), Calibration(),
                    quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
    model = load_onnx(str(tmp_path / "static.onnx"))
    assert model.static_activations > 100 and model.weight_quant[0].op == "DequantizeLinear"
    assert model.rope_inv_freq[-1] == 0.0 and model.rope_inv_freq[0] == 1.0
    info = check_onnx(str(tmp_path / "static.onnx"), target)
    assert info["verdict"] == "OK" and info["relative_error"] < 1e-5, info
    assert info["runtime_quantization"]["static"] and info["runtime_quantization"]["moves_logits_by"] > 1e-3
    assert "rounds them at the file's calibrated scales" in render_check(info)
