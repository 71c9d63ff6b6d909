"""Index over an ONNX graph for shape-only pattern matching (no weight bytes).

:class:`GraphIndex` answers the questions the decoder recogniser asks:
who produces or consumes a tensor, which initializer a value really is
(through ``Identity``/``Cast``/``Transpose`` chains), the value of a *small*
inline constant (shape vectors, scalars such as the LoRA scale), and the
reachable region from a tensor when walking the data flow forward or
backward without crossing a set of barrier nodes or any shape computation.

Work is bounded: the walks of one recognition follow at most
:data:`WALK_LIMIT` edges in all, after which the graph is refused with a
:class:`PatternError` instead of being searched for minutes. The MLP
assignment walks back along the residual stream, so a decoder needs about
4 L^2 steps: a 1024-layer one with decomposed norms about half the limit
(7 s), a 126-layer one 1%.
"""

from __future__ import annotations

import math
import struct
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from primal_compiler.frontend.patterns import PatternError
from primal_compiler.frontend.quant_codes import decode
from primal_compiler.inputs import regular_file

if TYPE_CHECKING:
    from primal_compiler.frontend.onnx_quant import QuantTable

# Ops that pass a value through unchanged in the sense that matters here
# (same data, maybe another layout or dtype).
#: The rounding (machine epsilon) of the half-precision types an export may store its constants in: a constant
#: compared with the value it stands for may be off by this much, relatively.
HALF_EPS = {"float16": 2.0**-10, "bfloat16": 2.0**-7}
TRANSPARENT = frozenset({"Identity", "Cast", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Dropout", "CastLike"})
# Ops whose outputs carry shapes, not data: walks never cross them.
SHAPE_OPS = frozenset({"Shape", "Size"})
# Largest constant (in elements) the frontend will ever decode.
SMALL_CONST = 64

#: The float element types a tensor may have (a weight, a table, a scale).
FLOATS = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE)
ITEMSIZE: dict[int, int] = {TensorProto.FLOAT: 4, TensorProto.FLOAT16: 2, TensorProto.BFLOAT16: 2, TensorProto.DOUBLE: 8}
#: Edges all walks of one recognition may follow (about 15 s at worst).
WALK_LIMIT = 1 << 23
#: Largest external-data file looked at: 1 TiB, above a 405B-parameter model in fp16 (810 GB).
EXTERNAL_LIMIT_BYTES = 1 << 40


@dataclass(frozen=True)
class Weight:
    """A 2-D initializer seen through layout-only ops: ``rows x cols`` as consumed."""

    name: str  # the initializer
    rows: int
    cols: int
    transposed: bool  # consumed transposed relative to storage


class GraphIndex:
    def __init__(self, model: onnx.ModelProto, base_dir: Path, quant: QuantTable | None = None,
                 folded: dict[str, np.ndarray] | None = None) -> None:
        self.model = model
        self.folded = folded or {}  # shape arithmetic with a static value (``onnx_fold.fold_shapes``)
        self.base_dir = base_dir
        self.quant = quant  # the placeholders ``onnx_quant.dequantize_graph`` left for quantized constants
        graph = model.graph
        self.nodes = list(graph.node)
        self.inits: dict[str, TensorProto] = {t.name: t for t in graph.initializer}
        self.graph_inputs = {i.name for i in graph.input} - set(self.inits)
        self.graph_outputs = [o.name for o in graph.output]
        self.steps = 0  # edges followed by walks so far, against WALK_LIMIT
        self.producer: dict[str, int] = {}
        self.consumers: dict[str, list[int]] = defaultdict(list)
        for i, node in enumerate(self.nodes):
            for out in node.output:
                if out:
                    self.producer[out] = i
            for inp in node.input:
                if inp:
                    self.consumers[inp].append(i)
        # the walks' adjacency, node to node (shape ops are never entered)
        self._preds = [[self.producer[x] for x in n.input if x in self.producer] for n in self.nodes]
        self._succs = [[c for o in n.output if o for c in self.consumers.get(o, ())] for n in self.nodes]
        self._shape_op = [n.op_type in SHAPE_OPS for n in self.nodes]

    # ------------------------------------------------------------------ values

    def node_of(self, tensor: str) -> onnx.NodeProto | None:
        i = self.producer.get(tensor)
        return None if i is None else self.nodes[i]

    def constant_tensor(self, name: str) -> TensorProto | None:
        """The TensorProto behind ``name`` (initializer or Constant node), through Identity."""
        seen = 0
        while seen < 16:
            seen += 1
            if name in self.inits:
                return self.inits[name]
            node = self.node_of(name)
            if node is None:
                return None
            if node.op_type == "Identity":
                name = node.input[0]
                continue
            if node.op_type == "Constant":
                for attr in node.attribute:
                    if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
                        return attr.t
                return None
            return None
        return None

    def weight(self, name: str) -> Weight | None:
        """``name`` as a 2-D weight: initializer behind Identity/Cast/Transpose; else None."""
        transposed = False
        for _ in range(16):
            tensor = self.constant_tensor(name)
            if tensor is not None:
                if len(tensor.dims) != 2 or tensor.data_type in (TensorProto.INT64, TensorProto.INT32):
                    return None
                rows, cols = int(tensor.dims[0]), int(tensor.dims[1])
                if transposed:
                    rows, cols = cols, rows
                return Weight(tensor.name or name, rows, cols, transposed)
            node = self.node_of(name)
            if node is None:
                return None
            if node.op_type in ("Cast", "Identity", "CastLike"):
                name = node.input[0]
            elif node.op_type == "Transpose":
                perm = _attr(node, "perm")
                if perm not in (None, [1, 0]):
                    return None
                transposed = not transposed
                name = node.input[0]
            else:
                return None
        return None

    def vector_len(self, name: str) -> int | None:
        """Length of a 1-D constant (or ``[1, ..., n]``), e.g. a bias; else None."""
        tensor = self.constant_tensor(name)
        if tensor is None:
            node = self.node_of(name)
            if node is not None and node.op_type in ("Cast", "Identity"):
                return self.vector_len(node.input[0])
            return None
        dims = [int(d) for d in tensor.dims]
        if not dims or any(d != 1 for d in dims[:-1]):
            return None
        return dims[-1]

    def const(self, name: str, limit: int = SMALL_CONST) -> np.ndarray | None:
        """Value of a small inline constant (at most ``limit`` elements), or of shape arithmetic folded to one;
        else None."""
        if name in self.folded:
            return self.folded[name] if self.folded[name].size <= limit else None
        tensor = self.constant_tensor(name)
        if tensor is None:
            node = self.node_of(name)
            if node is not None and node.op_type == "Constant":
                return _constant_attr_value(node)
            if node is not None and node.op_type in ("Cast", "Identity"):
                return self.const(node.input[0], limit)
            return None
        if any(d < 0 for d in tensor.dims) or math.prod(tensor.dims) > limit:
            return None
        if tensor.data_location == TensorProto.EXTERNAL:
            return None
        try:
            spec = self.quant.weights.get(tensor.name) if self.quant is not None else None
            if spec is not None:  # a small dequantized constant, decoded from its inline parts
                return decode(spec, lambda name: numpy_helper.to_array(self.inits[name])).w
            return numpy_helper.to_array(tensor)
        except Exception:  # noqa: BLE001 - an undecodable constant is just unknown
            return None

    def scalar(self, name: str) -> float | None:
        value = self.const(name)
        if value is None or value.size != 1:
            return None
        return float(value.reshape(-1)[0])

    def factor(self, node: onnx.NodeProto, tensor: str | None = None) -> float | None:
        """What a ``Mul`` or ``Div`` multiplies ``tensor`` (default: its input that is not a scalar) by: the other
        input's scalar, or its inverse for a ``Div`` by it; None when that is not a scalar, the scalar is the
        dividend, or it divides by zero."""
        if node.op_type not in ("Mul", "Div") or len(node.input) != 2:
            return None
        k = (1 if node.input[0] == tensor else 0) if tensor is not None else int(self.scalar(node.input[1]) is not None)
        value = self.scalar(node.input[k])
        if value is None or (node.op_type == "Div" and (k == 0 or value == 0)):
            return None
        return value if node.op_type == "Mul" else 1.0 / value

    def tail_ints(self, name: str, count: int) -> list[int | None]:
        """The last ``count`` entries of a shape vector; None where not constant."""
        known = self._tail(name, count, 0)
        return [None] * (count - len(known)) + known

    def _tail(self, name: str, count: int, depth: int) -> list[int | None]:
        if depth > 8:
            return []
        value = self.const(name)
        if value is not None:
            flat: list[int | None] = [int(v) for v in value.reshape(-1)]
            return flat[-count:]
        node = self.node_of(name)
        if node is None:
            return []
        if node.op_type in ("Cast", "Identity"):
            return self._tail(node.input[0], count, depth + 1)
        if node.op_type == "Unsqueeze":
            value = self.const(node.input[0])
            return [int(value.reshape(-1)[0])] if value is not None and value.size == 1 else [None]
        if node.op_type == "Concat":
            out: list[int | None] = []
            for inp in reversed(node.input):
                part = self._length_known(inp)
                if part is None:
                    break
                out = part + out
                if len(out) >= count:
                    break
            return out[-count:]
        return []

    def _length_known(self, name: str) -> list[int | None] | None:
        """Every entry of a short shape piece whose length is known; None if unknown length."""
        value = self.const(name)
        if value is not None:
            return [int(v) for v in value.reshape(-1)]
        node = self.node_of(name)
        if node is None:
            return None
        if node.op_type == "Unsqueeze":
            inner = self.const(node.input[0])
            if inner is not None and inner.size == 1:
                return [int(inner.reshape(-1)[0])]
            return [None]
        if node.op_type in ("Cast", "Identity"):
            return self._length_known(node.input[0])
        return None

    # ------------------------------------------------------------------ walking

    def canonical(self, tensor: str) -> str:
        """Follow transparent producers back to the tensor that really holds the value."""
        for _ in range(32):
            node = self.node_of(tensor)
            if node is None or node.op_type not in TRANSPARENT or not node.input:
                return tensor
            tensor = node.input[0]
        return tensor

    def forward(self, starts: Iterable[str], barriers: frozenset[int] | set[int]) -> tuple[set[int], set[int]]:
        """Nodes reached from ``starts`` along data flow, and the barrier nodes hit.

        The walk never enters a barrier node or a shape op (Shape/Size).
        """
        stack = [i for t in starts for i in self.consumers.get(t, ())]
        return self._walk(stack, self._succs, barriers, None)

    def backward(
        self, starts: Iterable[str], barriers: frozenset[int] | set[int], stop: set[int] | None = None
    ) -> tuple[set[int], set[int]]:
        """Nodes the tensors ``starts`` depend on, and the barrier nodes hit.

        Never crosses a barrier, a shape op, or a node in ``stop`` (which is
        recorded as reached but not expanded).
        """
        stack = [self.producer[t] for t in starts if t in self.producer]
        return self._walk(stack, self._preds, barriers, stop)

    def _walk(
        self, stack: list[int], next_of: list[list[int]], barriers: frozenset[int] | set[int], stop: set[int] | None
    ) -> tuple[set[int], set[int]]:
        """Depth-first from ``stack`` along ``next_of``; every edge followed counts against WALK_LIMIT."""
        reached: set[int] = set()
        hit: set[int] = set()
        shape_op = self._shape_op
        steps = len(stack)
        while stack:
            i = stack.pop()
            if i in barriers:
                hit.add(i)
            elif i not in reached and not shape_op[i]:
                reached.add(i)
                if stop is None or i not in stop:
                    stack.extend(next_of[i])
                    steps += len(next_of[i])
        self._spend(steps)
        return reached, hit

    def _spend(self, steps: int) -> None:
        self.steps += steps
        if self.steps > WALK_LIMIT:
            raise PatternError(
                f"graph too irregular to recognise: its walks would follow over {WALK_LIMIT:,} edges"
            )

    # ------------------------------------------------------------------ tied weights

    def external_file(self, tensor: TensorProto) -> Path | None:
        """The regular file holding an external tensor's data; None when it is absent.

        Anything else at that path (a directory, a FIFO, a device) is an :class:`InputError`
        naming it, never opened. The location itself was checked on loading (``onnx_check``:
        relative, inside the model's directory).
        """
        location = next(e.value for e in tensor.external_data if e.key == "location")
        path = self.base_dir / location
        if not path.exists() and not path.is_symlink():
            return None
        return regular_file(path, EXTERNAL_LIMIT_BYTES, "external data file")

    def element(self, name: str, flat_index: int) -> bytes | None:
        """The bytes of one element of initializer ``name``; None when unreadable.

        Used only to sample a handful of elements when deciding whether an LM
        head is a copy of the embedding (see onnx_import's module docstring).
        """
        tensor = self.inits.get(name)
        if tensor is None:
            return None
        size = ITEMSIZE.get(tensor.data_type)
        if size is None:
            return None
        if tensor.data_location == TensorProto.EXTERNAL:
            path = self.external_file(tensor)
            if path is None:
                return None
            offset = int(next((e.value for e in tensor.external_data if e.key == "offset"), 0))
            try:
                with open(path, "rb") as fh:
                    fh.seek(offset + flat_index * size)
                    data = fh.read(size)
            except OSError:
                return None
            return data if len(data) == size else None
        if tensor.raw_data:
            start = flat_index * size
            data = tensor.raw_data[start : start + size]
            return data if len(data) == size else None
        if tensor.data_type == TensorProto.FLOAT and flat_index < len(tensor.float_data):
            return struct.pack("<f", tensor.float_data[flat_index])
        if tensor.data_type in (TensorProto.FLOAT16, TensorProto.BFLOAT16) and flat_index < len(tensor.int32_data):
            return struct.pack("<H", tensor.int32_data[flat_index] & 0xFFFF)
        if tensor.data_type == TensorProto.DOUBLE and flat_index < len(tensor.double_data):
            return struct.pack("<d", tensor.double_data[flat_index])
        return None


def _attr(node: onnx.NodeProto, name: str, default=None):
    for attr in node.attribute:
        if attr.name == name:
            return onnx.helper.get_attribute_value(attr)
    return default


attr = _attr


def _constant_attr_value(node: onnx.NodeProto) -> np.ndarray | None:
    for a in node.attribute:
        if a.name in ("value_int", "value_float"):
            return np.array(onnx.helper.get_attribute_value(a))
        if a.name in ("value_ints", "value_floats"):
            value = onnx.helper.get_attribute_value(a)
            return np.array(value) if len(value) <= SMALL_CONST else None
    return None


def slice_bounds(g: GraphIndex, node, axes: tuple[int, ...]) -> tuple[int, int, int] | None:
    """(start, end, step) of a one-axis ``Slice`` along one of ``axes``, from its constant inputs (step 1 when
    absent); None for anything else."""
    inputs = list(node.input) + [""] * 5
    starts, ends, axis, steps = (g.const(x) if x else None for x in inputs[1:5])
    if starts is None or ends is None or starts.size != 1 or ends.size != 1:
        return None
    if axis is None or axis.size != 1 or int(axis.reshape(-1)[0]) not in axes:
        return None
    if steps is not None and steps.size != 1:
        return None
    step = 1 if steps is None else int(steps.reshape(-1)[0])
    return int(starts.reshape(-1)[0]), int(ends.reshape(-1)[0]), step
