"""ALiBi (Bloom): a per-head linear bias on the attention scores, found in the graph and evaluated, never assumed.

ALiBi adds ``slope_h * j`` to the score of every query with key ``j`` in
head ``h`` (Bloom computes ``j`` as ``cumsum(attention_mask) - 1``, MPT
slices a precomputed ``slope_h * (j - positions + 1)`` table; a constant
per query does not change the softmax). A term added to the scores that
does not depend on the token embedding is a mask unless its inputs hold a
``CumSum`` or a float constant of one value or row per head (``[heads,
1, ...]``); such a term is evaluated with ONNX's reference evaluator on a
five-token prompt with every position attended. One that is 0 wherever a
key is attended is a mask; any other must equal ``slope_h * j`` for every
head, query and attended key, up to a constant per query (which the
softmax ignores), with the same slopes in every layer. Anything else is a
:class:`PatternError` naming the node.
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from primal_compiler.frontend.onnx_evaluate import producers, run
from primal_compiler.frontend.onnx_graph import FLOATS, GraphIndex, PatternError

#: Tokens of the prompt the bias is evaluated on.
PROBE_TOKENS = 5


def alibi_slopes(g: GraphIndex, barriers: frozenset[int], anchors: list[int], heads: int) -> tuple[float, ...]:
    """The slopes of the ALiBi bias every layer adds to its scores (Softmax nodes ``anchors``), or ``()``."""
    hidden = _depends_on_tokens(g)
    found: dict[tuple[float, ...], str] = {}
    missing = []
    evaluated: dict[str, tuple[float, ...] | None] = {}  # layers usually add the same tensor
    for anchor in anchors:
        side, _ = g.backward([g.nodes[anchor].input[0]], barriers)
        slopes = None
        for i in sorted(side):
            node = g.nodes[i]
            if node.op_type != "Add":
                continue
            for x in node.input:
                closure, _ = g.backward([x], frozenset())
                if closure & hidden or not _biased(g, closure, heads):
                    continue
                if x not in evaluated:
                    evaluated[x] = _evaluate(g, x, heads, node.name or f"#{i}")
                if evaluated[x] is None:  # a mask
                    continue
                if slopes is not None:
                    raise PatternError(f"unsupported attention at node {node.name or f'#{i}'}: a second bias on "
                                       "the scores besides ALiBi's")
                slopes = evaluated[x]
        if slopes is None:
            missing.append(g.nodes[anchor].name or f"#{anchor}")
        else:
            found.setdefault(slopes, g.nodes[anchor].name or f"#{anchor}")
    if not found:
        return ()
    if missing or len(found) > 1:
        raise PatternError(f"unsupported ALiBi: the attention at {', '.join(missing) or 'some layers'} has "
                           "another bias than the rest")
    return next(iter(found))


def _depends_on_tokens(g: GraphIndex) -> set[int]:
    """Nodes that depend on the token ids through the embedding (the hidden state), not only on the mask."""
    gathers = [n.output[0] for n in g.nodes if n.op_type == "Gather" and g.weight(n.input[0]) is not None]
    reached, _ = g.forward(gathers, frozenset())
    return reached


def _biased(g: GraphIndex, closure: set[int], heads: int) -> bool:
    """The term reads a CumSum of the mask, or a float constant of one value or row per head (Bloom's slopes,
    MPT's precomputed ``[heads, 1, positions]`` table): a candidate bias."""
    for i in closure:
        node = g.nodes[i]
        if node.op_type == "CumSum":
            return True
        for x in node.input:
            tensor = g.constant_tensor(x)
            dims = [int(d) for d in tensor.dims] if tensor is not None else []
            while dims and dims[0] == 1:
                dims.pop(0)
            per_head = dims and dims[0] == heads and (len(dims) == 1 or dims[1] == 1)  # [heads, 1, ...]
            if heads > 1 and per_head and tensor is not None and tensor.data_type in FLOATS:
                return True
    return False


def _evaluate(g: GraphIndex, tensor: str, heads: int, name: str) -> tuple[float, ...] | None:
    """ALiBi's slopes from the term's values on the probe prompt; None when it is a mask only (0 where a key
    is attended, a huge negative number where it is not, which the replay's causal mask already does)."""
    bias = _run(g, producers(g, tensor), tensor)
    if bias is None:
        raise PatternError(f"unsupported bias on the attention scores at node {name}: it cannot be evaluated")
    bias = bias.astype(np.float64)
    attended = bias > -1e30  # masked keys (-inf, float32's lowest) carry no bias
    if not (bias[attended] != 0).any():
        return None
    if bias.size % (heads * PROBE_TOKENS):
        raise PatternError(f"unsupported bias on the attention scores at node {name}: not one row per head")
    values = np.where(attended, bias, np.nan).reshape(heads, -1, PROBE_TOKENS)
    values = values - values[:, :, :1]  # a constant per query does not change its softmax
    slopes = values[:, :1, 1:2]
    want = np.broadcast_to(slopes * np.arange(PROBE_TOKENS)[None, None, :], values.shape)
    seen = ~np.isnan(values)
    if not np.allclose(values[seen], want[seen], rtol=1e-6, atol=1e-6) or not (slopes != 0).all():
        raise PatternError(f"unsupported bias on the attention scores at node {name}: not ALiBi's slope_h * "
                           "(key position) for each head")
    return tuple(float(s) for s in slopes.reshape(-1).astype(np.float32))


def _run(g: GraphIndex, closure: set[int], tensor: str) -> np.ndarray | None:
    """``tensor`` computed from the graph's inputs by the nodes ``closure``, for a probe prompt of ones."""
    feeds: dict[str, np.ndarray] = {}
    used = {x for i in closure for x in g.nodes[i].input if x}
    for i in g.model.graph.input:
        if i.name not in used or i.name in g.inits:
            continue
        if i.name != "attention_mask" and "position" not in i.name and "input_ids" not in i.name:
            return None  # e.g. past key values: not evaluated
        value = np.arange(PROBE_TOKENS) if "position" in i.name else np.ones(PROBE_TOKENS)
        feeds[i.name] = value.reshape(1, -1).astype(helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type))
    return run(g, closure, tensor, feeds)

