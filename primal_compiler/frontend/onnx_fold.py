"""Shape arithmetic with a static value, folded: what a legacy (TorchScript) export computes from ``Shape``.

The TorchScript exporter writes ``x[..., : x.size(-1) // 2]`` or ``qkv[..., d : 2 * d]`` as chains of
``Shape -> Gather -> Div -> Mul -> Unsqueeze -> Slice``, where the dynamo exporter writes constants. Where
the dimensions such a chain reads are static (onnx's shape inference with data propagation says so), its
value is a constant too: :func:`fold_shapes` computes it, and :class:`~.onnx_graph.GraphIndex` answers it as
one, so the recognisers read both exports alike.

Guarantees: only values computed from a ``Shape`` (and constants) are folded, computed with onnx's
semantics (integer ``Div`` truncates; a division by zero, a NaN or an infinity folds nothing; ``Unsqueeze`` and
``Squeeze`` only between a scalar and a one-element vector), and only small ones (1 to ``SMALL_CONST``
elements); a dimension the export leaves dynamic (the batch, the sequence, where it declares them dynamic)
stays unknown, and so does everything computed from it. A dimension the tracer fixed (a legacy export's
position path traced at one length) is static to shape inference and folds like any other. Shape
inference runs on a copy whose large initializers are typed inputs, so no weight byte is copied or read.
The fold repeats (a folded ``Slice`` end makes the sliced shape static) until nothing new folds, at most
:data:`ROUNDS` times. A graph onnx's shape inference cannot type folds nothing (the recognisers then see
what they saw before).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from primal_compiler.frontend.onnx_graph import SMALL_CONST, attr

#: Rounds of shape inference and folding at most (the legacy exports settle in two).
ROUNDS = 4
Partial = tuple[int | None, ...]  # a 1-D integer vector with unknown entries (a shape with dynamic dims)

_BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply,
    "Div": lambda a, b: (np.trunc(a / b).astype(np.result_type(a, b)) if np.issubdtype(np.result_type(a, b), np.integer)
                         else np.divide(a, b)),
}
_UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {"Sqrt": np.sqrt, "Reciprocal": np.reciprocal, "Neg": np.negative}


def fold_shapes(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The value of every small tensor of ``model`` computed from static dimensions and constants (see the module
    docstring), by name; constants themselves are not repeated."""
    folded: dict[str, np.ndarray] = {}
    consts = _constants(model)
    for _ in range(ROUNDS):
        dims = _static_dims(model, folded, consts)
        if dims is None:
            return folded
        new = _Evaluator(model, dims, consts).run()
        if new.keys() <= folded.keys():
            return folded
        folded = new
    return folded


def _constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The small constants by name (initializers and ``Constant`` nodes of at most ``SMALL_CONST`` elements
    whose value is here: not external data, not a quantized constant's placeholder), decoded once."""
    small = ((t.name, _decoded(t)) for t in model.graph.initializer if math.prod(t.dims) <= SMALL_CONST)
    nodes = ((n.output[0], _constant(n)) for n in model.graph.node if n.op_type == "Constant" and n.output)
    return {name: value for name, value in (*small, *nodes) if value is not None and value.size <= SMALL_CONST}


def _static_dims(model: onnx.ModelProto, folded: dict[str, np.ndarray],
                 consts: dict[str, np.ndarray]) -> dict[str, Partial] | None:
    """Every typed tensor's dims (None where dynamic) by onnx's shape inference, with ``folded`` as constants
    (``consts``: the small ones readable here, kept inline); None when the inference fails."""
    g = model.graph
    inputs = list(g.input)
    declared = {i.name for i in inputs}
    small = []
    for t in g.initializer:
        if t.name in consts:
            small.append(t)
        elif t.name not in declared:
            inputs.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    nodes = [helper.make_node("Constant", [], [n.output[0]], value=numpy_helper.from_array(folded[n.output[0]]))
             if n.output and n.output[0] in folded else n for n in g.node]
    light = helper.make_model(helper.make_graph(nodes, g.name or "graph", inputs, list(g.output), small),
                              opset_imports=list(model.opset_import), ir_version=model.ir_version)
    try:
        typed = onnx.shape_inference.infer_shapes(light, data_prop=True)
    except Exception:  # noqa: BLE001 - a graph onnx cannot type folds nothing
        return None
    out: dict[str, Partial] = {}
    for info in (*typed.graph.input, *typed.graph.value_info, *typed.graph.output):
        tensor = info.type.tensor_type
        if tensor.HasField("shape"):
            out[info.name] = tuple(d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim)
    return out


class _Evaluator:
    """One pass over the nodes in order: full values (``values``) and partial integer vectors (``partial``)."""

    def __init__(self, model: onnx.ModelProto, dims: dict[str, Partial], consts: dict[str, np.ndarray]) -> None:
        self.model, self.dims, self.consts = model, dims, consts
        self.values: dict[str, np.ndarray] = {}
        self.partial: dict[str, Partial] = {}

    def run(self) -> dict[str, np.ndarray]:
        for node in self.model.graph.node:
            if len(node.output) != 1 or not node.output[0]:
                continue
            if node.op_type == "Constant":
                continue  # in ``consts``
            try:
                with np.errstate(all="ignore"):
                    found = self._node(node)
            except (ValueError, TypeError, IndexError, ZeroDivisionError, FloatingPointError):
                found = None
            if isinstance(found, np.ndarray) and np.issubdtype(found.dtype, np.floating) and not np.isfinite(found).all():
                found = None  # a NaN or an infinity is no shape and no scale
            if isinstance(found, tuple):
                if all(d is not None for d in found):
                    found = np.array(found, dtype=np.int64)
                else:
                    self.partial[node.output[0]] = found
                    continue
            if found is not None and 0 < found.size <= SMALL_CONST:
                self.values[node.output[0]] = found
        return self.values

    def value(self, name: str) -> np.ndarray | None:
        return self.values.get(name, self.consts.get(name))

    def vector(self, name: str) -> Partial | None:
        """``name`` as a 1-D integer vector, maybe with unknown entries; None if it is not one."""
        if name in self.partial:
            return self.partial[name]
        value = self.value(name)
        if value is None or value.ndim != 1 or not np.issubdtype(value.dtype, np.integer):
            return None
        return tuple(int(v) for v in value)

    def _node(self, node: onnx.NodeProto) -> np.ndarray | Partial | None:
        op, ins = node.op_type, list(node.input)
        if op == "Shape":
            shape = self.dims.get(ins[0])
            return None if shape is None else shape[slice(attr(node, "start", 0), attr(node, "end", None))]
        if not any(x in self.values or x in self.partial for x in ins):
            return None  # arithmetic on constants alone is the recognisers' to read, as written
        args = [self.value(x) if x else None for x in ins]
        if op in _BINARY and len(ins) == 2 and args[0] is not None and args[1] is not None:
            if op == "Div" and (args[1] == 0).any():
                return None  # onnx leaves it undefined (integers) or infinite: never a shape
            return _BINARY[op](args[0], args[1])
        if op in _UNARY and args[0] is not None:
            return _UNARY[op](args[0])
        to = helper.tensor_dtype_to_np_dtype(attr(node, "to")) if op == "Cast" else None
        if op == "Cast" and args[0] is not None:
            return args[0].astype(to)
        if ins[0] in self.partial and (op == "Identity" or (op == "Cast" and np.issubdtype(to, np.integer))):
            return self.partial[ins[0]]
        if op == "Identity":
            return args[0]
        if op == "Gather" and attr(node, "axis", 0) == 0 and args[1] is not None and args[1].ndim <= 1:
            if args[0] is not None:
                return np.take(args[0], args[1], axis=0)
            vector = self.vector(ins[0])
            if vector is None or not ((-len(vector) <= args[1]) & (args[1] < len(vector))).all():
                return None
            picked = tuple(vector[int(i)] for i in args[1].reshape(-1))
            if args[1].ndim == 1:
                return picked
            return None if picked[0] is None else np.array(picked[0], dtype=np.int64)
        if op == "ConstantOfShape" and args[0] is not None and args[0].ndim == 1 and math.prod(args[0]) <= SMALL_CONST:
            fill = attr(node, "value")
            fill = numpy_helper.to_array(fill).reshape(-1) if fill is not None else np.zeros(1, np.float32)
            return np.full([int(d) for d in args[0]], fill[0], dtype=fill.dtype)
        axes = args[1] if len(args) > 1 and args[1] is not None else attr(node, "axes")
        first = axes is None or list(np.asarray(axes).reshape(-1)) in ([0], [-1])  # the one axis of a 1-D vector
        if op == "Unsqueeze" and args[0] is not None and args[0].ndim == 0 and axes is not None and first:
            return args[0].reshape(1)
        if op == "Squeeze" and args[0] is not None and args[0].shape == (1,) and first:
            return args[0].reshape(())
        if op == "Concat" and attr(node, "axis", 0) in (0, -1):
            parts = [self.vector(x) for x in ins]
            return None if any(p is None for p in parts) else tuple(d for p in parts for d in p)  # type: ignore[union-attr]
        if op == "Slice":
            vector = self.vector(ins[0])
            lo, hi, axis, step = (_one(a) for a in (args + [None, None])[1:5])
            if vector is None or lo is None or hi is None or axis not in (None, 0, -1):
                return None
            return vector[lo:hi:step or 1]
        return None


def _one(value: np.ndarray | None) -> int | None:
    """The one integer ``value`` holds, else None."""
    return int(value.reshape(-1)[0]) if value is not None and value.size == 1 else None


def _decoded(tensor: onnx.TensorProto) -> np.ndarray | None:
    """``tensor``'s value, or None when it has none here (external data, a quantized constant's placeholder)."""
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        return None
    try:
        return numpy_helper.to_array(tensor)
    except (ValueError, TypeError):
        return None


def _constant(node: onnx.NodeProto) -> np.ndarray | None:
    """A ``Constant`` node's value, whichever attribute holds it."""
    for a in node.attribute:
        if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
            return _decoded(a.t)
        if a.name in ("value_int", "value_ints", "value_float", "value_floats"):
            return np.asarray(helper.get_attribute_value(a), dtype=np.int64 if "int" in a.name else np.float32)
    return None
