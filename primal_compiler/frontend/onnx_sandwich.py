"""Sandwich norms (Gemma 2 and 3): each branch normed again before its residual add,
``h = h + n3(attn(n1(h)))``, ``h = h + n4(mlp(n2(h)))``.

:func:`post_norms` finds, for every layer, the residual ``Add`` that its O and its MLP output projections
feed (the first one their outputs reach) and reads the norm between the projection and that ``Add``, on the
branch's side (``Decoder.norm_before``, as for the norms before a projection). A layer has both or neither;
a norm of another kind than the layer's, a sandwich on a parallel block (where both branches meet one
``Add``) and a branch whose add cannot be found are refused, naming the layer.
"""

from __future__ import annotations

from primal_compiler.frontend.onnx_decoder import Decoder, Layer
from primal_compiler.frontend.onnx_graph import PatternError
from primal_compiler.frontend.onnx_params import NormRef, norm_ref


def post_norms(dec: Decoder, layers: list[Layer], stops: set[int], residual: set[int],
               hidden: int) -> dict[tuple[int, int], tuple[NormRef, set[int]]]:
    """``{(layer, 2 | 3): (the norm after the attention's | the MLP's output, its nodes)}``, setting
    ``post_norms`` and ``num_norms`` of each layer that has them (module docstring)."""
    found: dict[tuple[int, int], tuple[NormRef, set[int]]] = {}
    for n, layer in enumerate(layers):
        mlp_out, kind, _ = layer.recognised()
        have = {}
        for which, proj, what in ((2, layer.o, "attention"), (3, mlp_out, "MLP")):
            branch = _branch_input(dec, proj.node, residual)
            if branch is None:
                continue
            got = dec.norm_before(branch, stops)
            if got is None:
                continue
            if got != kind:
                raise PatternError(f"unsupported sandwich norm in layer {n}: the {what} output's norm is a {got}, "
                                   f"the layer's norms are {kind}s")
            region = dec.norm_region(branch, stops)
            have[which] = (norm_ref(dec.g, region, hidden), region)
        if not have:
            continue
        if layer.parallel:
            raise PatternError(f"unsupported sandwich norm in layer {n}: a parallel block's branches are normed "
                               "after the projections")
        if len(have) == 1:
            what = "attention" if 2 in have else "MLP"
            raise PatternError(f"unsupported sandwich norm in layer {n}: only the {what} output is normed before "
                               "its residual add")
        if layer.num_norms != 2:
            raise PatternError(f"unsupported sandwich norm in layer {n}: {layer.num_norms} norm(s) before its "
                               "projections, not 2")
        layer.post_norms, layer.num_norms = True, 4
        found.update({(n, w): v for w, v in have.items()})
    return found


def no_pre_norm(dec: Decoder, n: int, layer: Layer, stops: set[int], residual: set[int]) -> str:
    """Why layer ``n``, which has no norm before its projections, is refused: OLMo 2's reordered norms (the
    attention output normed before its residual add, nothing normed before) are named as such."""
    branch = _branch_input(dec, layer.o.node, residual)
    if branch is not None and dec.norm_before(branch, stops) is not None:
        return (f"unsupported decoder layer {n}: its attention output is normed before the residual add but nothing "
                "is normed before the projections (reordered post-norms, as OLMo 2's)")
    return "unsupported decoder layer: no LayerNorm or RMSNorm before attention or MLP"


def _branch_input(dec: Decoder, node: int, residual: set[int]) -> str | None:
    """The tensor the first residual ``Add`` that projection ``node``'s output reaches takes from it."""
    g = dec.g
    reached, _ = g.forward(g.nodes[node].output, dec.barriers)
    adds = sorted(reached & residual)
    if not adds:
        return None
    add = g.nodes[adds[0]]
    mine = set(g.nodes[node].output) | {t for i in reached if i < adds[0] for t in g.nodes[i].output}
    side = [x for x in add.input if x in mine]
    return side[0] if len(side) == 1 else None
