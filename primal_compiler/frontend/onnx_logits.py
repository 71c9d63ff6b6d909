"""What a model does to its logits after the LM head: a scalar scale (Cohere's ``logit_scale``, Granite's
``logits_scaling``) and a soft-cap, ``cap * tanh(x / cap)`` (Gemma 2's ``final_logit_softcapping``).

:func:`logit_tail` follows the LM head's output (past its bias and layout ops) through multiplications and
divisions by positive scalars and at most one ``Tanh`` followed by a multiplication by a scalar to a graph
output: the factors before the ``Tanh`` make ``scale / cap``, the one after it ``cap``; with no ``Tanh``
they make ``scale``. The nodes it reads are the tail; any other node after the LM head is left to
``onnx_guard.check_accounted``, which refuses it naming the node. A tail that computes anything else (a
negative or zero factor, a second ``Tanh``, a ``Tanh`` not followed by its cap) is refused here, naming it.
"""

from __future__ import annotations

import math

from primal_compiler.frontend.onnx_graph import TRANSPARENT, GraphIndex, PatternError


def logit_tail(g: GraphIndex, head_node: int, head_bias: bool) -> tuple[float, float, set[int]]:
    """(scale, soft-cap or 0, the tail's nodes) after the LM head node ``head_node``, past its bias Add when it
    was read with one (``head_bias``) (module docstring)."""
    tensor, nodes = g.nodes[head_node].output[0], set[int]()
    factor, cap, capped = 1.0, 0.0, False
    for _ in range(16):
        users = [i for i in g.consumers.get(tensor, ()) if g.nodes[i].op_type not in ("Shape", "Size")]
        if len(users) != 1 or tensor in g.graph_outputs:
            break
        i, node = users[0], g.nodes[users[0]]
        label = f"node {node.name or '#' + str(i)} ({node.op_type}) after the LM head"
        if node.op_type in TRANSPARENT or (node.op_type == "Add" and head_bias and not nodes):
            tensor = node.output[0]
            continue
        if node.op_type == "Tanh":
            if capped or cap:
                raise PatternError(f"unsupported {label}: a second soft-cap of the logits")
            capped = True
        elif node.op_type in ("Mul", "Div"):
            value = g.factor(node, tensor)
            if value is None:
                break  # not a scale: check_accounted names it
            if not (math.isfinite(value) and value > 0):
                raise PatternError(f"unsupported {label}: the logits multiplied by {value:g}, not a positive scale")
            if capped and not cap:
                cap = value
            elif cap:
                raise PatternError(f"unsupported {label}: a factor after the logits' soft-cap")
            else:
                factor *= value
        else:
            break
        nodes.add(i)
        tensor = node.output[0]
    if capped and not cap:
        raise PatternError("unsupported Tanh after the LM head: not followed by the multiplication by its cap")
    return (factor * cap if cap else factor), cap, nodes

