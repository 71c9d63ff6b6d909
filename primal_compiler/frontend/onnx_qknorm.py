"""Query and key head norms (Qwen3, Gemma 3): every head of q and of k RMS-normalised over its ``head_dim``
elements, with one weight for q and one for k (``head_dim`` values each, or ``1 + w``), after the projection
and before RoPE.

:func:`qk_norms` follows each q and k projection's output past its layout ops, bias and LoRA to where it forks
or meets its first other op, and looks a few ops further for the norm: a fused RMSNormalization /
SimplifiedLayerNormalization, or a decomposition ending in a ``Mul`` by a constant of ``head_dim`` values (or
``w + c`` of one); its nodes are what that ``Mul`` depends on back to the projection, and ``norm_ref`` reads
its weight, offset and epsilon. A layer that norms q but not k (or k but not q), a norm whose weight spans
the whole projection (OLMo 2 norms every head at once), and a mean subtracted (a LayerNorm) are refused,
naming the layer. A fused qkv's norms are not looked for: their nodes are refused by ``onnx_guard``.
"""

from __future__ import annotations

from primal_compiler.frontend.onnx_branches import after_projection
from primal_compiler.frontend.onnx_decoder import Decoder, Layer
from primal_compiler.frontend.onnx_graph import PatternError
from primal_compiler.frontend.onnx_params import NORM_OPS, NormRef, norm_ref
from primal_compiler.frontend.onnx_project import Projection
from primal_compiler.ir.model import Role

WHICH = {Role.Q: 4, Role.K: 5}
"""The key of a layer's q and k head norm beside its other norms (``Recognised.norms``)."""

DEPTH = 8  # ops from where the projection's output forks to its norm's weight


def qk_norms(dec: Decoder, layers: list[Layer]) -> dict[tuple[int, int], tuple[NormRef, set[int]]]:
    """``{(layer, 4 | 5): (its q | k head norm, the norm's nodes)}``, setting ``qk_norm`` of each layer with
    them (module docstring)."""
    found: dict[tuple[int, int], tuple[NormRef, set[int]]] = {}
    for n, layer in enumerate(layers):
        have = {}
        for p in layer.attn:
            if p.role in WHICH:
                got = _head_norm(dec, p, layer.head_dim, n)
                if got is not None:
                    have[WHICH[p.role]] = got
        if len(have) == 1:
            normed, bare = ("queries", "keys") if WHICH[Role.Q] in have else ("keys", "queries")
            raise PatternError(f"unsupported q/k norm in layer {n}: its {normed} are normed, its {bare} not")
        if have:
            layer.qk_norm = True
            found.update({(n, w): v for w, v in have.items()})
    return found


def _head_norm(dec: Decoder, p: Projection, hd: int, n: int) -> tuple[NormRef, set[int]] | None:
    """The head norm on ``p``'s output and its nodes, or None where there is none."""
    g = dec.g
    _, start = after_projection(g, g.nodes[p.node].output[0])
    frontier, seen = [start], set[int]()
    for _ in range(DEPTH):
        nxt = []
        for i in sorted({i for t in frontier for i in g.consumers.get(t, ())} - seen - dec.barriers):
            seen.add(i)
            node = g.nodes[i]
            if node.op_type in ("MatMul", "Softmax"):
                continue
            if node.op_type in NORM_OPS or (node.op_type == "Mul" and _weight_len(g, node) in (hd, p.out_features)):
                return _region(dec, p, start, i, hd, n)
            nxt += list(node.output)
        frontier = nxt
    return None


def _weight_len(g, node) -> int:
    """Elements of ``node``'s constant input (or of the constant ``w`` of a ``w + c`` input), 0 without one."""
    for x in node.input:
        src = g.node_of(x)
        if src is not None and src.op_type == "Add" and all(g.constant_tensor(y) is not None for y in src.input):
            x = max(src.input, key=lambda y: g.vector_len(y) or 0)
        if g.constant_tensor(x) is not None and (g.vector_len(x) or 0) > 1:
            return g.vector_len(x) or 0
    return 0


def _region(dec: Decoder, p: Projection, start: str, end: int, hd: int, n: int) -> tuple[NormRef, set[int]] | None:
    g = dec.g
    stop = {g.producer[start]} if start in g.producer else set()
    reached, _ = g.backward(g.nodes[end].output, dec.barriers, stop=stop)
    region = reached - stop
    ops = {g.nodes[i].op_type for i in region}
    if not ops & {"ReduceMean", *NORM_OPS}:
        return None  # a Mul by a constant vector that is no norm
    what = "queries" if p.role == Role.Q else "keys"
    if "Sub" in ops or ops & {"LayerNormalization", "SkipLayerNormalization"}:
        raise PatternError(f"unsupported q/k norm in layer {n}: the {what}' norm subtracts a mean (a LayerNorm)")
    if _weight_len(g, g.nodes[end]) == p.out_features != hd:
        raise PatternError(f"unsupported q/k norm in layer {n}: the {what}' norm spans the whole "
                           f"{p.out_features}-wide projection, not each {hd}-wide head")
    ref = norm_ref(g, region, hd)
    if ref.weight is None:
        raise PatternError(f"unsupported q/k norm in layer {n}: no {hd}-value weight found for the {what}' norm")
    return ref, region
