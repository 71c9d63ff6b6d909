"""Parameters of a recognised decoder besides its projections: norms, RoPE base, embedding tables.

Found by structure, like everything in the frontend (names are never looked at):

* a *norm region* is what a projection's input depends on back to the
  residual stream (the walk stops at residual Adds and embedding Gathers and
  never crosses a projection). In it, a ``LayerNormalization`` /
  ``SimplifiedLayerNormalization`` / ``RMSNormalization`` (or the
  ``Skip...`` variants) gives scale, bias and ``epsilon``; a decomposition
  gives the scale as the ``Mul`` by a ``[hidden]`` constant, the bias as the
  ``Add`` of a ``[hidden]`` constant and epsilon as the ``Add`` of a scalar
  constant that feeds the ``Sqrt`` (or ``Reciprocal``/``Pow``/``Div``);
* RoPE's inverse frequencies are the constant of ``head_dim / 2`` elements
  that every ``Cos``/``Sin`` depends on, read as they are (any scaling
  scheme); the base is reported from them.

:func:`read_tables` then decodes the tensors so found (token and position
embeddings, norm scales and biases) as float32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from primal_compiler.errors import InputError
from primal_compiler.frontend.onnx_graph import GraphIndex, PatternError, attr
from primal_compiler.frontend.onnx_rotary import check_partial, interleaved, table_rope
from primal_compiler.frontend.onnx_tensors import read_tensor
from primal_compiler.frontend.weights import ModelTables
from primal_compiler.ir.model import NormKind

NORM_OPS: dict[str, tuple[int, int | None]] = {"LayerNormalization": (1, 2), "SimplifiedLayerNormalization": (1, None), "RMSNormalization": (1, None),
            "SkipLayerNormalization": (2, 3), "SkipSimplifiedLayerNormalization": (2, None)}
EPS_CONSUMERS = {"Sqrt", "Reciprocal", "Pow", "Div"}
TIE_SAMPLES = 16  # elements compared to tell a copy of the embedding table from an independent LM head
ONNX_DEFAULT_EPS = 1e-5  # the default ``epsilon`` of every ONNX normalization op


@dataclass(frozen=True)
class NormRef:
    """Where one norm's parameters are: tensor names (None when absent) and epsilon (None when unseen)."""

    weight: str | None
    bias: str | None
    eps: float | None
    offset: float = 0.0  # the scale is ``weight + offset`` (Gemma's RMSNorm multiplies by 1 + w)


def embedding_norm(g: GraphIndex, gather: int) -> int | None:
    """The fused norm node that is the token embedding's only consumer (Bloom's ``word_embeddings_layernorm``:
    the residual stream starts after it), or None."""
    tensor = g.nodes[gather].output[0]
    for _ in range(8):
        users = [i for i in g.consumers.get(tensor, ()) if g.nodes[i].op_type not in ("Shape", "Size")]
        if len(users) != 1:
            return None
        node = g.nodes[users[0]]
        if node.op_type in NORM_OPS:
            return users[0]
        if node.op_type not in ("Identity", "Cast"):
            return None
        tensor = node.output[0]
    return None


def norm_bias(norms: dict[tuple[int, int], NormRef], kind: NormKind) -> bool:
    """Whether the LayerNorms add a bias: all of them or none (MPT), else a PatternError."""
    has = {r.bias is not None for r in norms.values()}
    if kind == NormKind.LAYER and len(has) > 1:
        raise PatternError("unsupported model: some of its LayerNorms add a bias, others do not")
    return kind != NormKind.LAYER or has != {False}


def norms_learned(g: GraphIndex, norms: dict[tuple[int, int], NormRef]) -> bool:
    """False when every norm of the hidden size reads its scale from one and the same constant of ones (and
    its bias, if any, from one constant of zeros): an exporter's stand-in for norms without parameters (OLMo's
    non-parametric LayerNorm). Learned norms, even at their initial ones, each have a tensor of their own."""
    refs = [r for key, r in norms.items() if key[1] < 4]
    weights, biases = {r.weight for r in refs}, {r.bias for r in refs}
    weight = next(iter(weights)) if len(weights) == 1 else None
    if len(refs) < 2 or weight is None or len(biases) != 1 or any(r.offset for r in refs):
        return True
    scale = g.const(weight, limit=1 << 20)
    bias = next(iter(biases))
    zeros = bias is None or _all(g.const(bias, limit=1 << 20), 0.0)
    return not (_all(scale, 1.0) and zeros)


def _all(value: np.ndarray | None, x: float) -> bool:
    return value is not None and bool(np.all(value == x))


def norm_ref(g: GraphIndex, region: set[int], hidden: int) -> NormRef:
    """The scale, bias and epsilon of the norm whose nodes are ``region``; a region holding two norms (an
    embedding norm before the first layer's) is a :class:`PatternError` naming both."""
    fused = [i for i in sorted(region) if g.nodes[i].op_type in NORM_OPS]
    means = [i for i in sorted(region) if g.nodes[i].op_type == "ReduceMean"]
    if len(fused) > 1 or (fused and means) or len(means) > 2:
        a, b = (fused + means)[:2] if fused else (means[0], means[-1])
        names = " and ".join(g.nodes[i].name or f"#{i}" for i in (a, b))
        raise PatternError(f"unsupported norms at nodes {names}: two norms in a row between the residual stream "
                           "and a projection (e.g. an embedding norm before the first layer's)")
    for i in sorted(region):  # a decomposed norm squares its input; another power is no norm
        node = g.nodes[i]
        if node.op_type == "Pow" and (len(node.input) < 2 or g.scalar(node.input[1]) != 2.0):
            raise PatternError(f"unsupported norm at node {node.name or f'#{i}'}: Pow by "
                               f"{g.scalar(node.input[1]) if len(node.input) > 1 else None}, not 2 (a square)")
    weight = bias = eps = None
    offset = 0.0
    for i in sorted(region):
        node = g.nodes[i]
        slots = NORM_OPS.get(node.op_type)
        if slots is not None:
            w_at, b_at = slots
            inputs = list(node.input) + ["", "", "", ""]
            return NormRef(inputs[w_at] or None, (inputs[b_at] or None) if b_at is not None else None,
                           float(attr(node, "epsilon", ONNX_DEFAULT_EPS)))
        if node.op_type not in ("Mul", "Add") or len(node.input) != 2 or all(_is_constant(g, x) for x in node.input):
            continue  # (an Add of two constants is a shifted scale, ``1 + w``)
        for x in node.input:
            shifted = _shifted(g, x, hidden) if node.op_type == "Mul" and weight is None else None
            if shifted is not None:
                weight, offset = shifted
            elif g.vector_len(x) == hidden and _is_constant(g, x):
                if node.op_type == "Mul":
                    weight = weight or x
                else:
                    bias = bias or x
            elif node.op_type == "Add" and eps is None and g.scalar(x) is not None and feeds_root(g, node):
                eps = g.scalar(x)
    return NormRef(weight, bias, eps, offset)


def _shifted(g: GraphIndex, name: str, hidden: int) -> tuple[str, float] | None:
    """``(w, c)`` when ``name`` is ``w + c`` of a ``[hidden]`` constant ``w`` and a scalar constant ``c``."""
    node = g.node_of(name)
    while node is not None and node.op_type in ("Cast", "Identity"):
        node = g.node_of(node.input[0])
    if node is None or node.op_type != "Add" or len(node.input) != 2:
        return None
    for w, c in (node.input, reversed(node.input)):
        shift = g.scalar(c)
        if g.vector_len(w) == hidden and _is_constant(g, w) and shift is not None:
            return w, shift
    return None


def _is_constant(g: GraphIndex, name: str) -> bool:
    for _ in range(8):
        if g.constant_tensor(name) is not None:
            return True
        node = g.node_of(name)
        if node is None or node.op_type not in ("Cast", "Identity"):
            return False
        name = node.input[0]
    return False


def feeds_root(g: GraphIndex, node) -> bool:
    """``node``'s output reaches a Sqrt/Reciprocal/Pow/Div, maybe through Casts and Identities."""
    frontier = list(node.output)
    for _ in range(4):
        users = [g.nodes[i] for t in frontier for i in g.consumers.get(t, ())]
        if any(u.op_type in EPS_CONSUMERS for u in users):
            return True
        frontier = [o for u in users if u.op_type in ("Cast", "Identity") for o in u.output]
    return False


@dataclass(frozen=True)
class Rope:
    """RoPE frequencies found in a graph: the table as held, and the base it is closest to."""

    inv_freq: tuple[float, ...]  # dim / 2 frequencies, exactly as the graph's constant holds them
    theta: float  # the base of a plain geometric series, else the base of its first two entries
    geometric: bool  # inv_freq == theta ** (-2i / dim) (no scaling scheme)
    dim: int  # the rotated dimensions of a head: head_dim, or fewer (partial rotary, ``onnx_rotary``)
    interleaved: bool = False  # adjacent pairs rotate (GPT-J's rotate_every_two), not halves
    attention_scale: float = 1.0  # the factor both tables are multiplied by (YaRN's attention factor)


def rope_frequencies(g: GraphIndex, head_dim: int) -> Rope | None:
    """The inverse-frequency constant every ``Cos``/``Sin`` depends on; None when the graph has none.

    Any table is taken as it is (linear, dynamic NTK at the traced length, llama3 and YaRN scaling all
    export one), so the replay computes what the file computes. A constant of fewer frequencies, when
    it is the only one, is partial rotary (GPT-NeoX, Phi-2): the first ``2 x`` its size dimensions of
    each head rotate, which ``onnx_rotary.check_partial`` verifies in the graph. A :class:`PatternError`
    names the node when a ``Cos``/``Sin`` depends on no such constant or on several (LongRoPE's two
    factor sets), or when two tables differ. A factor both the cosines and the sines are multiplied by
    is YaRN's attention factor (``attention_scale``); one that scales only some of them is refused.
    """
    half = head_dim // 2
    tables: dict[tuple[float, ...], str] = {}
    scales: list[tuple[float, str, str]] = []
    for node in g.nodes:
        if node.op_type not in ("Cos", "Sin"):
            continue
        reached, _ = g.backward(node.input, frozenset())
        names = {x for i in reached for x in g.nodes[i].input if x}
        candidates, partial = set(), set()
        for name in sorted(names):
            value = g.const(name, limit=max(half, 1))
            if value is None or value.dtype.kind != "f" or value.ndim > 1 and max(value.shape) != value.size:
                continue
            table = tuple(float(v) for v in value.astype(np.float32).reshape(-1))
            if value.size == half and half >= 2:
                candidates.add(table)
            elif 2 <= value.size < half:
                partial.add(table)
        if not candidates and len(partial) == 1:  # partial rotary: checked below, and by onnx_rotary
            candidates = partial
        if len(candidates) > 1:  # e.g. LongRoPE's short and long factors, chosen at run time
            raise PatternError(f"unsupported RoPE at node {node.name or node.op_type} ({node.op_type}): it depends "
                               f"on {len(candidates)} different inverse-frequency constants")
        found = candidates.pop() if candidates else None
        if found is None:
            raise PatternError(f"unsupported RoPE at node {node.name or node.op_type} ({node.op_type}): it depends "
                               f"on no constant of head_dim/2 = {half} inverse frequencies, nor on one of fewer (partial "
                               "rotary); a precomputed cos/sin table is not read")
        tables.setdefault(found, node.name or node.op_type)
        scales.append((*_table_scale(g, node), node.op_type))
    if not tables:
        return _from_table(g, head_dim)
    if len(tables) > 1:
        raise PatternError(f"unsupported RoPE: nodes {', '.join(sorted(tables.values()))} use different "
                           "inverse-frequency tables")
    inv = np.array(next(iter(tables)), np.float64)
    if not (np.isfinite(inv).all() and (inv >= 0).all() and 0 < inv[1] < inv[0] and (np.diff(inv) <= 0).all()):
        raise PatternError(f"unsupported RoPE at node {next(iter(tables.values()))}: its inverse frequencies "
                           "are not decreasing from two positive ones (a quantized table may end in zeros)")
    return _rope(g, inv, head_dim, frozenset(), _one_scale(scales))


def _from_table(g: GraphIndex, head_dim: int) -> Rope | None:
    """RoPE from a precomputed sin | cos table (GPT-J); None without one, or when its data is absent."""
    table = table_rope(g, head_dim)
    if table is None or not table.inv_freq:
        return None
    inv = np.array(table.inv_freq, np.float64)
    if not inv[1] < inv[0]:
        raise PatternError("unsupported RoPE: the position table's frequencies are not decreasing")
    return _rope(g, inv, head_dim, table.gathered)


def _rope(g: GraphIndex, inv: np.ndarray, head_dim: int, gathered: frozenset[str], scale: float = 1.0) -> Rope:
    dim = 2 * len(inv)
    if dim < head_dim:
        check_partial(g, dim, head_dim, gathered)
    theta = float(f"{(inv[1] / inv[0]) ** (-dim / 2):.6g}")  # float32 frequencies hold ~7 digits
    expected = inv[0] * theta ** (-2.0 * np.arange(len(inv)) / dim)
    geometric = inv[0] == 1.0 and bool(np.allclose(inv, expected, rtol=1e-4, atol=0))
    return Rope(tuple(float(v) for v in inv), theta, geometric, dim, interleaved(g), scale)


def _table_scale(g: GraphIndex, node) -> tuple[float, str]:
    """The constant a cosine (sine) table is multiplied by on its way to the rotation (YaRN's attention
    factor), 1.0 when none, and the node that does it; a division by a constant is refused."""
    frontier = list(node.output)
    for _ in range(6):
        users = [g.nodes[i] for t in frontier for i in g.consumers.get(t, ())]
        for u in users:
            if u.op_type in ("Mul", "Div"):
                value = next((g.scalar(x) for x in u.input if g.scalar(x) is not None), None)
                if value is not None and value != 1.0:
                    if u.op_type == "Div" or not (math.isfinite(value) and value > 0):
                        raise PatternError(f"unsupported RoPE scaling at node {u.name or u.op_type} ({u.op_type} of "
                                           f"the {node.op_type} table by {value:g})")
                    return float(value), u.name or u.op_type
        frontier = [o for u in users if u.op_type in ("Cast", "Unsqueeze", "Identity", "CastLike") for o in u.output]
    return 1.0, ""


def _one_scale(scales: list[tuple[float, str, str]]) -> float:
    """The one factor every Cos and Sin table is scaled by (YaRN's attention factor scales both alike)."""
    values = {v for v, _, _ in scales}
    if len(values) > 1:
        value, name, op = next(x for x in scales if x[0] != 1.0)
        raise PatternError(f"unsupported RoPE scaling at node {name} (Mul of the {op} table by {value:g}, but not "
                           "of every Cos and Sin table by it; YaRN's attention factor scales both)")
    return values.pop() if values else 1.0


def tied_head(g: GraphIndex, table, head: str) -> bool:
    """Whether the LM head initializer ``head`` is the embedding ``table`` itself or a copy of it (16 samples,
    ``onnx_import``'s module docstring)."""
    if head == table.name:
        return True
    tensor = g.inits.get(head)
    emb = g.inits.get(table.name)
    if tensor is None or emb is None or tensor.data_type != emb.data_type:
        return False
    vocab, hidden = int(emb.dims[0]), int(emb.dims[1])
    head_dims = [int(d) for d in tensor.dims]
    if head_dims not in ([hidden, vocab], [vocab, hidden]):
        return False
    transposed = head_dims == [hidden, vocab]
    samples = []
    for k in range(TIE_SAMPLES):
        r, c = (k * 7919 + 3) % vocab, (k * 104729 + 5) % hidden
        a = g.element(table.name, r * hidden + c)
        b = g.element(head, c * vocab + r if transposed else r * hidden + c)
        if a is None or b is None or a != b:
            return False
        samples.append(a)
    return len(set(samples)) > 1


def read_tables(found, where: str):
    """Token and position embeddings and every norm's scale and bias of a recognised file, as float32."""
    g = found.graph

    def tensor(name: str, label: str) -> np.ndarray:
        value = g.constant_tensor(name)
        if value is None:
            node = g.node_of(name)
            while value is None and node is not None and node.op_type in ("Cast", "Identity"):
                value = g.constant_tensor(node.input[0])
                node = g.node_of(node.input[0])
        if value is None:
            raise InputError(where, f"{label}: {name!r} is not a constant")
        return read_tensor(g, value, label, where)

    hidden = found.model.hidden_size
    embed = tensor(found.embed_table.name, "token embedding")
    if found.embed_table.transposed:
        embed = embed.T
    pos = None
    if found.pos_table is not None:
        pos = tensor(found.pos_table.name, "position embedding")
        pos = (pos.T if found.pos_table.transposed else pos).reshape(-1, hidden)
    norms = {}
    for key, ref in found.norms.items():
        named = {found.model.num_layers: "final norm", -1: "embedding norm"}
        label = named.get(key[0], f"layer {key[0]} norm {key[1]}")
        w = tensor(ref.weight, f"{label} scale").reshape(-1) + np.float32(ref.offset) if ref.weight else None
        b = tensor(ref.bias, f"{label} bias").reshape(-1) if ref.bias else None
        norms[key] = (w, b)
    return ModelTables(embed=embed, pos_embed=pos, norms=norms)
