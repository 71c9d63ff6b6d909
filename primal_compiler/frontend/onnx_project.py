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


def find_weight_matmuls(g: GraphIndex) -> list[Projection]:
    found: list[Projection] = []
    for i, node in enumerate(g.nodes):
        domain = node.domain or ""
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


def pair_lora(g: GraphIndex, raw: list[Projection]) -> list[Projection]:
    """Attach unmerged LoRA pairs to their base projections; the base projections, in order."""
    by_node = {p.node: p for p in raw}
    adapters: set[int] = set()
    for b in raw:
        src = g.canonical(b.x)
        a = by_node.get(g.producer.get(src, -1))
        if a is None or a.out_features != b.in_features:
            continue
        rank = a.out_features  # any rank: PEFT allows one at or above min(in, out), and it computes the same
        scale, add = _scaled_add(g, g.nodes[b.node].output[0])
        if add is None:
            _refuse_dora(g, b, by_node)
            continue
        others = [x for x in g.nodes[add].input if not depends_on(g, x, b.node)]
        base = None
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
        adapters.update((a.node, b.node))
    bases = [p for p in raw if p.node not in adapters]
    for p in bases:
        if not p.bias:
            p.bias = _has_bias_add(g, g.nodes[p.node].output[0], p.out_features)
    return bases


def _scaled_add(g: GraphIndex, tensor: str) -> tuple[float, int | None]:
    """From a LoRA B output: multiply by scalar constants until an Add; (scale, Add node)."""
    scale = 1.0
    for _ in range(16):
        i = _only_consumer(g, tensor)
        if i is None:
            return scale, None
        node = g.nodes[i]
        if node.op_type in TRANSPARENT:
            tensor = node.output[0]
        elif node.op_type in ("Mul", "Div"):
            other = node.input[1] if node.input[0] == tensor else node.input[0]
            value = g.scalar(other)
            if value is None and _is_scalar_constant(g, other):
                value = 1.0  # stored outside the file and absent: scale unknown, alpha reported as rank
            if value is None or (node.op_type == "Div" and (other != node.input[1] or value == 0)):
                return scale, None
            scale = scale * value if node.op_type == "Mul" else scale / value
            tensor = node.output[0]
        elif node.op_type == "Add":
            return scale, i
        else:
            return scale, None
    return scale, None


def _refuse_dora(g: GraphIndex, b: Projection, by_node: dict[int, Projection]) -> None:
    """A PatternError naming DoRA when LoRA B's output ``b`` is multiplied by a constant vector of its width (each
    output column's magnitude over its norm) on its way to an ``Add`` that reaches a base projection of the
    same shape: PEFT's weight-decomposed LoRA, ``c * (x W + s x A B)``, which is not read yet."""
    tensor = g.nodes[b.node].output[0]
    for _ in range(16):
        i = _only_consumer(g, tensor)
        node = g.nodes[i] if i is not None else None
        if node is None or node.op_type not in ("Mul", "Div", *TRANSPARENT):
            return
        other = [x for x in node.input if x != tensor]
        if node.op_type == "Mul" and len(other) == 1 and g.vector_len(other[0]) == b.out_features > 1:
            _, add = _scaled_add(g, node.output[0])
            seen = {g.nodes[add].input[k] for k in (0, 1)} if add is not None else set()
            if any(_reaches_projection(g, x, by_node, b.out_features) for x in seen):
                raise PatternError(f"weight-decomposed LoRA (DoRA): the adapter on the {b.in_features}x"
                                   f"{b.out_features} B at node {g.nodes[b.node].name or b.node} is rescaled per "
                                   f"output column at node {node.name or i} (a magnitude vector of "
                                   f"{b.out_features} values), which is not supported yet; merge it into the "
                                   "weights or train a plain LoRA")
            return
        tensor = node.output[0]


def _reaches_projection(g: GraphIndex, tensor: str, by_node: dict[int, Projection], width: int) -> bool:
    """Whether ``tensor`` is computed from a projection ``width`` wide through elementwise ops (DoRA's
    ``(c - 1) * x W`` and its sums), a few steps back."""
    todo, seen = [tensor], 0
    while todo and seen < 32:
        seen += 1
        i = g.producer.get(todo.pop())
        if i is None:
            continue
        if i in by_node:
            if by_node[i].out_features == width:
                return True
            continue
        if g.nodes[i].op_type in ("Mul", "Add", "Sub", *TRANSPARENT):
            todo.extend(x for x in g.nodes[i].input if x)
    return False


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
