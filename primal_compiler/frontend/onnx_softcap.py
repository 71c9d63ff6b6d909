"""Soft-capped attention scores (Gemma 2's ``attn_logit_softcapping``): ``cap * tanh(s / cap)`` between the
scaled scores and the softmax.

:func:`attention_softcap` finds, on each layer's score side (the nodes feeding its softmax), at most one
``Tanh`` whose input is the scores divided by a scalar (or multiplied by its inverse) and whose one user
multiplies it by that scalar again. Those three nodes are the cap; the scores' other factors are the
attention scale and must all come before it (the replay scales, then caps). Every layer caps at the same
value or none does. Anything else (a second ``Tanh``, a cap whose two constants differ, a factor after the
cap, layers that differ) is refused naming the node.
"""

from __future__ import annotations

import math

from primal_compiler.frontend.onnx_graph import GraphIndex, PatternError


def attention_softcap(g: GraphIndex, barriers: frozenset[int], score_side: dict[int, set[int]]) -> tuple[float, set[int]]:
    """(the cap, 0 for none; the nodes that compute it in every layer) of the layers' ``score_side`` nodes."""
    caps: dict[int, float] = {}
    nodes: set[int] = set()
    for n, side in score_side.items():
        tanhs = sorted(i for i in side if g.nodes[i].op_type == "Tanh")
        if not tanhs:
            caps[n] = 0.0
            continue
        if len(tanhs) > 1:
            raise PatternError(f"unsupported attention in layer {n}: two Tanh on its scores (nodes "
                               f"{_name(g, tanhs[0])} and {_name(g, tanhs[1])})")
        t = tanhs[0]
        pre = g.producer.get(g.nodes[t].input[0], -1)
        users = g.consumers.get(g.nodes[t].output[0], [])
        post = users[0] if len(users) == 1 else -1
        inward = _factor(g, pre) if pre >= 0 else None
        outward = _factor(g, post) if post >= 0 else None
        if inward is None or outward is None or not math.isclose(1.0 / inward, outward, rel_tol=1e-3):
            raise PatternError(f"unsupported Tanh on the attention scores of layer {n} at node {_name(g, t)}: not "
                               "a soft-cap (the scores divided by a constant, then multiplied by it)")
        below = g.forward([g.nodes[post].output[0]], barriers)[0] & side
        late = sorted(i for i in below if g.nodes[i].op_type in ("Mul", "Div") and _factor(g, i) is not None)
        if late:
            raise PatternError(f"unsupported attention scale in layer {n} at node {_name(g, late[0])}: after the "
                               "scores' soft-cap (the replay scales them, then caps)")
        caps[n] = outward
        nodes |= {pre, t, post}
    first = next(iter(caps.values()), 0.0)
    for n, cap in caps.items():
        if not math.isclose(cap, first, rel_tol=1e-5):
            raise PatternError(f"unsupported attention soft-cap: layer 0 caps its scores at {first:g}, layer {n} at "
                               f"{cap:g} (the replay takes one cap for every layer)")
    return first, nodes


def _factor(g: GraphIndex, i: int) -> float | None:
    """What node ``i`` multiplies its other input by, when it is a Mul or a Div by a positive scalar."""
    value = g.factor(g.nodes[i])
    return value if value is not None and math.isfinite(value) and value > 0 else None


def _name(g: GraphIndex, i: int) -> str:
    return g.nodes[i].name or f"#{i}"
