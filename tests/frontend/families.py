"""Tiny decoders of the families a torch export decomposes into plain ONNX ops, built in-process.

:func:`family_decoder` writes a Llama-shaped graph (decomposed RMSNorm,
rotate-half RoPE from an inverse-frequency constant, grouped-query
attention through Softmax, a gated MLP) that ONNX Runtime runs, with the
variations of Phi-3 (fused ``gate_up_proj`` cut by a Split or two Slices),
Gemma (GeGLU with GELU as an op or decomposed in tanh or erf form, the
embedding scaled by sqrt(hidden), RMSNorm by ``1 + w``) and Llama-3 (an
inverse-frequency table with llama3 scaling), plus activations that are
not what their ops suggest (QuickGELU, squared ReLU) and deliberately unknown
nodes (``extra``) for the refusals. Random weights with a fixed seed; the
graph inputs are ``input_ids`` and ``position_ids``.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MLPS = ("swiglu", "fused_split", "fused_slice", "geglu_tanh", "geglu_erf", "gelu_op_tanh", "gelu_op_erf",
        "quick_gelu", "relu_squared")
EXTRAS = (None, "residual_scale", "residual_shift", "unknown_op", "stream_tanh", "softcap", "attn_scale",
          "rope_factor", "two_tables", "yarn", "attn_softcap", "branch_scale", "clip_qkv",
          "sandwich")


def llama3_inv_freq(head_dim: int, theta: float = 500000.0, factor: float = 8.0, low: float = 1.0,
                    high: float = 4.0, original: int = 8192) -> np.ndarray:
    """transformers' ``_compute_llama3_parameters``: the llama3-scaled inverse frequencies."""
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim)
    wavelen = 2 * math.pi / inv
    low_wl, high_wl = original / low, original / high
    scaled = np.where(wavelen > low_wl, inv / factor, inv)
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wl) & (wavelen <= low_wl)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def family_decoder(mlp: str = "swiglu", *, layers: int = 2, hidden: int = 32, heads: int = 4, kv_heads: int = 2,
                   inter: int = 24, vocab: int = 64, embed_scale: float | None = None, norm_offset: bool = False,
                   inv_freq: np.ndarray | None = None, extra: str | None = None, seed: int = 0,
                   attn_std: float = 0.3, mlp_std: float = 0.3, lora: bool = False,
                   parallel: str | None = None, rotary_dim: int | None = None,
                   rotary_last: bool = False, nope_layers: tuple[int, ...] = (),
                   lora_qv: int = 0, qk_norm: str | None = None) -> onnx.ModelProto:
    """A decoder of ``layers`` blocks with the MLP ``mlp`` (one of :data:`MLPS`) and the variations above.

    ``inv_freq`` defaults to theta 10000. ``extra`` (one of :data:`EXTRAS`) adds a constant multiplier or
    a constant on the residual stream, an unknown op (``Sin``) or a ``Tanh`` on it, Gemma-2 style logit
    soft-capping or sandwich norms, a second attention scale, a factor on the RoPE cosines alone or on both tables (YaRN's
    attention factor), or two RoPE tables. ``attn_std``
    and ``mlp_std`` set the spread of the attention and MLP weights (larger: sharper attention, gate values
    where GELU's forms differ); ``lora`` puts an unmerged adapter on a fused gate/up projection, ``lora_qv``
    one of that rank on q and v; ``nope_layers`` leave their queries and keys unrotated (NoPE). ``qk_norm``
    RMS-normalises query and key heads before RoPE (``"head"``: each head, Qwen3; ``"q_only"``: the queries'
    alone; ``"whole"``: the whole q and k projections before their split into heads, OLMo 2).
    ``parallel`` computes attention and MLP from the same layer input, ``h + attn(n1(h)) + mlp(n(h))``:
    ``"shared"`` with the attention's norm (GPT-J, Falcon, Phi-2), ``"two"`` with a norm of its own (GPT-NeoX).
    ``rotary_dim`` rotates only the first that many dimensions of each head (partial rotary, NeoX-style
    Slice/Concat); ``rotary_last`` rotates the last ones instead, which the frontend must refuse.
    """
    assert mlp in MLPS and extra in EXTRAS
    rng = np.random.default_rng(seed)
    hd, grp = hidden // heads, heads // kv_heads
    inits, nodes = [], []

    def const(name, value, dtype=np.float32):
        inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def rand(name, *dims, std=0.05):
        return const(name, rng.normal(0.0, std, dims))

    def node(op, inputs, output, name=None, **attrs):
        nodes.append(helper.make_node(op, inputs, [output] if isinstance(output, str) else output,
                                      name=name or (output if isinstance(output, str) else output[0]), **attrs))
        return output

    const("axis_last", [-1], np.int64)
    const("one", 1.0)
    const("eps", 1e-6)

    def norm(x, p, width=hidden):
        w = rand(p + "w", width, std=0.1) if qk_norm is None or width == hidden else const(p + "w", 1 + rng.normal(
            0.0, 0.3, width))
        if norm_offset:
            w = node("Add", [w, "one"], p + "w1")
        sq = node("Mul", [x, x], p + "sq")
        ms = node("ReduceMean", [sq, "axis_last"], p + "ms", keepdims=1)
        r = node("Sqrt", [node("Add", [ms, "eps"], p + "mse")], p + "r")
        return node("Mul", [node("Div", [x, r], p + "xn"), w], p + "y")

    h = node("Gather", [rand("embed", vocab, hidden, std=0.5), "input_ids"], "h0")
    if embed_scale is not None:
        h = node("Mul", [h, const("embed_scale", embed_scale)], "h0s")
    # RoPE tables from the inverse frequencies: [1, 1, S, hd]
    rd = rotary_dim or hd
    inv = inv_freq if inv_freq is not None else 1.0 / 10000.0 ** (np.arange(0, rd, 2, dtype=np.float32) / rd)
    const("inv_freq", inv)
    pos = node("Unsqueeze", [node("Cast", ["position_ids"], "pos_f", to=TensorProto.FLOAT),
                             const("axes_last", [-1], np.int64)], "pos_u")
    table = "inv_freq"
    if extra == "two_tables":  # LongRoPE: short or long factors, chosen at run time
        table = node("Where", [const("use_long", [False], np.bool_), const("inv_long", inv / 4), table], "inv_sel")
    freqs = node("Mul", [pos, table], "freqs")
    emb = node("Concat", [freqs, freqs], "emb", axis=-1)
    axes1 = const("axes1", [1], np.int64)
    cos = node("Unsqueeze", [node("Cos", [emb], "cos"), axes1], "cos_u")
    if extra in ("rope_factor", "yarn"):  # YaRN's attention factor: on the cosines alone, or on both tables
        cos = node("Mul", [cos, const("rope_factor", 1.1)], "cos_scaled")
    sin = node("Unsqueeze", [node("Sin", [emb], "sin"), axes1], "sin_u")
    if extra == "yarn":
        sin = node("Mul", [sin, "rope_factor"], "sin_scaled")
    # causal mask [S, S] cut from a constant
    mask = np.triu(np.full((64, 64), -1e9, np.float32), 1)
    seq = node("Gather", [node("Shape", ["input_ids"], "ids_shape"), const("idx1", [1], np.int64)], "seq")
    ends = node("Concat", [seq, seq], "mask_ends", axis=0)
    mask_s = node("Slice", [const("mask", mask), const("zeros2", [0, 0], np.int64), ends,
                            const("axes01", [0, 1], np.int64)], "mask_s")
    split_shape = const("heads_shape", [0, 0, heads, hd], np.int64)
    kv_shape = const("kv_shape", [0, 0, kv_heads, hd], np.int64)
    rep_shape = const("rep_shape", [1, heads, -1, hd], np.int64)
    merge_shape = const("merge_shape", [0, 0, hidden], np.int64)
    half = [const("h_lo", [0], np.int64), const("h_mid", [rd // 2], np.int64), const("h_hi", [rd], np.int64),
            const("axis3", [3], np.int64)]
    cut = const("r_cut", [hd - rd if rotary_last else rd], np.int64)
    end = const("r_end", [hd], np.int64)

    def rotate(x, p):
        x1 = node("Slice", [x, half[0], half[1], half[3]], p + "x1")
        x2 = node("Slice", [x, half[1], half[2], half[3]], p + "x2")
        rot = node("Concat", [node("Neg", [x2], p + "neg"), x1], p + "rot", axis=-1)
        return node("Add", [node("Mul", [x, cos], p + "xc"), node("Mul", [rot, sin], p + "rs")], p + "rope")

    def rotary(x, p):
        if rd == hd:
            return rotate(x, p)
        first = node("Slice", [x, half[0], cut, half[3]], p + "first")
        rest = node("Slice", [x, cut, end, half[3]], p + "rest")
        if rotary_last:  # the wrong half: the last rd dimensions turn
            return node("Concat", [first, rotate(rest, p)], p + "joined", axis=-1)
        return node("Concat", [rotate(first, p), rest], p + "joined", axis=-1)

    def repeat(x, p):
        xu = node("Unsqueeze", [x, const(p + "ax2", [2], np.int64)], p + "u")
        return node("Reshape", [node("Concat", [xu] * grp, p + "cat", axis=2), rep_shape], p + "rep")

    def gelu(x, p, approx):
        if mlp.startswith("gelu_op"):
            return node("Gelu", [x], p + "gelu", approximate="tanh" if approx else "none")
        if approx:
            cube = node("Pow", [x, const(p + "three", 3.0)], p + "cube")
            inner = node("Add", [x, node("Mul", [cube, const(p + "c1", 0.044715)], p + "t1")], p + "t2")
            t = node("Tanh", [node("Mul", [inner, const(p + "c2", math.sqrt(2 / math.pi))], p + "t3")], p + "t4")
            return node("Mul", [node("Mul", [x, const(p + "half", 0.5)], p + "xh"),
                                node("Add", [t, "one"], p + "t5")], p + "gelu")
        e = node("Erf", [node("Div", [x, const(p + "sqrt2", math.sqrt(2))], p + "e1")], p + "e2")
        return node("Mul", [node("Mul", [x, node("Add", [e, "one"], p + "e3")], p + "e4"),
                            const(p + "half", 0.5)], p + "gelu")

    def act(x, p):
        if mlp.startswith("gelu") or mlp.startswith("geglu"):
            return gelu(x, p, mlp.endswith("tanh"))
        if mlp == "quick_gelu":  # x * sigmoid(1.702 x): not SiLU
            return node("Mul", [x, node("Sigmoid", [node("Mul", [x, const(p + "qg", 1.702)], p + "kx")],
                                        p + "sig")], p + "silu")
        if mlp == "relu_squared":  # not ReLU
            r = node("Relu", [x], p + "relu")
            return node("Mul", [r, r], p + "relu2")
        return node("Mul", [x, node("Sigmoid", [x], p + "sig")], p + "silu")

    for i in range(layers):
        p = f"l{i}_"
        h_in = h
        x = norm(h, p + "n1")
        q = node("MatMul", [x, rand(p + "Wq", hidden, hidden, std=attn_std)], p + "q")
        k = node("MatMul", [x, rand(p + "Wk", hidden, kv_heads * hd, std=attn_std)], p + "k")
        v = node("MatMul", [x, rand(p + "Wv", hidden, kv_heads * hd)], p + "v")
        if lora_qv:  # PEFT's unmerged adapters of rank lora_qv (alpha 2 * rank) on q and v
            def adapter(y, r, out):
                la = node("MatMul", [x, rand(p + r + "A", hidden, lora_qv)], p + r + "la")
                lb = node("MatMul", [la, rand(p + r + "B", lora_qv, out, std=0.02)], p + r + "lb")
                return node("Add", [y, node("Mul", [lb, const(p + r + "ls", 2.0)], p + r + "lbs")], p + r + "lora")
            q, v = adapter(q, "q", hidden), adapter(v, "v", kv_heads * hd)
        if qk_norm == "whole":  # OLMo 2: the whole q and k vectors normed
            q, k = norm(q, p + "qn", hidden), norm(k, p + "kn", kv_heads * hd)
        if extra == "clip_qkv":  # OLMo: queries, keys and values clamped to [-0.5, 0.5]
            lo, hi = const(p + "clo", -0.5), const(p + "chi", 0.5)
            q, k, v = (node("Clip", [t, lo, hi], p + "clip_" + w) for t, w in ((q, "q"), (k, "k"), (v, "v")))
        perm = [0, 2, 1, 3]
        qh = node("Transpose", [node("Reshape", [q, split_shape], p + "qr")], p + "qt", perm=perm)
        kh = node("Transpose", [node("Reshape", [k, kv_shape], p + "kr")], p + "kt", perm=perm)
        vh = node("Transpose", [node("Reshape", [v, kv_shape], p + "vr")], p + "vt", perm=perm)
        if qk_norm in ("head", "q_only"):  # Qwen3: every head normed over its hd dimensions
            qh = norm(qh, p + "qn", hd)
            kh = norm(kh, p + "kn", hd) if qk_norm == "head" else kh
        if i not in nope_layers:  # a positionless (NoPE) layer: queries and keys go straight into attention
            qh, kh = rotary(qh, p + "q"), rotary(kh, p + "k")
        kh = repeat(kh, p + "k")
        scores = node("MatMul", [qh, node("Transpose", [kh], p + "kT", perm=[0, 1, 3, 2])], p + "s")
        scaled = node("Mul", [scores, const(p + "scale", 1 / math.sqrt(hd))], p + "ss")
        if extra == "attn_scale":
            scaled = node("Mul", [scaled, const(p + "scale2", 0.5)], p + "ss2")
        if extra == "attn_softcap":  # Gemma 2: cap * tanh(scores / cap)
            capped = node("Tanh", [node("Div", [scaled, const(p + "acap", 2.0)], p + "acd")], p + "act")
            scaled = node("Mul", [capped, p + "acap"], p + "acm")
        probs = node("Softmax", [node("Add", [scaled, mask_s], p + "sm")], p + "p", axis=-1)
        a = node("MatMul", [probs, repeat(vh, p + "v")], p + "a")
        a = node("Reshape", [node("Transpose", [a], p + "at", perm=perm), merge_shape], p + "am")
        o = node("MatMul", [a, rand(p + "Wo", hidden, hidden, std=attn_std)], p + "o")
        if extra == "branch_scale":  # Granite's residual_multiplier on the attention branch
            o = node("Mul", [o, const(p + "bm1", 0.4)], p + "bo")
        if extra == "sandwich":  # Gemma 2: the attention's output normed before its residual add
            o = norm(o, p + "n3")
        h = node("Add", [h, o], p + "h1")
        y = {None: lambda: norm(h, p + "n2"), "shared": lambda: x, "two": lambda: norm(h_in, p + "n2")}[parallel]()
        if mlp.startswith("fused"):
            gu = node("MatMul", [y, rand(p + "Wgu", hidden, 2 * inter, std=mlp_std)], p + "gu")
            if lora:  # an unmerged rank-2 adapter on the fused projection
                la = node("MatMul", [y, rand(p + "A", hidden, 2)], p + "la")
                lb = node("MatMul", [la, rand(p + "B", 2, 2 * inter)], p + "lb")
                gu = node("Add", [gu, node("Mul", [lb, const(p + "ls", 2.0)], p + "lbs")], p + "gul")
            if mlp == "fused_split":
                g, u = node("Split", [gu], [p + "g", p + "u"], name=p + "split", axis=-1, num_outputs=2)
            else:
                g = node("Slice", [gu, const(p + "s0", [0], np.int64), const(p + "s1", [inter], np.int64),
                                   "axis_last"], p + "g")
                u = node("Slice", [gu, const(p + "s2", [inter], np.int64), const(p + "s3", [2**63 - 1], np.int64),
                                   "axis_last"], p + "u")
        else:
            g = node("MatMul", [y, rand(p + "Wg", hidden, inter, std=mlp_std)], p + "g")
            u = node("MatMul", [y, rand(p + "Wu", hidden, inter, std=mlp_std)], p + "u")
        m = node("Mul", [act(g, p), u], p + "m")
        d = node("MatMul", [m, rand(p + "Wd", inter, hidden, std=mlp_std)], p + "d")
        if extra == "branch_scale":  # ... and on the MLP branch
            d = node("Mul", [d, const(p + "bm2", 0.4)], p + "bd")
        if extra == "sandwich":  # ... and the MLP's
            d = norm(d, p + "n4")
        h = node("Add", [h, d], p + "h2")
        if extra == "residual_scale" and i == 0:
            h = node("Mul", [h, const("rs", 0.9)], "residual_scale")
        if extra == "residual_shift" and i == 0:
            h = node("Add", [h, const("shift", 0.1)], "residual_shift")
        if extra == "unknown_op" and i == 0:
            h = node("Sin", [h], "unknown_sin")
        if extra == "stream_tanh" and i == 0:
            h = node("Tanh", [h], "stream_tanh")
    hf = norm(h, "nf")
    logits = node("MatMul", [hf, rand("head", hidden, vocab, std=0.5)], "logits_raw")
    if extra == "softcap":
        capped = node("Tanh", [node("Div", [logits, const("cap", 30.0)], "cap_div")], "softcap_tanh")
        logits = node("Mul", [capped, "cap"], "logits_capped")
    nodes.append(helper.make_node("Identity", [logits], ["logits"], name="logits"))
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, "s"])
    pos_ids = helper.make_tensor_value_info("position_ids", TensorProto.INT64, [1, "s"])
    out = helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "s", vocab])
    graph = helper.make_graph(nodes, "family", [ids, pos_ids], [out], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], producer_name="families")
    model.ir_version = 9
    return model


def to_float16(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` as an fp16 export writes it: float initializers and Constant values stored as float16
    (the mask's -1e9 as fp16's lowest), float Casts and the logits in float16. Changes ``model`` in place."""
    g = model.graph

    def half(t: onnx.TensorProto) -> onnx.TensorProto:
        return numpy_helper.from_array(np.clip(numpy_helper.to_array(t), -65504, 65504).astype(np.float16), t.name)

    for t in g.initializer:
        if t.data_type == TensorProto.FLOAT:
            t.CopyFrom(half(t))
    for n in g.node:
        for a in n.attribute:
            if n.op_type == "Cast" and a.name == "to" and a.i == TensorProto.FLOAT:
                a.i = TensorProto.FLOAT16
            if n.op_type in ("Constant", "ConstantOfShape") and a.name == "value" \
                    and a.t.data_type == TensorProto.FLOAT:
                a.t.CopyFrom(half(a.t))
    del g.value_info[:]
    for vi in (*g.input, *g.output):
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            vi.type.tensor_type.elem_type = TensorProto.FLOAT16
    return model
