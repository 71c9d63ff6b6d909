"""Never silently wrong: every node on a recognised decoder's hidden-state path belongs to a recognised pattern.

The hidden-state path is every node that depends on the token embedding
and that the LM head depends on, and every node after the LM head (shape
computations, masks and RoPE tables do not depend on the embedding). On it,
outside the projections (and their LoRA scale), each node must:

* be an op of :data:`KNOWN_OPS` (data movement, arithmetic, norms,
  attention); anything else is refused naming the node;
* be a norm op (``LayerNormalization``, ``ReduceMean``...) only inside a
  recognised norm (before a layer's attention or MLP, after either branch
  (a sandwich), on its q and k heads, or the final norm);
* be an activation op (``Tanh``, ``Erf``, ``Sigmoid``, ``Gelu``...) only
  inside an MLP's activation, whose nodes must compute the recognised kind
  (``onnx_activation`` evaluates them; Gemma-2's soft-capping ``Tanh`` is
  refused);
* multiply or divide by a constant only where the pattern says so: a
  norm's ``[hidden]`` scale (the one ``onnx_params`` reads), inside a
  verified activation, rotate-half's ``-1`` and the attention scale on the
  query/key side, whose product must be ``1 / sqrt(head_dim)`` per layer,
  the embedding scale (:func:`embed_scale`); a multiplier of exactly 1 is
  harmless anywhere. Any other constant multiplier is refused naming the
  node;
* add a constant only as a projection's bias, a norm's bias or epsilon,
  inside a verified activation or the attention (masks), or to the token
  embedding as a static export's folded positions (:func:`folded_positions`:
  one row per position; any other constant there is refused).

A mixture of experts is refused as one before any pattern is sought (:func:`refuse_experts`).
"""

from __future__ import annotations

import math

import numpy as np

from primal_compiler.frontend.onnx_activation import activation_start, verify_activation
from primal_compiler.frontend.onnx_graph import HALF_EPS, TRANSPARENT, GraphIndex, PatternError, attr
from primal_compiler.frontend.onnx_softcap import attention_softcap
from primal_compiler.frontend.onnx_params import feeds_root

#: Ops a recognised pattern may contain on the hidden-state path (besides the projections).
KNOWN_OPS = frozenset({
    *TRANSPARENT, "Transpose", "Concat", "Slice", "Split", "Gather", "GatherND", "Expand", "Tile",
    "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Reciprocal", "ReduceMean", "Neg", "Where", "IsNaN", "Softmax", "MatMul",
    "LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization", "SkipLayerNormalization",
    "SkipSimplifiedLayerNormalization", "Attention", "MultiHeadAttention", "GroupQueryAttention",
    "RotaryEmbedding", "Tanh", "Erf", "Sigmoid", "Relu", "Gelu", "FastGelu", "BiasGelu",
})
#: Ops allowed only inside a recognised norm (before a layer's attention or MLP, or the LM head).
NORM_ONLY = frozenset({"LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization",
                       "SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "ReduceMean"})
#: Ops allowed only inside an MLP activation.
ACTIVATION_ONLY = frozenset({"Tanh", "Erf", "Sigmoid", "Relu", "Gelu", "FastGelu", "BiasGelu"})


#: Ops that route tokens to experts: TopK over a router's scores (every torch.onnx export of Mixtral, Qwen-MoE,
#: OLMoE, DeepSeek-MoE) and onnxruntime's fused mixture-of-experts contrib ops.
EXPERT_OPS = frozenset({"TopK", "MoE", "QMoE", "SparseMoE"})


def refuse_experts(g: GraphIndex) -> None:
    """A mixture of experts is refused as one, naming the routing node, before any pattern is sought (its
    expert MLPs would otherwise be refused as whatever pattern they first fail)."""
    for i, node in enumerate(g.nodes):
        if node.op_type in EXPERT_OPS:
            label = f"node {node.name or '#' + str(i)} ({node.op_type})"
            raise PatternError(f"a mixture of experts: {label} routes each token to its top experts; "
                               "mixture-of-experts models are not supported yet")


def refuse_quantized_activations(g: GraphIndex) -> None:
    """A ``QuantizeLinear`` of a computed tensor left after ``onnx_quant.dequantize_graph`` (which reads each
    one that ``DequantizeLinear`` reads back at its own scale, static QDQ) is refused naming the node, before
    any pattern is sought (the quantized constants would otherwise be refused as whatever pattern they first
    break)."""
    for i, node in enumerate(g.nodes):
        if node.op_type == "QuantizeLinear" and node.input and g.constant_tensor(node.input[0]) is None:
            raise PatternError(f"quantized activations: node {node.name or '#' + str(i)} (QuantizeLinear) quantizes "
                               f"the computed tensor {node.input[0]!r} and nothing reads it back at the same scale "
                               "(QDQ pairs are read, as the float they round)")


def folded_positions(g: GraphIndex, x: str, hidden: int):
    """The constant a static-shape export adds to the token embedding for its positions (``wpe[arange(S)]``
    folded into ``[1.., S, hidden]``, S > 1), or None: a broadcast ``[hidden]`` vector is no position table."""
    tensor = g.constant_tensor(x)
    dims = [int(d) for d in tensor.dims] if tensor is not None else []
    ok = len(dims) >= 2 and dims[-1] == hidden and all(d == 1 for d in dims[:-2]) and dims[-2] > 1
    return tensor if ok else None


def embed_scale(g: GraphIndex, gather: int) -> tuple[float, int | None]:
    """The constant the token embedding is multiplied by right after its Gather (Gemma: sqrt(hidden)), and the
    Mul/Div node; ``(1.0, None)`` when there is none."""
    tensor = g.nodes[gather].output[0]
    for _ in range(8):
        users = [i for i in g.consumers.get(tensor, ()) if g.nodes[i].op_type not in ("Shape", "Size")]
        if len(users) != 1:
            return 1.0, None
        node = g.nodes[users[0]]
        if node.op_type in TRANSPARENT:
            tensor = node.output[0]
            continue
        value = g.factor(node, tensor)
        if value is None:
            return 1.0, None
        if not (math.isfinite(value) and value > 0):
            raise PatternError(f"unsupported embedding scale {value:g} at node {node.name or users[0]}")
        return value, users[0]
    return 1.0, None


def check_accounted(dec, layers: list, lm_head, norm_regions: list[set[int]], norm_params: set[str],
                    embed_nodes: set[int], logit_nodes: set[int]) -> tuple[float, float]:
    """Refuse (:class:`PatternError` naming the node) the first node of the hidden-state path no pattern explains;
    return the scale of the attention scores when every layer scales them by one constant other than
    1/sqrt(head_dim) (Gemma's ``query_pre_attn_scalar``), else 0, and their soft-cap (``onnx_softcap``), else
    0. Layers that differ are refused.

    ``norm_regions`` are the nodes of every norm, ``norm_params`` the scale and bias tensors read for them,
    ``logit_nodes`` nodes other recognisers explain: the logits' scale and soft-cap after the LM head
    (``onnx_logits``), the residual branches' multiplier (``onnx_branches``).
    """
    g = dec.g
    start = min(embed_nodes)
    down, _ = g.forward(g.nodes[start].output, frozenset())
    up, _ = g.backward([lm_head.x], frozenset())
    after, _ = g.forward(g.nodes[lm_head.node].output, frozenset())  # to the logits (soft-capping, ...)
    path = ((down & up) | after) - set(dec.owner) - embed_nodes - _lora_scales(dec) - logit_nodes
    in_norm = set().union(*norm_regions) if norm_regions else set()
    attn_of, score_side = {}, {}
    for n, layer in enumerate(layers):
        for i in _between(dec, layer.attn, layer.o.x):
            attn_of[i] = n
        softmax = g.nodes[layer.core.anchor]
        score_side[n] = g.backward([softmax.input[0]], dec.barriers)[0] if softmax.op_type == "Softmax" else set()
    softcap, cap_nodes = attention_softcap(g, dec.barriers, score_side)
    path -= cap_nodes
    verified = set().union(*(_activation(dec, n, layer) for n, layer in enumerate(layers)))
    product: dict[int, float | None] = {n: 1.0 for n in range(len(layers))}  # None: the runtime's default
    slack = dict.fromkeys(product, 1e-5)  # relative: float32's digits, plus each half-precision factor's rounding
    hidden = lm_head.in_features
    folded = set()
    for c in sorted({c for e in embed_nodes for t in g.nodes[e].output for c in g.consumers.get(t, ())} - embed_nodes):
        node = g.nodes[c]
        if node.op_type not in ("Add", "Sub") or not any(_is_const(g, x) for x in node.input):
            continue
        if not any(folded_positions(g, x, hidden) is not None for x in node.input):
            raise PatternError(f"unsupported constant added at node {node.name or '#' + str(c)} ({node.op_type}) "
                               f"to the token embedding: not a table of one row per position")
        folded.add(c)
    biases = _bias_adds(dec) | folded
    for i in sorted(path):
        node = g.nodes[i]
        label = f"node {node.name or '#' + str(i)} ({node.op_type})"
        if node.op_type not in KNOWN_OPS:
            raise PatternError(f"unsupported {label} in the decoder: no recognised pattern contains it")
        if node.op_type in ACTIVATION_ONLY and i not in verified:
            raise PatternError(f"unsupported {label} outside an MLP activation (e.g. soft-capping)")
        if node.op_type in NORM_ONLY and i not in in_norm:
            raise PatternError(f"unsupported {label}: a norm that is not the one before a layer's attention or MLP "
                               "or the final norm (e.g. a norm on a fused qkv's queries)")
        if node.op_type in ("Mul", "Div") and i in score_side.get(attn_of.get(i, -1), ()) \
                and any(g.producer.get(x) not in down and _shape_derived(g, x) for x in node.input):
            product[attn_of[i]] = None  # SDPA's default scale, from the runtime head size (TorchScript)
        elif node.op_type in ("Add", "Sub") and any(_is_const(g, x) for x in node.input):
            in_a_norm = i in in_norm and (_is_eps(g, node) or any(x in norm_params for x in node.input))
            if not (in_a_norm or i in verified or i in attn_of or i in biases):
                where = "after the LM head" if i in after else "on the residual stream or the MLP"
                raise PatternError(f"unsupported constant added at {label} {where}")
        elif node.op_type in ("Mul", "Div"):
            place = "after the LM head" if i in after else None
            if i not in verified:
                _constant_multiplier(g, node, i, label, norm_params if i in in_norm else None, attn_of, score_side,
                                     product, place, slack)
    custom = {}  # layer -> its scale, where it is not 1/sqrt(head_dim)
    for n, layer in enumerate(layers):
        softmax = g.nodes[layer.core.anchor]
        want = 1 / math.sqrt(layer.head_dim)
        if softmax.op_type != "Softmax":
            scale = attr(softmax, "scale")
            product[n] = want if scale is None else float(scale)
        got = product[n]
        if got is not None and not math.isclose(got, want, rel_tol=slack[n]):
            if not (math.isfinite(got) and got > 0):
                raise PatternError(f"unsupported attention scale in layer {n} at node "
                                   f"{softmax.name or layer.core.anchor}: scores are scaled by {got:.6g}")
            custom[n] = got
    if not custom:
        return 0.0, softcap
    first = min(custom)
    other = next((n for n in range(len(layers)) if n not in custom or not math.isclose(
        custom[n], custom[first], rel_tol=slack[n] + slack[first])), None)
    if other is not None:
        was = f"{custom[other]:.6g}" if other in custom else "1/sqrt(head_dim)"
        raise PatternError(f"unsupported attention scale: layer {first} scales its scores by {custom[first]:.6g}, "
                           f"layer {other} by {was} (the replay takes one scale for every layer)")
    return custom[first], softcap


def _constant_multiplier(g, node, i, label, norm_params, attn_of, score_side, product, where, slack) -> None:
    consts = [(k, g.const(x, limit=1 << 16)) for k, x in enumerate(node.input)]
    consts = [(k, v) for k, v in consts if v is not None]
    if not consts or len(consts) == len(node.input):
        return
    k, value = consts[0]
    rounding = HALF_EPS.get(value.dtype.name, 0.0)  # a half-precision factor is off by up to its rounding
    value = value.astype(np.float64).reshape(-1)
    if value.size and (value == 1.0).all():
        return
    if norm_params is not None:
        if node.op_type == "Mul" and node.input[k] in norm_params:
            return  # the norm's scale, as onnx_params read it
        raise PatternError(f"unsupported constant multiplier {_show(value)} at {label} between the residual stream "
                           "and a projection")
    n = attn_of.get(i)
    if n is not None and value.size == 1 and i in score_side[n] and not (node.op_type == "Div" and k == 0):
        if value[0] == -1.0 and _feeds_concat(g, node):
            return  # rotate_half
        if product[n] is not None:
            product[n] *= value[0] if node.op_type == "Mul" else 1.0 / value[0]
            slack[n] += rounding
        return
    where = where or (f"in the attention of layer {n}" if n is not None else "on the residual stream or the MLP")
    raise PatternError(f"unsupported constant multiplier {_show(value)} at {label} {where}")


def _activation(dec, n: int, layer) -> set[int]:
    """The nodes of layer ``n``'s activation, once :func:`verify_activation` has checked what they compute."""
    g, first = dec.g, layer.mlp_in[0]
    if first.split is not None:  # a fused gate/up: the gate half
        start = next(t for lo, t in dec.halves(first, first.out_features) if lo == first.split[0])
    else:
        start = activation_start(g, first)
    end = None if len(layer.mlp_in) == 2 else layer.mlp_out.x
    return verify_activation(g, dec.barriers, start, end, layer.activation, f"layer {n}")


def _is_eps(g: GraphIndex, node) -> bool:
    """``node`` adds a norm's epsilon: a scalar to a ReduceMean (the variance) on its way to a root."""
    if not feeds_root(g, node) or not any(g.scalar(x) is not None for x in node.input):
        return False
    for x in node.input:
        producer = g.node_of(x)
        while producer is not None and producer.op_type in ("Cast", "Identity"):
            producer = g.node_of(producer.input[0])
        if producer is not None and producer.op_type == "ReduceMean":
            return True
    return False


def _is_const(g: GraphIndex, name: str) -> bool:
    """``name`` is a constant (initializer or Constant node), maybe behind Cast/Identity."""
    for _ in range(8):
        node = g.node_of(name)
        if g.constant_tensor(name) is not None or (node is not None and node.op_type == "Constant"):
            return True
        if node is None or node.op_type not in ("Cast", "Identity"):
            return False
        name = node.input[0]
    return False


def _bias_adds(dec) -> set[int]:
    """The Add of a constant right after each projection read with a bias (a vector of its outputs), through
    layout ops; a projection without one leaves its Add to be refused."""
    g, out = dec.g, set()
    for p in (p for p in dec.projections if p.bias):
        tensor = g.nodes[p.node].output[0]
        for _ in range(8):
            users = [i for i in g.consumers.get(tensor, ()) if g.nodes[i].op_type not in ("Shape", "Size")]
            if len(users) != 1:
                break
            node = g.nodes[users[0]]
            if node.op_type == "Add" and any(_is_const(g, x) for x in node.input):
                out.add(users[0])
            if node.op_type not in TRANSPARENT:
                break
            tensor = node.output[0]
    return out


def _shape_derived(g: GraphIndex, tensor: str) -> bool:
    """``tensor`` is a square root computed from tensor shapes and constants only (SDPA's ``1 / sqrt(q.shape[-1])``,
    split as its square root on q and on k)."""
    if tensor in g.graph_inputs or g.const(tensor) is not None:
        return False
    reached, _ = g.backward([tensor], frozenset())
    producers = [g.node_of(x) for i in reached for x in g.nodes[i].input if x]
    if any(x in g.graph_inputs for i in reached for x in g.nodes[i].input):
        return False
    ops = {g.nodes[i].op_type for i in reached}
    if "Sqrt" not in ops or ops & {"Cos", "Sin"}:
        return False
    return any(p is not None and p.op_type in ("Shape", "Size") for p in producers)


def _show(value: np.ndarray) -> str:
    return f"{value[0]:g}" if value.size == 1 else f"[{value.size} values]"


def _feeds_concat(g: GraphIndex, node) -> bool:
    frontier = list(node.output)
    for _ in range(4):
        users = [g.nodes[c] for t in frontier for c in g.consumers.get(t, ())]
        if any(u.op_type == "Concat" for u in users):
            return True
        frontier = [o for u in users if u.op_type in TRANSPARENT for o in u.output]
    return False


def _between(dec, sources: list, target: str) -> set[int]:
    """Nodes on the data flow from the projections ``sources`` to the tensor ``target``, projections excluded."""
    g = dec.g
    down, _ = g.forward([g.nodes[p.node].output[0] for p in sources], dec.barriers)
    up, _ = g.backward([target], dec.barriers)
    return down & up


def _lora_scales(dec) -> set[int]:
    """The nodes scaling each LoRA B output on its way to the base projection's Add, and a DoRA sum's nodes."""
    g, out = dec.g, set()
    for p in dec.projections:
        if not p.lora_nodes:
            continue
        if p.dora is not None:
            out.update(p.dora.nodes)
        tensor = g.nodes[p.lora_nodes[1]].output[0]
        for _ in range(16):
            users = g.consumers.get(tensor, ())
            if len(users) != 1 or g.nodes[users[0]].op_type not in (*TRANSPARENT, "Mul", "Div"):
                break
            out.add(users[0])
            tensor = g.nodes[users[0]].output[0]
    return out
