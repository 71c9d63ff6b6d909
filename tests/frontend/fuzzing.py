"""Mutated ONNX decoders for the importer fuzz: small valid models, stacked edits, and what consumes them.

:func:`base_models` holds the serialized bases: three real exporter fixtures
(TorchScript Llama with LoRA, dynamo GPT-2, optimum OPT with LoRA) and the
hand-built opset-23 decoder of ``decoders.fused_decoder``, inline and with
every weight in an absent external-data file (so dimensions can be made huge
without the checker or the disk seeing a byte). :func:`mutants` is a
hypothesis strategy of ``(base name, file bytes)`` made by up to four stacked
edits of the graph (dimensions set to 0, negative or huge; nodes dropped,
duplicated, swapped or bypassed; inputs rewired to later outputs, which
makes cycles; op types, domains, attributes, dtypes and small constants
changed; a NaN or an infinity in a weight; external locations pointed
outside the directory) and, sometimes, of the serialized bytes (flipped,
truncated, spliced, a name made invalid UTF-8). :func:`consume` feeds one
file to what a user can point at it: ``load_model`` (the ``primal inspect``
path), then ``inspect_model`` and ``load_onnx_weights`` when it loads; any
exception but an ``InputError``, and any non-finite weight read, escapes.
Used by tests/frontend/test_onnx_fuzz.py (short budget) and
benchmarks/fuzz.py (long).
"""
from __future__ import annotations

import struct
from functools import lru_cache
from pathlib import Path

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import AttributeProto, TensorProto, helper

import primal_compiler.api  # imported here once, not again in each forked case of benchmarks/fuzz.py
import primal_compiler.frontend.onnx_import  # noqa: F401 - likewise
from primal_compiler.errors import InputError
from primal_compiler.frontend import load_model
from primal_compiler.frontend.onnx_weights import load_onnx_weights
from primal_compiler.report.inspect import inspect_model
from primal_compiler.target import load_target
from primal_compiler.target.spec import PrimalTarget
from tests.frontend.decoders import ABSENT_DATA, fused_decoder

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "onnx"
TARGET = load_target("primal-7nm")  # what inspect maps onto
FIXTURE_BASES = ("llama_lora_qv_r4_torchscript", "gpt2_dynamo", "opt_lora_qv_r4_optimum")
DIMS = (0, -1, -7, 1, 2, 3, 7, 10**7, 10**12, 2**40, 2**63 - 1)
INTS = (0, -1, 1, 2, 3, 4, 8, 64, 1000, 10**7, 2**31, 2**40, 2**63 - 1, -(2**63))
FLOATS = (0.0, -1.0, 1e-5, 1.0, 1e4, 1e38, float("nan"), float("inf"), float("-inf"))
OPS = ("Relu", "Softmax", "MatMul", "Gemm", "Add", "Mul", "Transpose", "Reshape", "Identity", "Cast", "Gather",
       "Attention", "LayerNormalization", "RMSNormalization", "Split", "Concat", "Slice", "Sin", "Cos", "Neg",
       "Constant", "Sigmoid", "Gelu", "Foo", "RotaryEmbedding", "MatMulNBits", "GroupQueryAttention")
SAME_ARITY = (("Relu", "Sigmoid", "Neg", "Identity", "Tanh", "Erf", "Sqrt", "Softmax", "Cos", "Sin"),
              ("Add", "Mul", "Sub", "Div", "MatMul"))
DOMAINS = ("", "ai.onnx", "com.microsoft", "local")
ATTRS = ("perm", "axis", "num_heads", "q_num_heads", "kv_num_heads", "transA", "transB", "epsilon", "split", "K", "N",
         "approximate", "value", "to", "bits", "block_size")
LOCATIONS = ("/dev/zero", "../outside.bin", "/etc/passwd", "", "a/../../b", "sub/weights.bin", "x\x00y", ABSENT_DATA)
DTYPES = (TensorProto.UNDEFINED, TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE,
          TensorProto.INT64, TensorProto.INT32, TensorProto.UINT8, TensorProto.STRING, TensorProto.BOOL, 999)


@lru_cache(maxsize=1)
def base_models() -> dict[str, bytes]:
    """Serialized bases by name; every one imports as a decoder."""
    bases = {name: (FIXTURES / f"{name}.onnx").read_bytes() for name in FIXTURE_BASES}
    bases["fused"] = fused_decoder().SerializeToString()
    bases["fused_external"] = fused_decoder(external=True).SerializeToString()
    return bases


# --------------------------------------------------------------------------- edits of the graph


def _pick(items, index: int):
    return items[index % len(items)] if len(items) else None


def _dim(model, draw, i, j, value):
    tensor = _pick(model.graph.initializer, i)
    if tensor is not None and tensor.dims:
        tensor.dims[j % len(tensor.dims)] = value


def _drop(model, draw, i, j, value):
    if len(model.graph.node) > 1:
        del model.graph.node[i % len(model.graph.node)]


def _duplicate(model, draw, i, j, value):
    node = _pick(model.graph.node, i)
    if node is not None:
        copy = model.graph.node.add()
        copy.CopyFrom(node)
        if j % 2:
            copy.output[:] = [f"{o}_dup" for o in copy.output]


def _swap(model, draw, i, j, value):
    nodes = model.graph.node
    if len(nodes) > 1:
        a, b = i % len(nodes), j % len(nodes)
        na, nb = onnx.NodeProto(), onnx.NodeProto()
        na.CopyFrom(nodes[a])
        nb.CopyFrom(nodes[b])
        nodes[a].CopyFrom(nb)
        nodes[b].CopyFrom(na)


def _rewire(model, draw, i, j, value):
    """One input of node i reads an output of a node at or after it: a cycle or an unsorted graph."""
    nodes = model.graph.node
    node = _pick(nodes, i)
    if node is None or not node.input:
        return
    start = i % len(nodes)
    later = nodes[start + (j % (len(nodes) - start))]
    if later.output:
        node.input[j % len(node.input)] = later.output[0]


def _op_type(model, draw, i, j, value):
    node = _pick(model.graph.node, i)
    if node is not None:
        node.op_type = OPS[j % len(OPS)]


def _op_like(model, draw, i, j, value):
    """An op of the same arity and types (Relu -> Sigmoid, Add -> Mul): the checker passes, recognition must cope."""
    node = _pick(model.graph.node, i)
    group = next((g for g in SAME_ARITY if node is not None and node.op_type in g), None)
    if group is not None:
        node.op_type = group[j % len(group)]
        if node.op_type != "Softmax":
            del node.attribute[:]


def _bypass(model, draw, i, j, value):
    """Node i dropped and its consumers fed its first input instead (a norm, a cast, an activation removed)."""
    nodes = model.graph.node
    node = _pick(nodes, i)
    if node is None or not node.input or not node.output or len(nodes) < 2:
        return
    old, new = node.output[0], node.input[0]
    del nodes[i % len(nodes)]
    for other in nodes:
        other.input[:] = [new if x == old else x for x in other.input]
    for out in model.graph.output:
        if out.name == old:
            out.name = new


def _domain(model, draw, i, j, value):
    node = _pick(model.graph.node, i)
    if node is not None:
        node.domain = DOMAINS[j % len(DOMAINS)]


def _attribute(model, draw, i, j, value):
    node = _pick(model.graph.node, i)
    if node is None:
        return
    name = ATTRS[j % len(ATTRS)]
    kept = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend(kept)
    kind = draw(st.sampled_from(("int", "float", "ints", "string", "tensor")))
    if kind == "int":
        node.attribute.append(helper.make_attribute(name, draw(st.sampled_from(INTS))))
    elif kind == "float":
        node.attribute.append(helper.make_attribute(name, draw(st.sampled_from(FLOATS))))
    elif kind == "ints":
        values = draw(st.lists(st.sampled_from(INTS), max_size=4))
        node.attribute.append(helper.make_attribute(name, values, attr_type=AttributeProto.INTS))
    elif kind == "string":
        node.attribute.append(helper.make_attribute(name, draw(st.sampled_from(("tanh", "none", "", "\xff")))))
    else:
        values = draw(st.lists(st.sampled_from(INTS), min_size=1, max_size=4))
        node.attribute.append(helper.make_attribute(name, helper.make_tensor("v", TensorProto.INT64, [len(values)],
                                                                              values)))


def _dtype(model, draw, i, j, value):
    tensor = _pick(model.graph.initializer, i)
    if tensor is not None:
        tensor.data_type = DTYPES[j % len(DTYPES)]


def _constant(model, draw, i, j, value):
    """A small int64 initializer or Constant (shape vectors, split sizes, offsets) gets other values."""
    small = [t for t in model.graph.initializer if t.data_type == TensorProto.INT64 and len(t.raw_data) <= 64]
    small += [a.t for n in model.graph.node if n.op_type == "Constant" for a in n.attribute
              if a.type == AttributeProto.TENSOR and a.t.data_type == TensorProto.INT64]
    tensor = _pick(small, i)
    if tensor is not None:
        values = draw(st.lists(st.sampled_from(INTS), min_size=1, max_size=4))
        tensor.CopyFrom(helper.make_tensor(tensor.name, TensorProto.INT64, [len(values)], values))


def _external(model, draw, i, j, value):
    tensor = _pick(model.graph.initializer, i)
    if tensor is None:
        return
    tensor.ClearField("raw_data")
    tensor.ClearField("float_data")
    tensor.data_location = TensorProto.EXTERNAL
    del tensor.external_data[:]
    tensor.external_data.add(key="location", value=LOCATIONS[j % len(LOCATIONS)])
    if j % 3 == 0:
        tensor.external_data.add(key="offset", value=draw(st.sampled_from(("0", "-1", "x", "99999999999"))))


def _not_finite(model, draw, i, j, value):
    """A NaN or an infinity in a float initializer (a weight, a norm, an embedding)."""
    floats = [t for t in model.graph.initializer if t.data_type == TensorProto.FLOAT and t.raw_data]
    tensor = _pick(floats, i)
    if tensor is not None:
        values = bytearray(tensor.raw_data)
        at = 4 * (j % (len(values) // 4))
        values[at : at + 4] = struct.pack("<f", draw(st.sampled_from(FLOATS[-3:])))
        tensor.raw_data = bytes(values)


def _drop_output(model, draw, i, j, value):
    if model.graph.output:
        del model.graph.output[i % len(model.graph.output)]


EDITS = (_dim, _dim, _drop, _duplicate, _swap, _rewire, _op_type, _op_like, _op_like, _bypass, _bypass, _domain,
         _attribute, _dtype, _constant, _constant, _external, _not_finite,
         _drop_output)


# --------------------------------------------------------------------------- edits of the bytes


def _corrupt(draw, data: bytes, names: list[str]) -> bytes:
    kind = draw(st.sampled_from(("flip", "truncate", "splice", "name")))
    at = draw(st.integers(0, max(len(data) - 1, 0)))
    if kind == "name" and names:  # a name (of a node's output, an initializer...) that is not UTF-8
        name = names[at % len(names)].encode()
        where = data.find(name) if name else -1
        return data if where < 0 else data[:where] + b"\x9d" + data[where + 1 :]
    if kind == "truncate":
        return data[:at]
    if kind == "splice":
        return data[:at] + draw(st.binary(min_size=1, max_size=16)) + data[at:]
    flipped = bytearray(data)
    for k in range(draw(st.integers(1, 8))):
        flipped[(at + 997 * k) % len(flipped)] ^= draw(st.integers(1, 255))
    return bytes(flipped)


@st.composite
def mutants(draw) -> tuple[str, bytes]:
    """(base name, bytes of a mutated file)."""
    name = draw(st.sampled_from(sorted(base_models())))
    model = onnx.ModelProto()
    model.ParseFromString(base_models()[name])
    for _ in range(draw(st.integers(1, 4))):
        edit = draw(st.sampled_from(EDITS))
        edit(model, draw, draw(st.integers(0, 10**6)), draw(st.integers(0, 10**6)), draw(st.sampled_from(DIMS)))
    data = model.SerializeToString()
    if draw(st.integers(0, 5)) == 0:
        names = [t.name for t in model.graph.initializer] + [o for n in model.graph.node for o in n.output]
        data = _corrupt(draw, data, names)
    return name, data


# --------------------------------------------------------------------------- the consumer


def consume(path: Path, target: PrimalTarget = TARGET) -> str:
    """``load_model`` then ``inspect_model`` (on ``target``) and ``load_onnx_weights``; returns how far it got.

    Only an :class:`InputError` with a one-line message may stop it, and weights that are read must be
    finite; anything else escapes.
    """
    stage = "refused"
    try:
        model = load_model(str(path))
        stage = "loaded"
        inspect_model(model, target)
        stage = "inspected"
        weights = load_onnx_weights(path)
        stage = "weights read"
    except InputError as exc:
        assert "\n" not in str(exc), str(exc)
        assert exc.where and exc.problem, str(exc)
        return stage
    tables = weights.tables
    arrays = [v for p in weights.projections.values() for v in (p.w, p.bias, p.a, p.b)]
    arrays += [tables.embed, tables.pos_embed, *(v for pair in tables.norms.values() for v in pair)]
    assert all(a is None or np.isfinite(a).all() for a in arrays), "non-finite weights were accepted"
    return stage
