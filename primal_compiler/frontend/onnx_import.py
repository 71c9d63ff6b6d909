"""ONNX -> graph IR: :func:`load_onnx` recognises a decoder-only transformer.

Shapes only. The file is read and checked by ``onnx_check`` (a regular file
of at most 2 GiB, onnx's checker, no cycles, at most 2^20 nodes) without its
external data, so a model whose external-data files are absent imports all
the same; weight bytes are never decoded. The only values read are small
inline constants: shape vectors (to find the head size), scalars (the LoRA
scale, the position offset, the norm epsilon, the embedding scale), RoPE's
inverse-frequency table (``rope_inv_freq``, see ``onnx_params``), and the
tied-head sample described below.

Recognition works on graph structure, never on initializer or node names
(exporters emit ``onnx::MatMul_886`` or ``val_57``); see ``onnx_decoder``
for the steps and ``onnx_project`` for projections, biases and LoRA.
Supported: TorchScript (``dynamo=False``) and dynamo exports of torch.onnx,
optimum exports with or without ``past_key_values``; Llama/Mistral style
(RMSNorm, SwiGLU, RoPE, grouped-query attention), GPT-2 (fused qkv Conv1D
as Gemm, learned positions) and OPT (q/k/v with biases, learned positions
with an index offset); Phi-3's fused gate/up projection (``onnx_decoder``),
Gemma's GeGLU, embedding scale and ``1 + w`` RMSNorm, any RoPE frequency
table (Llama-3's scaling, YaRN's attention factor), GPT-J's rotation from a
precomputed table (``onnx_rotary``), ALiBi (``onnx_alibi``), an embedding
norm and LayerNorms without bias (Bloom, MPT), fused qkv head by head or
group by group (``onnx_heads``), parallel attention + MLP blocks
(``onnx_mlp``); unmerged PEFT LoRA adapters. Every node on the
hidden-state path must belong to a recognised pattern (``onnx_guard``).

Embeddings and LM head. The token embedding is the Gather on a
``[vocab, hidden]`` initializer whose row count equals the LM head's
outputs; another Gather on a ``[rows, hidden]`` table is the learned
position embedding, and a constant added to its indices is the offset
(OPT's 2), so ``max_position_embeddings = rows - offset``. The LM head is
the last projection from ``hidden`` to ``vocab`` that reaches a graph
output. A static-shape export (fixed sequence length S) may fold the position
lookup into a ``[1, S, hidden]`` constant added to the token embedding; that
imports as a learned table of S rows, which is all such a graph can run.

Tied LM head: tied when the head consumes the embedding initializer itself
(directly or through a Transpose, as optimum writes it). TorchScript and
dynamo exports instead store a transposed *copy* of a tied table (their
constant folding materialises ``Transpose(wte)``). Shapes cannot tell a copy
from an independent matrix, so the frontend compares 16 corresponding
elements of the two initializers at fixed positions (128 bytes of fp32 in
all, taken from the inline data or with one seek each into the external-data
file) and calls the head tied when every sample matches and the samples are
not all equal to each other. When the data is not available (external file
absent) the head counts as untied, which can only over-count parameters.

Also recognised: the ONNX ``Attention`` op and com.microsoft
``MultiHeadAttention``/``GroupQueryAttention`` (heads from attributes),
``LayerNormalization``/``RMSNormalization``/``SimplifiedLayerNormalization``
or their decompositions, quantized weights (QDQ, ``MatMulNBits``, ``MatMulInteger``;
``onnx_quant``), model-local functions (inlined first). Rejected with an :class:`InputError`: attention ops with
fused weights (com.microsoft ``Attention``), extra projections on the hidden size, positions that are neither learned,
rotary nor ALiBi (``onnx_alibi``), a LoRA scale that is not a finite number, sizes over the
IR's limits (``ir.model.SIZE_LIMITS``; the layer count is checked as soon as
the attention blocks are found), graphs whose recognition would follow
more than ``onnx_graph.WALK_LIMIT`` edges, a projection serving two places,
layers that differ in attention geometry.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import onnx

from primal_compiler.errors import InputError, one_line
from primal_compiler.frontend.onnx_branches import branch_multiplier
from primal_compiler.frontend.onnx_check import read_onnx
from primal_compiler.frontend.onnx_clip import qkv_clip
from primal_compiler.frontend.onnx_decoder import Decoder, Layer, g_name
from primal_compiler.frontend.onnx_graph import GraphIndex, PatternError, Weight, attr
from primal_compiler.frontend.onnx_guard import (
    check_accounted, embed_scale, folded_positions, refuse_experts, refuse_quantized_activations,
)
from primal_compiler.frontend.onnx_logits import logit_tail
from primal_compiler.frontend.onnx_mlp import assign_mlp
from primal_compiler.frontend.onnx_alibi import alibi_slopes
from primal_compiler.frontend.onnx_params import (
    ONNX_DEFAULT_EPS, NormRef, embedding_norm, norm_bias, norm_ref, norms_learned, rope_frequencies, tied_head,
)
from primal_compiler.frontend.onnx_dora import input_reached
from primal_compiler.frontend.onnx_fold import fold_shapes
from primal_compiler.frontend.onnx_project import Projection, find_weight_matmuls, pair_lora
from primal_compiler.frontend.onnx_quant import dequantize_graph, weight_formats
from primal_compiler.frontend.onnx_rotary import rotated_layers, table_gather
from primal_compiler.frontend.onnx_qknorm import qk_norms
from primal_compiler.frontend.onnx_sandwich import no_pre_norm, post_norms
from primal_compiler.frontend.onnx_window import windows
from primal_compiler.ir.model import (
    SIZE_LIMITS, Attention, DecoderLayer, Linear, LoRA, Model, NormKind, Positional, Role,
)

DEFAULT_ROPE_THETA = 10000.0  # Llama's base, used when no inverse-frequency constant is found
_ROLE_ORDER = (Role.Q, Role.K, Role.V, Role.QKV, Role.O, Role.GATE, Role.UP, Role.FC1, Role.DOWN, Role.FC2)


@dataclass(frozen=True, eq=False)
class Recognised:
    """What :func:`recognise_onnx` found: the model, the indexed graph and its projections.

    ``projections`` maps ``(layer, role)`` to the projection the frontend
    recognised there (the LM head under ``(num_layers, Role.LM_HEAD)``), so
    weight readers need not match initializer names.
    """

    model: Model
    graph: GraphIndex
    projections: dict[tuple[int, Role], Projection]
    embed_table: Weight  # the token embedding ``[vocab, hidden]`` as the Gather consumes it
    pos_table: Weight | None  # the learned position table (or a static export's folded ``[1, S, hidden]``)
    norms: dict[tuple[int, int], NormRef]  # (layer, 0/1 before attn/MLP, 2/3 after, 4/5 q/k); (num_layers, 0) final
    rope_unread: str | None = None  # the node whose RoPE frequencies the frontend cannot read (cos/sin caches)


def load_onnx(path: str | Path) -> Model:
    """The decoder in the ONNX file ``path`` as a :class:`Model`; bad input is an :class:`InputError`."""
    return recognise_onnx(path).model


def recognise_onnx(path: str | Path) -> Recognised:
    """:func:`load_onnx` plus the graph, the projection of every (layer, role), the tables and norms.

    The file passes ``onnx_check.read_onnx`` first (type, size, onnx's checker, no cycles); nothing but
    an :class:`InputError` leaves this function.
    """
    path = Path(path)
    where = str(path)
    model = read_onnx(path)
    try:
        return _recognise(model, path)
    except PatternError as exc:
        raise InputError(where, str(exc)) from None
    except InputError:
        raise
    except RecursionError:
        raise InputError(where, "cannot analyse the graph (nested too deeply)") from None
    except Exception as exc:  # noqa: BLE001 - a malformed graph must not surface as a traceback
        raise InputError(where, f"cannot analyse the graph ({type(exc).__name__}: {one_line(exc, 200)})") from None


def _recognise(model: onnx.ModelProto, path: Path) -> Recognised:
    if model.functions:
        import onnx.inliner

        model = onnx.inliner.inline_local_functions(model)
    quant = dequantize_graph(model)
    g = GraphIndex(model, path.parent, quant, fold_shapes(model))
    refuse_experts(g)
    refuse_quantized_activations(g)
    live = input_reached(g)
    projections = pair_lora(g, find_weight_matmuls(g, live), live)
    if not projections:
        raise PatternError("no decoder layers found (no MatMul/Gemm with a weight initializer)")
    dec = Decoder(g, projections)
    cores = sorted(dec.cores(), key=lambda c: c.anchor)
    if not cores:
        raise PatternError("no decoder layers found (no attention: no Softmax between two activation MatMuls)")
    if len(cores) > SIZE_LIMITS["decoder layers"]:  # checked before the walks, which grow with the square of it
        limit = SIZE_LIMITS["decoder layers"]
        raise PatternError(f"decoder layers {len(cores):,} is over the limit of {limit:,} (docs/frontend.md)")
    layers = [_attention_layer(dec, core) for core in cores]
    hidden = layers[0].attn[0].in_features
    embed, pos, lm_head = _embeddings_and_head(dec, hidden, layers)
    assign_mlp(dec, layers, lm_head)
    _check_one_role_each(layers, lm_head)
    emb_table = embed[1]
    vocab = emb_table.rows

    residual = set(_residual_adds(g))
    stops = set(_embedding_gathers(g)) | residual
    norms: dict[tuple[int, int], NormRef] = {}
    norm_regions: list[set[int]] = []
    embed_norm = embedding_norm(g, embed[0])
    if embed_norm is not None:  # Bloom: the residual stream starts after it
        stops.add(embed_norm)
        norm_regions.append({embed_norm})
        norms[(-1, 0)] = norm_ref(g, {embed_norm}, hidden)
    for n, layer in enumerate(layers):
        dec.geometry(layer)
        attn_in, mlp_in = g.canonical(layer.attn[0].x), g.canonical(layer.mlp_in[0].x)
        attn_norm, mlp_norm = dec.norm_before(attn_in, stops), dec.norm_before(mlp_in, stops)
        if layer.parallel and attn_in == mlp_in:
            mlp_norm = None  # one norm feeds both (GPT-J, Falcon, Phi-2)
        layer.norm = attn_norm or mlp_norm
        layer.num_norms = (attn_norm is not None) + (mlp_norm is not None)
        if layer.norm is None:
            raise PatternError(no_pre_norm(dec, n, layer, stops, residual))
        for which, tensor, kind in ((0, attn_in, attn_norm), (1, mlp_in, mlp_norm)):
            if kind is not None:
                norm_regions.append(dec.norm_region(tensor, stops))
                norms[(n, which)] = norm_ref(g, norm_regions[-1], hidden)
    for key, (ref, region) in {**post_norms(dec, layers, stops, residual, hidden), **qk_norms(dec, layers)}.items():
        norms[key] = ref
        norm_regions.append(region)
    shapes = sorted({(layer.num_heads, layer.num_kv_heads, layer.head_dim) for layer in layers})
    if len(shapes) > 1:  # the KV ring, the ISA and the replay lay out every layer's attention as one
        seen = "; ".join(f"{h} heads, {kv} kv heads, head size {d}" for h, kv, d in shapes)
        raise PatternError(f"unsupported model: its layers differ in attention geometry ({seen})")
    head_in = g.canonical(lm_head.x)
    final_norm = dec.norm_before(head_in, stops)
    if final_norm is not None:
        norm_regions.append(dec.norm_region(head_in, stops))
        norms[(len(layers), 0)] = norm_ref(g, norm_regions[-1], hidden)
    final_norm = final_norm or layers[-1].norm  # each layer has one: refused above otherwise
    if final_norm is None:
        raise PatternError("unsupported model: no norm before the LM head")
    eps = next((r.eps for r in norms.values() if r.eps is not None), None)
    if embed_norm is not None and final_norm != (
            NormKind.LAYER if g.nodes[embed_norm].op_type in ("LayerNormalization", "SkipLayerNormalization")
            else NormKind.RMS):
        raise PatternError(f"unsupported embedding norm at node {g_name(g, embed_norm)}: not the model's norm kind")
    slopes = alibi_slopes(g, dec.barriers, [x.core.anchor for x in layers], layers[0].num_heads)
    positional, npos, max_pos = (Positional.ALIBI, 0, 0) if slopes and pos is None else \
        _positional(g, pos, layers[0].head_dim)
    rope = rope_frequencies(g, layers[0].head_dim) if positional == Positional.ROPE else None
    scale, scale_node = embed_scale(g, embed[0])
    norm_params = {x for r in norms.values() for x in (r.weight, r.bias) if x is not None}
    embed_nodes = {embed[0]} | ({scale_node} if scale_node is not None else set())
    logit_scale, softcap, logit_nodes = logit_tail(g, lm_head.node, lm_head.bias)
    branch, branch_nodes = branch_multiplier(g, layers)
    clip, clip_nodes = qkv_clip(g, layers)
    score_scale, attn_cap = check_accounted(dec, layers, lm_head, norm_regions, norm_params, embed_nodes,
                                            logit_nodes | branch_nodes | clip_nodes)
    turned = rotated_layers(g, dec, layers) if positional == Positional.ROPE else [True] * len(layers)
    ir_layers = tuple(_to_ir(i, layer, rope, w) for (i, layer), rope, w in zip(enumerate(layers), turned,
                                                                               windows(dec, cores, max_pos)))
    tied = tied_head(g, emb_table, lm_head.weight)
    try:
        ir = Model(
            name=path.stem,
            hidden_size=hidden,
            vocab_size=vocab,
            layers=ir_layers,
            positional=positional,
            norm=final_norm,
            tie_word_embeddings=tied,
            max_position_embeddings=max_pos,
            num_pos_embeddings=npos,
            lm_head_bias=lm_head.bias,
            source=_source(model),
            norm_eps=eps if eps is not None else ONNX_DEFAULT_EPS,
            rope_theta=rope.theta if rope is not None else DEFAULT_ROPE_THETA,
            rope_inv_freq=rope.inv_freq if rope is not None else (),
            rope_dim=rope.dim if rope is not None and rope.dim < layers[0].head_dim else 0,
            qkv_layout=_qkv_layout(layers),
            rope_interleaved=rope is not None and rope.interleaved,
            rope_attention_scale=rope.attention_scale if rope is not None else 1.0,
            alibi_slopes=slopes if positional == Positional.ALIBI else (),
            embed_norm=embed_norm is not None,
            norm_bias=norm_bias(norms, final_norm),
            norm_weights=norms_learned(g, norms),
            embed_scale=scale,
            logit_scale=logit_scale,
            logit_softcap=softcap,
            attention_scale=score_scale,
            attn_softcap=attn_cap,
            residual_multiplier=branch,
            qkv_clip=clip,
            static_activations=g.quant.activations if g.quant is not None else 0,
            weight_quant=weight_formats(g.quant, [p.weight for x in layers for p in x.projections] + [lm_head.weight]),
        )
    except InputError as exc:  # a size over the IR's limits, reported against the file
        raise PatternError(exc.problem) from None
    found = {(i, p.given_role()): p for i, layer in enumerate(layers) for p in layer.projections}
    found[(len(layers), Role.LM_HEAD)] = lm_head
    unread = None
    if positional == Positional.ROPE and rope is None:  # RotaryEmbedding ops with cos/sin caches
        unread = next((g_name(g, i) for i, n in enumerate(g.nodes) if n.op_type == "RotaryEmbedding"), "RoPE")
    return Recognised(ir, g, found, embed[1], pos[1] if pos is not None else None, norms, unread)


def _attention_layer(dec: Decoder, core) -> Layer:
    attn, o = dec.attention_projections(core)
    return Layer(core=core, attn=attn, o=o, mlp_in=[])


def _check_one_role_each(layers: list[Layer], lm_head: Projection) -> None:
    """Every projection serves one place (a graph wired otherwise has no decoder reading)."""
    owner: dict[tuple[int, tuple[int, int, int] | None], str] = {(lm_head.node, None): "the LM head"}
    for i, layer in enumerate(layers):
        for p in layer.projections:
            key = (p.node, p.split)  # a fused gate/up serves twice, on two column ranges
            if key in owner:
                shape, first = f"{p.in_features}x{p.out_features}", owner[key]
                raise PatternError(f"unsupported structure: one {shape} projection serves {first} and layer {i}")
            owner[key] = f"layer {i}"


def _embedding_gathers(g: GraphIndex) -> list[int]:
    return [i for i, n in enumerate(g.nodes) if n.op_type == "Gather" and g.weight(n.input[0]) is not None]


def _residual_adds(g: GraphIndex) -> list[int]:
    return [i for i, n in enumerate(g.nodes) if n.op_type == "Add" and len(n.input) == 2
            and all(g.constant_tensor(x) is None and g.const(x) is None for x in n.input)]


def _embeddings_and_head(dec: Decoder, hidden: int, layers: list[Layer]):
    g = dec.g
    gathered = [(i, g.weight(g.nodes[i].input[0])) for i in _embedding_gathers(g)]
    tables = [(i, w) for i, w in gathered if w is not None and w.cols == hidden and attr(g.nodes[i], "axis", 0) == 0]
    if not tables:
        raise PatternError(f"no token embedding found (a Gather on a [vocab, {hidden}] initializer)")
    in_layers = {p.node for layer in layers for p in (*layer.attn, layer.o)}
    outputs = set(g.graph_outputs)
    rows = {w.rows for _, w in tables}
    heads = []
    for p in dec.projections:
        if p.node in in_layers or p.in_features != hidden or p.out_features not in rows:
            continue
        reached, hit = dec.hits_fwd(p)
        if not hit and (
            set(g.nodes[p.node].output) & outputs or any(set(g.nodes[i].output) & outputs for i in reached)
        ):
            heads.append(p)
    if not heads:
        raise PatternError("no LM head found (a projection from hidden to vocab size feeding a graph output)")
    lm_head = max(heads, key=lambda p: p.node)
    lm_head.role = Role.LM_HEAD
    token = [t for t in tables if t[1].rows == lm_head.out_features]
    if len(token) > 1:  # a position table as long as the vocabulary: the one gathered by raw ids is the token table
        direct = [
            t
            for t in token
            if g.canonical(g.nodes[t[0]].input[1]) in g.graph_inputs
            and "position" not in g.canonical(g.nodes[t[0]].input[1])
        ]
        token = direct[:1] or token[:1]
    embed = token[0]
    others = [t for t in tables if t[0] != embed[0] and t[1].name != embed[1].name]
    return embed, (others[0] if others else _folded_positions(g, embed[0], hidden)), lm_head


def _folded_positions(g: GraphIndex, embed_node: int, hidden: int):
    """A static-shape export folds ``wpe[arange(S)]`` into a ``[1, S, hidden]`` constant added to the embedding."""
    for i in g.consumers.get(g.nodes[embed_node].output[0], ()):
        node = g.nodes[i]
        if node.op_type != "Add":
            continue
        for x in node.input:
            tensor = folded_positions(g, x, hidden)
            if tensor is not None:
                return None, Weight(tensor.name or x, int(tensor.dims[-2]), hidden, False)
    return None


def _positional(g: GraphIndex, pos, head_dim: int) -> tuple[Positional, int, int]:
    if pos is not None:
        node, table = pos
        offset = 0
        producer = g.node_of(g.nodes[node].input[1]) if node is not None else None
        if producer is not None and producer.op_type == "Add":
            for x in producer.input:
                value = g.scalar(x)
                if value is not None and value == int(value) and 0 < value < table.rows:
                    offset = int(value)
        return Positional.LEARNED, table.rows, table.rows - offset
    ops = {(n.domain or "", n.op_type) for n in g.nodes}
    rotate_half = any(
        n.op_type == "Neg" and any(g.nodes[c].op_type == "Concat" for c in g.consumers.get(n.output[0], ()))
        for n in g.nodes
    )
    if (
        rotate_half
        or {("", "Sin"), ("", "Cos")} <= ops
        or ("", "RotaryEmbedding") in ops
        or ("com.microsoft", "RotaryEmbedding") in ops
        or table_gather(g, head_dim) is not None  # a precomputed sin | cos table (GPT-J), read by rope_frequencies
    ):
        return Positional.ROPE, 0, 0
    raise PatternError("unsupported position encoding: neither a learned position table nor rotary embeddings")


def _qkv_layout(layers: list[Layer]) -> str:
    kinds = {layer.qkv_layout for layer in layers}
    if len(kinds) > 1:
        raise PatternError(f"unsupported model: its layers' fused qkv columns run in different orders {sorted(kinds)}")
    return kinds.pop()


def _source(model: onnx.ModelProto) -> str:
    producer = " ".join(x for x in (model.producer_name, model.producer_version) if x)
    return f"onnx:{producer}" if producer else "onnx"


def _to_ir(index: int, layer: Layer, rope: bool, window: int) -> DecoderLayer:
    mlp_out, norm, activation = layer.recognised()
    projs = sorted((*layer.attn, layer.o, *layer.mlp_in, mlp_out), key=lambda p: _ROLE_ORDER.index(p.given_role()))
    linears = tuple(Linear(p.given_role(), p.in_features, p.out_features, bias=p.bias,
                           lora=None if p.lora is None else LoRA(p.lora[0], p.lora[1], p.dora is not None)) for p in projs)
    attention = Attention(layer.num_heads, layer.num_kv_heads, layer.head_dim)
    return DecoderLayer(index, attention, linears, norm, activation, num_norms=layer.num_norms,
                        parallel=layer.parallel, rope=rope, post_norms=layer.post_norms, window=window,
                        qk_norm=layer.qk_norm)
