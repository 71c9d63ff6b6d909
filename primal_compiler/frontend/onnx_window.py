"""Attention masks: sliding windows (Mistral v0.1, Gemma 2 and 3), and what a mask adds to the scores.

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
a ``local_window_size`` are refused, naming the node, as is a window longer
than the positions a learned position table holds.

The replay masks causally (and by window): it takes a mask's values as
"attend" or "never". So every constant a mask puts on the scores (a float
branch of a ``Where``, a square float table added to them, or the table it
is sliced from) must be 0 or at most
:data:`NEVER` (a finfo.min or -inf fill), and a ``Where`` between two
constants picks one of each; another value (a mask adding +1e9, or a bias)
is refused naming the node, never replayed as causal. A constant
square table must also be causal: 0 on and below its diagonal, at most
:data:`NEVER` above.
"""

from __future__ import annotations

import numpy as np

from primal_compiler.frontend.onnx_decoder import Decoder, g_name
from primal_compiler.frontend.onnx_graph import TRANSPARENT, PatternError, attr
from primal_compiler.frontend.onnx_heads import Core

NEVER = -1e4  # a mask value at or below this leaves exp(score + value) zero in float32 for any score the replay meets

COMPARE = {"Greater": (False, False), "GreaterOrEqual": (False, True), "Less": (True, False),
           "LessOrEqual": (True, True)}
"""Comparison op: (its sides swapped to read it as ``>``, non-strict)."""


def windows(dec: Decoder, cores: list[Core], positions: int = 0) -> list[int]:
    """Keys each layer's queries see (0: all of them, causal), one entry per attention core; each softmax's mask
    constants are checked first (:func:`_check_fills`). A window longer than the model's ``positions`` (when
    known: the rows of a learned position table) is refused naming its node: it could never bite."""
    g, out = dec.g, []
    for n, core in enumerate(cores):
        node = g.nodes[core.anchor]
        if node.op_type != "Softmax":
            if (attr(node, "local_window_size", -1) or -1) > 0:
                raise PatternError(f"unsupported sliding-window attention at node {g_name(g, core.anchor)} "
                                   f"(local_window_size {attr(node, 'local_window_size')} of a fused op)")
            out.append(0)
            continue
        score_inputs = {g.producer[t] for t in (core.q_in, core.k_in) if t in g.producer}
        reached, _ = g.backward([node.input[0]], dec.barriers, stop=score_inputs)
        _check_fills(dec, reached - score_inputs, n)
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
            if positions and -c > positions:
                raise PatternError(f"unsupported attention mask in layer {n} at node {g_name(g, i)}: a sliding window "
                                   f"of {-c} keys, longer than the model's {positions} positions")
            found[i] = -c
        if len(set(found.values())) > 1:
            a, b = sorted(found)[:2]
            raise PatternError(f"unsupported attention mask in layer {n}: windows of {found[a]} (node {g_name(g, a)}) "
                               f"and {found[b]} (node {g_name(g, b)}) keys")
        out.append(next(iter(found.values()), 0))
    return out


def _check_fills(dec: Decoder, region: set[int], n: int) -> None:
    """Refuse a constant the mask of layer ``n``'s scores (nodes ``region``) adds that is neither 0 nor
    :data:`NEVER` or below, a ``Where`` choosing between two such constants that are not one of each, and a
    square table that is not causal (module docstring)."""
    g = dec.g
    for i in sorted(region):
        node = g.nodes[i]
        if node.op_type not in ("Where", "Add"):
            continue
        values = [_table(dec, x) for x in (node.input[1:3] if node.op_type == "Where" else node.input)]
        fills = [v for v in values if v is not None and v.dtype.kind == "f" and (v.size == 1 or _square(v))]
        for value in fills:  # (a table of another shape, such as ALiBi's per-head biases, is read elsewhere)
            odd = value[(value != 0) & ~(value <= NEVER)]
            if odd.size:
                raise PatternError(f"unsupported attention mask in layer {n} at node {g_name(g, i)}: it adds "
                                   f"{float(odd.reshape(-1)[0]):g} to scores (a mask adds 0 or at most {NEVER:g})")
            if value.size > 1 and not np.array_equal(value.reshape(value.shape[-2:]) <= NEVER,
                                                     np.triu(np.ones(value.shape[-2:], bool), 1)):
                raise PatternError(f"unsupported attention mask in layer {n} at node {g_name(g, i)}: its "
                                   f"{value.shape[-2]}x{value.shape[-1]} table is not causal")
        if node.op_type == "Where" and len(fills) == 2 and sorted(bool(v.max() <= NEVER) for v in fills) != [
                False, True]:
            raise PatternError(f"unsupported attention mask in layer {n} at node {g_name(g, i)}: it chooses between "
                               f"{float(fills[0].max()):g} and {float(fills[1].max()):g}, not 0 and a large negative")


def _square(value: np.ndarray) -> bool:
    """A table of one score per (query, key): square in its last two axes, every other axis 1."""
    return value.ndim >= 2 and value.shape[-1] == value.shape[-2] and value.size == value.shape[-1] ** 2


def _table(dec: Decoder, tensor: str) -> np.ndarray | None:
    """The constant ``tensor`` is, or is cut or reshaped from (a ``Slice`` of a precomputed mask), else None."""
    g = dec.g
    for _ in range(4):
        value = g.const(tensor, limit=1 << 22)
        node = g.node_of(tensor)
        if value is not None or node is None or node.op_type not in ("Slice", "Reshape", "Unsqueeze", "Expand"):
            return value
        tensor = node.input[0]
    return None


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
