"""Sliding-window attention (Mistral v0.1, Gemma 2 and 3): a layer whose queries see only the last ``W`` keys.

An exporter writes the window into the attention mask as a comparison of
positions with a constant offset: ``key > query - W`` (transformers' sliding
causal mask, ``torch.onnx`` dynamo: ``Greater(arange, Sub(arange, W))``).
:func:`windows` reads, for every layer, the comparisons the mask of its
softmax depends on. Written ``L > S + c`` (a non-strict ``>=`` is ``> c - 1``,
``<`` and ``<=`` swap their sides), where ``L`` and ``S`` are positions
shifted by constants read through layout ops: a comparison without an offset
(or with ``c = -1``, ``key < query + 1``) is the causal part; one with
``c < -1`` is a window of ``W = -c`` keys, the query's own included. An offset comparison of another sign, a window that
differs between two comparisons of one layer, and a fused attention op with
a ``local_window_size`` are refused, naming the node.
"""

from __future__ import annotations

from primal_compiler.frontend.onnx_decoder import Decoder, g_name
from primal_compiler.frontend.onnx_graph import TRANSPARENT, PatternError, attr
from primal_compiler.frontend.onnx_heads import Core

COMPARE = {"Greater": (False, False), "GreaterOrEqual": (False, True), "Less": (True, False),
           "LessOrEqual": (True, True)}
"""Comparison op: (its sides swapped to read it as ``>``, non-strict)."""


def windows(dec: Decoder, cores: list[Core]) -> list[int]:
    """Keys each layer's queries see (0: all of them, causal), one entry per attention core."""
    g, out = dec.g, []
    for n, core in enumerate(cores):
        node = g.nodes[core.anchor]
        if node.op_type != "Softmax":
            if (attr(node, "local_window_size", -1) or -1) > 0:
                raise PatternError(f"unsupported sliding-window attention at node {g_name(g, core.anchor)} "
                                   f"(local_window_size {attr(node, 'local_window_size')} of a fused op)")
            out.append(0)
            continue
        reached, _ = g.backward([node.input[0]], dec.barriers)
        found: dict[int, int] = {}
        for i in sorted(reached):
            cmp = g.nodes[i]
            if cmp.op_type not in COMPARE or len(cmp.input) != 2:
                continue
            swap, inclusive = COMPARE[cmp.op_type]
            big, small = (cmp.input[1], cmp.input[0]) if swap else (cmp.input[0], cmp.input[1])
            d_big, d_small = _offset(dec, big), _offset(dec, small)
            c = d_small - d_big - (1 if inclusive else 0)
            if d_big == d_small == 0 or c == -1:
                continue  # the causal comparison (key <= query, key < query + 1)
            if c >= 0:
                raise PatternError(f"unsupported attention mask in layer {n} at node {g_name(g, i)}: a position "
                                   f"comparison with offset {c}, not a sliding window")
            found[i] = -c
        if len(set(found.values())) > 1:
            a, b = sorted(found)[:2]
            raise PatternError(f"unsupported attention mask in layer {n}: windows of {found[a]} (node {g_name(g, a)}) "
                               f"and {found[b]} (node {g_name(g, b)}) keys")
        out.append(next(iter(found.values()), 0))
    return out


def _offset(dec: Decoder, tensor: str) -> int:
    """The integer constant ``tensor`` adds to a position (``x + d``, ``x - d``) read back through layout ops."""
    g = dec.g
    for _ in range(8):
        node = g.node_of(tensor)
        if node is None:
            return 0
        if node.op_type in TRANSPARENT or node.op_type == "Expand":
            tensor = node.input[0]
            continue
        if node.op_type in ("Add", "Sub") and len(node.input) == 2:
            values = [g.const(x) for x in node.input]
            at = [(k, v) for k, v in enumerate(values) if v is not None and v.size == 1 and v.dtype.kind in "iu"]
            if len(at) == 1 and (node.op_type == "Add" or at[0][0] == 1):
                d = int(at[0][1].reshape(-1)[0])
                return d if node.op_type == "Add" else -d
        return 0
    return 0
