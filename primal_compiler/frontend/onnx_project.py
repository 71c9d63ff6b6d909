"""Weight projections of an ONNX graph: MatMul/Gemm on a 2-D initializer, biases, LoRA pairs.

A *projection* is ``y = x @ W (+ b) (+ scale * (x @ A) @ B)``. This module
finds every weight matmul (MatMul with a constant right operand, possibly
behind Transpose/Cast/Identity, quantized weights included (``onnx_quant``); Gemm with transB),
pairs unmerged LoRA adapters (two weight matmuls back to back, ``in -> r ->
out``, optionally scaled, added to a base projection of the same shape) and
detects biases (a Gemm C input, or an Add of a 1-D constant of ``out``
elements right after the matmul).

LoRA alpha is ``scale * rank`` with scale the product of the scalar
constants multiplied in after B. A scale constant stored as external data
that is absent cannot be read; the adapter is still found and its alpha is
reported as its rank (scale 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from primal_compiler.frontend.onnx_dora import DoraSum, dora_sum
from primal_compiler.frontend.onnx_graph import SHAPE_OPS, TRANSPARENT, GraphIndex, PatternError, attr
from primal_compiler.ir.model import Role


@dataclass
class Projection:
    node: int  # index of the MatMul/Gemm node
    x: str  # activation input
    in_features: int
    out_features: int
    weight: str  # initializer name
    bias: bool = False
    lora: tuple[int, float] | None = None  # (rank, alpha)
    lora_nodes: tuple[int, ...] = ()
    dora: DoraSum | None = None  # the LoRA is DoRA: its sum's nodes and column scale (``onnx_dora``)
    role: Role | None = None
    split: tuple[int, int, int] | None = None  # (first, end, full width): columns of a fused gate/up weight

    @property
    def nodes(self) -> tuple[int, ...]:
        return (self.node, *self.lora_nodes)

    def given_role(self) -> Role:
        """Its role, once recognition gave it one; PatternError for a projection still without."""
        if self.role is None:
            raise PatternError(f"the {self.in_features}x{self.out_features} projection at node #{self.node} "
                               "serves no recognised role")
        return self.role


def find_weight_matmuls(g: GraphIndex, live: set[str]) -> list[Projection]:
    """Every MatMul/Gemm of an activation by a weight; a product of constants alone (DoRA's weight norms as
    TorchScript computes them: its input not among ``live``, what a graph input reaches) is none."""
    found: list[Projection] = []
    for i, node in enumerate(g.nodes):
        domain = node.domain or ""
        if node.input and node.input[0] not in live:
            continue
        if node.op_type == "MatMul" and domain in ("", "ai.onnx") and len(node.input) == 2:
            w = g.weight(node.input[1])
            if w is not None and g.weight(node.input[0]) is None:
                found.append(Projection(i, node.input[0], w.rows, w.cols, w.name))
        elif node.op_type == "Gemm" and domain in ("", "ai.onnx"):
            if attr(node, "transA", 0):
                continue
            w = g.weight(node.input[1])
            if w is None or g.weight(node.input[0]) is not None:
                continue
            rows, cols = (w.cols, w.rows) if attr(node, "transB", 0) else (w.rows, w.cols)
            has_c = len(node.input) > 2 and bool(node.input[2])
            found.append(Projection(i, node.input[0], rows, cols, w.name, bias=has_c))
    return found


def _only_consumer(g: GraphIndex, tensor: str) -> int | None:
    users = [i for i in g.consumers.get(tensor, ()) if g.nodes[i].op_type not in SHAPE_OPS]
    return users[0] if len(users) == 1 else None


FOLLOW_LIMIT = 64  # tensors one search for a LoRA's base projection may look at


def _follow_to_base(
    g: GraphIndex, tensor: str, by_node: dict[int, Projection], exclude: tuple[int, ...]
) -> Projection | None:
    """The projection (not one in ``exclude``) whose (biased) output ``tensor`` is, through transparent ops
    and bias/LoRA Adds: a depth-first search, left operand first, of at most ``FOLLOW_LIMIT`` tensors."""
    stack, seen = [tensor], set[str]()
    while stack and len(seen) < FOLLOW_LIMIT:
        tensor = stack.pop()
        if tensor in seen:
            continue
        seen.add(tensor)
        i = g.producer.get(tensor)
        if i is None or i in exclude:
            continue
        if i in by_node:
            return by_node[i]
        node = g.nodes[i]
        if node.op_type in TRANSPARENT and node.input:
            stack.append(node.input[0])
        elif node.op_type == "Add":
            # bias Add: one side is a constant vector; LoRA Add: follow the left side first
            consts = [x for x in node.input if g.vector_len(x) is not None]
            if len(consts) == 1:
                stack.extend(x for x in node.input if x != consts[0])
            else:
                stack.extend(reversed(node.input))
    return None


def pair_lora(g: GraphIndex, raw: list[Projection], live: set[str]) -> list[Projection]:
    """Attach unmerged LoRA pairs (plain, or DoRA: ``onnx_dora``; ``live``: the tensors a graph input reaches)
    to their base projections; the base projections, in order."""
    by_node = {p.node: p for p in raw}
    adapters: set[int] = set()
    for b in raw:
        src = g.canonical(b.x)
        a = by_node.get(g.producer.get(src, -1))
        if a is None or a.out_features != b.in_features:
            continue
        rank = a.out_features  # any rank: PEFT allows one at or above min(in, out), and it computes the same
        scale, add, column, lora_side = _scaled_add(g, g.nodes[b.node].output[0], live)
        if add is None:
            continue
        dora = dora_sum(g, add, lora_side, column, b, by_node, live) if column is not None else None
        others = [x for x in g.nodes[add].input if not depends_on(g, x, b.node)] if dora is None else []
        base = by_node[dora.base] if dora is not None else None
        for other in others:
            base = _follow_to_base(g, other, by_node, (a.node, b.node))
            if base is not None:
                break
        if base is None or (base.in_features, base.out_features) != (a.in_features, b.out_features) \
                or g.canonical(base.x) != g.canonical(a.x):  # an adapter reads its base projection's input
            continue
        if base.lora is not None:
            raise PatternError("a projection carries several LoRA adapters, which is not supported")
        if not math.isfinite(scale):
            raise PatternError(f"the LoRA adapter on the {base.in_features}x{base.out_features} projection at "
                               f"node {g.nodes[base.node].name or base.node} is scaled by {scale}, not a finite number")
        base.lora = (rank, round(scale * rank, 6))
        base.lora_nodes = (a.node, b.node)
        base.dora = dora
        adapters.update((a.node, b.node))
    bases = [p for p in raw if p.node not in adapters]
    for p in bases:
        if not p.bias:
            p.bias = _has_bias_add(g, g.nodes[p.node].output[0], p.out_features)
    return bases


def _scaled_add(g: GraphIndex, tensor: str, live: set[str]) -> tuple[float, int | None, int | None, str]:
    """From a LoRA B output: multiply by scalar constants until an Add; (scale, Add node, the one ``Mul`` by a
    constant column vector on the way (DoRA's ``c``) or None, the tensor the Add adds)."""
    scale, column = 1.0, None
    for _ in range(16):
        i = _only_consumer(g, tensor)
        if i is None:
            return scale, None, column, tensor
        node = g.nodes[i]
        if node.op_type in TRANSPARENT:
            tensor = node.output[0]
        elif node.op_type in ("Mul", "Div"):
            other = node.input[1] if node.input[0] == tensor else node.input[0]
            value = g.scalar(other)
            if value is None and _is_scalar_constant(g, other):
                value = 1.0  # stored outside the file and absent: scale unknown, alpha reported as rank
            if value is None and node.op_type == "Mul" and column is None and other not in live:
                column, value = i, 1.0  # c, computed from constants alone
            if value is None or (node.op_type == "Div" and (other != node.input[1] or value == 0)):
                return scale, None, column, tensor
            scale = scale * value if node.op_type == "Mul" else scale / value
            tensor = node.output[0]
        elif node.op_type == "Add":
            return scale, i, column, tensor
        else:
            return scale, None, column, tensor
    return scale, None, column, tensor


def _is_scalar_constant(g: GraphIndex, name: str) -> bool:
    tensor = g.constant_tensor(name)
    return tensor is not None and all(int(d) == 1 for d in tensor.dims)


def depends_on(g: GraphIndex, tensor: str, node: int) -> bool:
    """Whether ``tensor`` is ``node``'s output through transparent ops and scalar Mul/Div."""
    for _ in range(16):
        i = g.producer.get(tensor)
        if i is None:
            return False
        if i == node:
            return True
        n = g.nodes[i]
        if n.op_type in TRANSPARENT:
            tensor = n.input[0]
        elif n.op_type in ("Mul", "Div"):
            tensor = n.input[0] if g.scalar(n.input[0]) is None else n.input[1]
        else:
            return False
    return False


def _has_bias_add(g: GraphIndex, tensor: str, out_features: int) -> bool:
    for _ in range(8):
        i = _only_consumer(g, tensor)
        if i is None:
            return False
        node = g.nodes[i]
        if node.op_type in TRANSPARENT:
            tensor = node.output[0]
        elif node.op_type == "Add":
            other = node.input[1] if node.input[0] == tensor else node.input[0]
            return g.vector_len(other) == out_features
        else:
            return False
    return False
