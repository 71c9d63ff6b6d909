"""A multiplier on every residual branch (Granite's ``residual_multiplier``): ``h = h + m * branch`` for the
attention branch and the MLP branch of every layer.

:func:`branch_multiplier` looks at the node right before each residual ``Add`` that a layer's O or down
projection feeds (its output, through layout ops and the Adds of its bias and LoRA): a ``Mul`` or ``Div`` by a
positive scalar there is the branch's multiplier. Every branch must carry the same one, or none does; those
nodes are explained (``onnx_guard.check_accounted`` leaves them alone). Branches that differ are refused,
naming both.
"""

from __future__ import annotations

import math

from primal_compiler.frontend.onnx_graph import TRANSPARENT, GraphIndex, PatternError

STEPS = 8  # layout ops and bias or LoRA Adds between a projection's MatMul and its multiplier


def branch_multiplier(g: GraphIndex, layers: list) -> tuple[float, set[int]]:
    """(the branches' multiplier, 1.0 for none; the nodes that apply it) of ``layers``' O and down projections."""
    found: list[tuple[str, float]] = []
    nodes: set[int] = set()
    for n, layer in enumerate(layers):
        for what, proj in (("attention", layer.o), ("MLP", layer.mlp_out)):
            i, factor = _multiplier(g, g.nodes[proj.node].output[0])
            found.append((f"the {what} branch of layer {n}", factor))
            if i is not None:
                nodes.add(i)
    first = found[0][1] if found else 1.0
    for where, factor in found:
        if not math.isclose(factor, first, rel_tol=1e-5):
            raise PatternError(f"unsupported residual multiplier: {found[0][0]} is multiplied by {first:g}, {where} "
                               f"by {factor:g} (the replay takes one multiplier for every branch)")
    return first, nodes


def _multiplier(g: GraphIndex, tensor: str) -> tuple[int | None, float]:
    """(the Mul/Div node, its factor) right after the projection output ``tensor``; (None, 1.0) without one."""
    i, into = after_projection(g, tensor)
    if i is None or g.nodes[i].op_type not in ("Mul", "Div"):
        return None, 1.0
    value = g.factor(g.nodes[i], into)
    if value is None or not (math.isfinite(value) and value > 0):
        return None, 1.0
    return i, value


def after_projection(g: GraphIndex, tensor: str) -> tuple[int | None, str]:
    """(the first node that a projection's output ``tensor`` reaches past its own layout ops and the Adds of
    its bias and LoRA, the tensor it reads there); (None, tensor) where the output forks or runs too far."""
    for _ in range(STEPS):
        users = [i for i in g.consumers.get(tensor, ()) if g.nodes[i].op_type not in ("Shape", "Size")]
        if len(users) != 1:
            return None, tensor
        node = g.nodes[users[0]]
        if node.op_type not in TRANSPARENT and not _own_add(g, node, tensor):
            return users[0], tensor
        tensor = node.output[0]
    return None, tensor


def _own_add(g: GraphIndex, node, tensor: str) -> bool:
    """``node`` adds the projection's bias (a constant) or its LoRA (a product of the other side's MatMuls) to
    ``tensor``, not the residual stream."""
    if node.op_type != "Add" or len(node.input) != 2:
        return False
    other = node.input[1] if node.input[0] == tensor else node.input[0]
    if g.constant_tensor(other) is not None:
        return True
    producer = g.node_of(other)
    if producer is None or producer.op_type not in ("Mul", "MatMul"):
        return False
    feeds = [g.node_of(x) for x in producer.input]
    return any(node is not None and node.op_type == "MatMul" for node in feeds)
