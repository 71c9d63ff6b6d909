"""Partial rotary embeddings (GPT-NeoX, Phi-2): verify that the first ``dim`` dimensions of each head rotate.

A graph with partial rotary cuts every query and key head in two along its
last axis, ``x[..., :dim]`` and ``x[..., dim:]``, rotates the first part
with the cosine and sine tables and joins the parts back,
``Concat(rotated, x[..., dim:])``. :func:`check_partial` finds each such
join (a ``Concat`` on the last axis whose second input is a ``Slice``
``[dim:]`` of some tensor and whose first input depends on the ``Slice``
``[:dim]`` of the same tensor) and requires every multiplication by a
cosine or sine to feed the rotated side of one of them. Anything else
(the rotated dimensions elsewhere in the head, interleaved pairs, a table
applied to a whole head) is a :class:`PatternError` naming a node.
"""

from __future__ import annotations

from primal_compiler.frontend.onnx_graph import GraphIndex, PatternError, attr

#: Axes that mean "the last one" of a [batch, heads, seq, head_dim] tensor.
LAST = (-1, 3)
#: An ``ends`` value this large means "to the end of the axis".
TO_END = 1 << 31


def _bounds(g: GraphIndex, node) -> tuple[int, int] | None:
    """(start, end) of a ``Slice`` along the last axis with unit step, from its constant inputs; else None."""
    inputs = list(node.input) + [""] * 5
    values = [g.const(x) if x else None for x in inputs[1:5]]
    starts, ends, axes, steps = values
    if starts is None or ends is None or starts.size != 1 or ends.size != 1:
        return None
    if axes is None or axes.size != 1 or int(axes.reshape(-1)[0]) not in LAST:
        return None
    if steps is not None and (steps.size != 1 or int(steps.reshape(-1)[0]) != 1):
        return None
    return int(starts.reshape(-1)[0]), int(ends.reshape(-1)[0])


def _joins(g: GraphIndex, dim: int, head_dim: int) -> list[set[int]]:
    """The nodes on the rotated side of every verified join."""
    found = []
    for node in g.nodes:
        if node.op_type != "Concat" or len(node.input) != 2 or attr(node, "axis", 0) not in LAST:
            continue
        tail = g.node_of(node.input[1])
        bounds = _bounds(g, tail) if tail is not None and tail.op_type == "Slice" else None
        if bounds is None or bounds[0] != dim or min(bounds[1], TO_END) < head_dim:
            continue
        reached, _ = g.backward([node.input[0]], frozenset())
        heads = [i for i in reached if g.nodes[i].op_type == "Slice" and g.nodes[i].input[0] == tail.input[0]
                 and _bounds(g, g.nodes[i]) == (0, dim)]
        if heads:
            found.append(reached)
    return found


def check_partial(g: GraphIndex, dim: int, head_dim: int) -> None:
    """Raise :class:`PatternError` unless the cos/sin tables rotate exactly the first ``dim`` of each head."""
    if dim % 2 or not 0 < dim < head_dim:
        raise PatternError(f"unsupported partial rotary: {dim} rotated dimensions of a {head_dim}-dimension head")
    joins = _joins(g, dim, head_dim)
    uses = _table_uses(g)
    if not joins:
        name = g.nodes[uses[0]].name if uses else "RoPE"
        raise PatternError(f"unsupported partial rotary at node {name}: no query or key head is cut into its first "
                           f"{dim} dimensions (rotated) and the rest (passed through)")
    for i in uses:
        if not any(i in side for side in joins):
            node = g.nodes[i]
            raise PatternError(f"unsupported partial rotary at node {node.name or node.op_type} (Mul): it applies "
                               f"the rotary tables outside the first {dim} dimensions of a head")


#: Ops that only reshape or select a cosine or sine table on its way to the rotation.
TABLE_OPS = frozenset({"Unsqueeze", "Squeeze", "Cast", "CastLike", "Identity", "Slice", "Gather", "Reshape",
                       "Expand", "Transpose"})


def _table_uses(g: GraphIndex) -> list[int]:
    """The ``Mul`` nodes that multiply something by a cosine or sine table."""
    tables = {o for n in g.nodes if n.op_type in ("Cos", "Sin") for o in n.output}
    frontier = set(tables)
    while frontier:
        more = {o for t in frontier for i in g.consumers.get(t, ()) if g.nodes[i].op_type in TABLE_OPS
                and g.nodes[i].input[0] == t for o in g.nodes[i].output} - tables
        tables |= more
        frontier = more
    return sorted({i for t in tables for i in g.consumers.get(t, ()) if g.nodes[i].op_type == "Mul"})
