"""DoRA (weight-decomposed LoRA) read from an ONNX graph: ``c * (x W + s x A B)``, ``c`` one scale per column.

PEFT's DoRA rescales each output column of ``W + s A B`` to a learned magnitude ``m``: its layer computes
``x W + (c - 1) * (x W) + c * s * (x A B)`` with ``c = m / ||W + s A B||`` per column (the norm over the
input axis). Both exporters write that sum as it stands: B's output multiplied by ``c`` (and the scale
``s``), added to ``(c - 1)`` times the base projection's output, the sum added to the base output again.
The dynamo exporter folds ``c`` and ``c - 1`` into constants; the TorchScript exporter computes them from
the weights at run time (``EyeLike``, the weight products, ``ReduceL2``, the magnitude divided by it), a
subgraph no graph input reaches.

:func:`dora_sum` recognises that sum around a LoRA pair and returns its nodes; anything else that scales a
LoRA output per column is refused naming DoRA and the node. :func:`column_scale` evaluates ``c`` (and
checks ``c - 1`` against it) with onnx's reference evaluator over the constant subgraph
(``onnx_evaluate``), so the functional replay scales by what the file computes, to the last bit of float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import helper, numpy_helper

from primal_compiler.frontend.onnx_evaluate import producers, run
from primal_compiler.frontend.onnx_graph import FLOATS, HALF_EPS, GraphIndex, PatternError
from primal_compiler.frontend.onnx_tensors import read_tensor

if TYPE_CHECKING:
    from primal_compiler.frontend.onnx_project import Projection

#: How far ``c - 1`` may differ from the evaluated ``c`` minus one (float32 rounding of a subtraction).
ONE_LESS_SLACK = 1e-6


@dataclass(frozen=True)
class DoraSum:
    """The nodes of one projection's DoRA sum, and the tensors holding ``c`` and ``c - 1``."""

    base: int  # the base projection's node
    column: str  # c: multiplies B's output
    column_less_one: str  # c - 1: multiplies the base output
    nodes: tuple[int, ...]  # the two Muls by c and c - 1, and the two Adds


def input_reached(g: GraphIndex) -> set[str]:
    """Every tensor a graph input flows into (the nodes are in topological order, as onnx requires)."""
    live = set(g.graph_inputs)
    for node in g.nodes:
        if any(x in live for x in node.input if x):
            live.update(o for o in node.output if o)
    return live


def dora_sum(g: GraphIndex, add: int, lora_side: str, column_mul: int, b: Projection,
             by_node: dict[int, Projection], live: set[str]) -> DoraSum:
    """The DoRA sum whose first ``Add`` is ``add`` (``lora_side``: its operand from B's output, which the
    ``column_mul`` node multiplied by ``c``); a PatternError naming DoRA unless the graph is exactly that sum."""
    node = g.nodes[add]
    mul = g.nodes[column_mul]
    where = f"node {mul.name or '#' + str(column_mul)}"
    refuse = PatternError(f"weight-decomposed LoRA (DoRA): the adapter on the {b.in_features}x{b.out_features} B at "
                          f"node {g.nodes[b.node].name or b.node} is rescaled per output column at {where}, but not "
                          "in the form c * (x W + s x A B) this reads (base + (c - 1) * base + c * s * lora, "
                          "c a constant column vector, no bias)")
    column = [x for x in mul.input if x not in live]  # no graph input reaches c: a constant, or computed from them
    others = [x for x in node.input if x != lora_side]
    scaled = g.node_of(others[0]) if len(others) == 1 else None
    if len(column) != 1 or scaled is None or scaled.op_type != "Mul":
        raise refuse
    less = [x for x in scaled.input if x not in live]
    base_out = [x for x in scaled.input if x in live]
    base = by_node.get(g.producer.get(g.canonical(base_out[0]), -1)) if len(base_out) == 1 else None
    users = [i for i in g.consumers.get(node.output[0], ()) if g.nodes[i].op_type == "Add"]
    if len(less) != 1 or base is None or base.node in (b.node,) or base.bias or len(users) != 1 \
            or len(g.consumers.get(node.output[0], ())) != 1:
        raise refuse
    if not _one_less(g, column[0], less[0]):
        raise PatternError(f"weight-decomposed LoRA (DoRA) at {where}: the factor of the base output at node "
                           f"{scaled.name or g.producer[others[0]]} is not the column scale minus one")
    final = g.nodes[users[0]]
    again = [x for x in final.input if x != node.output[0]]
    if len(again) != 1 or g.producer.get(g.canonical(again[0])) != base.node:
        raise refuse
    return DoraSum(base.node, column[0], less[0], (column_mul, g.producer[others[0]], add, users[0]))


def _one_less(g: GraphIndex, column: str, less: str) -> bool:
    """Whether ``less`` is ``column`` minus one, as far as the graph shows without reading external data: both
    inline constants (compared within :data:`ONE_LESS_SLACK`), or ``less`` a ``Sub`` of ``column`` and the constant
    1; two constants stored outside the file are compared when the weights are read (:func:`column_scale`)."""
    node = g.node_of(less)
    if node is not None and node.op_type == "Sub":
        return list(node.input[:1]) == [column] and g.scalar(node.input[1]) == 1.0
    c, c1 = (g.constant_tensor(t) for t in (column, less))
    if c is None or c1 is None:
        return False
    if c.data_location == onnx.TensorProto.EXTERNAL or c1.data_location == onnx.TensorProto.EXTERNAL:
        return True  # checked by column_scale once the weights are read
    a, b = numpy_helper.to_array(c), numpy_helper.to_array(c1)
    return a.shape == b.shape and _is_one_less(a, b)


def _is_one_less(c: np.ndarray, less: np.ndarray) -> bool:
    """``less == c - 1`` within float32's rounding, or the half-precision type's epsilon when either is stored in
    one (both rounded: at most an epsilon of ``max(1, |c|)``)."""
    slack = max([ONE_LESS_SLACK] + [HALF_EPS[x.dtype.name] for x in (c, less) if x.dtype.name in HALF_EPS])
    c, less = c.astype(np.float32), less.astype(np.float32)
    return bool(np.abs((c - np.float32(1)) - less).max() <= slack * max(1.0, float(np.abs(c).max())))


def column_scale(g: GraphIndex, dora: DoraSum, width: int, label: str, where: str) -> np.ndarray:
    """``c`` of one DoRA sum as the file ``where`` computes it (float32, ``width`` values), checked against
    ``c - 1``; a PatternError naming ``label`` when either cannot be evaluated or they disagree."""
    c, less = (_evaluate(g, t, label, where) for t in (dora.column, dora.column_less_one))
    if c is None or less is None or c.size != width or less.size != width:
        raise PatternError(f"weight-decomposed LoRA (DoRA) on {label}: its column scale cannot be evaluated "
                           f"to {width} values")
    if not np.isfinite(c.astype(np.float32)).all() or not _is_one_less(c.reshape(-1), less.reshape(-1)):
        raise PatternError(f"weight-decomposed LoRA (DoRA) on {label}: the factor of the base output is not the "
                           "column scale minus one (or the scale is not finite)")
    return c.reshape(-1).astype(np.float32)


def _evaluate(g: GraphIndex, tensor: str, label: str, where: str) -> np.ndarray | None:
    """``tensor`` computed from the constants alone by onnx's reference evaluator, every initializer read as
    stored (external data and a quantized file's own codes included); None if it cannot be."""
    stored = g.constant_tensor(tensor)
    if stored is not None:  # in its stored type, so that c - 1 is compared within that type's rounding
        return read_tensor(g, stored, f"{label} DoRA scale", where).astype(helper.tensor_dtype_to_np_dtype(
            stored.data_type))
    closure = producers(g, tensor)
    if {x for i in closure for x in g.nodes[i].input} & g.graph_inputs:
        return None
    def read(t: onnx.TensorProto) -> np.ndarray:  # floats as stored (external data, codes), in their own dtype
        if t.data_type not in FLOATS:
            return numpy_helper.to_array(t)
        return read_tensor(g, t, f"{label} DoRA scale", where).astype(helper.tensor_dtype_to_np_dtype(t.data_type))

    return run(g, closure, tensor, {}, read)
