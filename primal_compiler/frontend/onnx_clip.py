"""Clamped queries, keys and values (OLMo's ``clip_qkv``): ``Clip(min=-c, max=c)`` right after every q, k
and v projection (or the fused qkv one), past its bias and LoRA.

:func:`qkv_clip` reads it from each layer's attention projections: a ``Clip`` whose bounds are constants
``-c`` and ``c`` (inputs from opset 11, attributes before), the same ``c`` on every projection of every layer,
or none on any. Those nodes are explained (``onnx_guard.check_accounted`` leaves them alone); anything else
(bounds that are not symmetric, projections that differ) is refused naming the node.
"""

from __future__ import annotations

import math

from primal_compiler.frontend.onnx_branches import after_projection
from primal_compiler.frontend.onnx_graph import GraphIndex, PatternError, attr


def qkv_clip(g: GraphIndex, layers: list) -> tuple[float, set[int]]:
    """(the clamp ``c``, 0 for none; the Clip nodes) of ``layers``' attention projections."""
    found: list[tuple[str, float]] = []
    nodes: set[int] = set()
    for n, layer in enumerate(layers):
        for proj in layer.attn:
            i, _ = after_projection(g, g.nodes[proj.node].output[0])
            c = 0.0
            if i is not None and g.nodes[i].op_type == "Clip":
                c = _bound(g, i)
                nodes.add(i)
            found.append((f"layer {n}'s projection at node {g.nodes[proj.node].name or proj.node}", c))
    first = found[0][1] if found else 0.0
    for where, c in found:
        if not math.isclose(c, first, rel_tol=1e-6):
            raise PatternError(f"unsupported clip of q/k/v: {found[0][0]} is clamped to {first:g}, {where} to {c:g} "
                               "(the replay takes one clamp for every projection)")
    return first, nodes


def _bound(g: GraphIndex, i: int) -> float:
    """The ``c`` of a ``Clip`` node to [-c, c]; PatternError naming it otherwise."""
    node = g.nodes[i]
    low = g.scalar(node.input[1]) if len(node.input) > 1 and node.input[1] else attr(node, "min", None)
    high = g.scalar(node.input[2]) if len(node.input) > 2 and node.input[2] else attr(node, "max", None)
    if low is None or high is None or not (math.isfinite(high) and high > 0 and math.isclose(-float(low), high)):
        raise PatternError(f"unsupported Clip at node {node.name or i} after a q/k/v projection: bounds {low} and "
                           f"{high}, not -c and c")
    return float(high)
