"""Which projections are each decoder layer's MLP, found by data flow (``onnx_import`` uses it).

An MLP input projection of layer l reads what layer l's attention output
projection (o) produced: the post-attention residual stream, through the
second norm. In a *parallel* block (GPT-J, GPT-NeoX, Falcon, Phi-2) it
instead reads exactly what layer l's attention inputs read, the layer
input, through the attention's norm or one of its own; the layer is then
marked ``parallel``. The MLP output projection is the one that reads only
one layer's MLP inputs. A hidden-sized projection left over is refused
(an extra projection), and so is a layer whose MLP inputs mix the two.
"""

from __future__ import annotations

from primal_compiler.frontend.onnx_decoder import Decoder, Layer
from primal_compiler.frontend.onnx_graph import PatternError
from primal_compiler.frontend.onnx_project import Projection
from primal_compiler.ir.model import Role


def assign_mlp(dec: Decoder, layers: list[Layer], lm_head: Projection) -> None:
    """MLP inputs depend on a layer's o, or (a parallel block) on exactly what its attention inputs depend
    on; MLP outputs depend only on that layer's MLP inputs."""
    o_layer = {layer.o.node: i for i, layer in enumerate(layers)}
    taken = {p.node for layer in layers for p in (*layer.attn, layer.o)} | {lm_head.node}
    rest = [p for p in dec.projections if p.node not in taken]
    hits = {p.node: dec.hits_back(p.x) for p in rest}
    upstream = [frozenset(dec.hits_back(layer.attn[0].x)) for layer in layers]
    mlp_in_layer: dict[int, int] = {}
    for p in rest:
        owners = [o_layer[n] for n in hits[p.node] if n in o_layer]
        beside = [i for i, up in enumerate(upstream) if up == hits[p.node]]
        if beside:  # reads the layer input beside the attention: a parallel block
            mlp_in_layer[p.node] = beside[0]
            layers[beside[0]].parallel = True
        elif owners:
            mlp_in_layer[p.node] = max(owners)
    for p in rest:
        if p.node in mlp_in_layer:
            layers[mlp_in_layer[p.node]].mlp_in.append(p)
    for p in rest:
        if p.node in mlp_in_layer or not hits[p.node]:
            continue
        readers = {mlp_in_layer.get(n) for n in hits[p.node]}
        only = readers.pop() if len(readers) == 1 else None
        if only is not None:
            layer = layers[only]
            if layer.mlp_out is not None:
                raise PatternError("unsupported MLP: two projections consume the MLP inputs")
            layer.mlp_out = p
    used = {p.node for layer in layers for p in (*layer.mlp_in, layer.mlp_out) if p is not None}
    hidden = layers[0].attn[0].in_features
    for p in rest:
        if p.node not in used and hidden in (p.in_features, p.out_features):
            raise PatternError(
                f"unsupported structure: a {p.in_features}x{p.out_features} weight matmul outside the "
                "attention/MLP pattern (an extra projection)"
            )
    for i, layer in enumerate(layers):
        if not layer.mlp_in or layer.mlp_out is None:
            raise PatternError(f"unsupported decoder layer {i}: no MLP found after the attention output projection")
        if layer.parallel and any(set(hits[p.node]) != upstream[i] for p in layer.mlp_in):
            raise PatternError(f"unsupported decoder layer {i}: some MLP inputs read the layer input, others the "
                               "attention output")
        layer.activation, layer.mlp_in = dec.activation(layer.mlp_in, layer.mlp_out)
        layer.mlp_out.role = Role.FC2 if layer.mlp_in[0].role == Role.FC1 else Role.DOWN
