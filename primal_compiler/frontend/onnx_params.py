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
* the RoPE base comes from the inverse frequencies ``theta ** (-2i / d)``:
  a constant of ``head_dim / 2`` elements that a ``Cos`` depends on.

:func:`read_tables` then decodes the tensors so found (token and position
embeddings, norm scales and biases) as float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from primal_compiler.errors import InputError
from primal_compiler.frontend.onnx_graph import GraphIndex, attr

NORM_OPS = {"LayerNormalization": (1, 2), "SimplifiedLayerNormalization": (1, None), "RMSNormalization": (1, None),
            "SkipLayerNormalization": (2, 3), "SkipSimplifiedLayerNormalization": (2, None)}
EPS_CONSUMERS = {"Sqrt", "Reciprocal", "Pow", "Div"}
ONNX_DEFAULT_EPS = 1e-5  # the default ``epsilon`` of every ONNX normalization op


@dataclass(frozen=True)
class NormRef:
    """Where one norm's parameters are: tensor names (None when absent) and epsilon (None when unseen)."""

    weight: str | None
    bias: str | None
    eps: float | None


def norm_ref(g: GraphIndex, region: set[int], hidden: int) -> NormRef:
    """The scale, bias and epsilon of the norm whose nodes are ``region``."""
    weight = bias = eps = None
    for i in sorted(region):
        node = g.nodes[i]
        slots = NORM_OPS.get(node.op_type)
        if slots is not None:
            w, b = slots
            inputs = list(node.input) + ["", "", "", ""]
            return NormRef(inputs[w] or None, (inputs[b] or None) if b is not None else None,
                           float(attr(node, "epsilon", ONNX_DEFAULT_EPS)))
        if node.op_type not in ("Mul", "Add") or len(node.input) != 2:
            continue
        for x in node.input:
            if g.vector_len(x) == hidden and _is_constant(g, x):
                if node.op_type == "Mul":
                    weight = weight or x
                else:
                    bias = bias or x
            elif node.op_type == "Add" and eps is None and g.scalar(x) is not None and _feeds_root(g, node):
                eps = g.scalar(x)
    return NormRef(weight, bias, eps)


def _is_constant(g: GraphIndex, name: str) -> bool:
    for _ in range(8):
        if g.constant_tensor(name) is not None:
            return True
        node = g.node_of(name)
        if node is None or node.op_type not in ("Cast", "Identity"):
            return False
        name = node.input[0]
    return False


def _feeds_root(g: GraphIndex, node) -> bool:
    """``node``'s output reaches a Sqrt/Reciprocal/Pow/Div, maybe through Casts."""
    frontier = list(node.output)
    for _ in range(4):
        users = [g.nodes[i] for t in frontier for i in g.consumers.get(t, ())]
        if any(u.op_type in EPS_CONSUMERS for u in users):
            return True
        frontier = [o for u in users if u.op_type == "Cast" for o in u.output]
    return False


def rope_theta(g: GraphIndex, head_dim: int) -> float | None:
    """The RoPE base from the inverse-frequency constant a Cos depends on; None when there is none."""
    half = head_dim // 2
    for node in g.nodes:
        if node.op_type != "Cos":
            continue
        reached, _ = g.backward(node.input, frozenset())
        names = {x for i in reached for x in g.nodes[i].input if x}
        for name in sorted(names):
            value = g.const(name)
            if value is None or value.size != half or value.dtype.kind != "f":
                continue
            inv = value.astype(np.float64).reshape(-1)
            if half < 2 or inv[0] != 1.0 or not 0 < inv[1] < 1:
                continue
            theta = float(f"{inv[1] ** (-head_dim / 2):.6g}")  # float32 frequencies hold ~7 digits
            expected = theta ** (-2.0 * np.arange(half) / head_dim)
            if np.allclose(inv, expected, rtol=1e-4, atol=0):
                return float(theta)
    return None


def read_tables(found, where: str):
    """Token and position embeddings and every norm's scale and bias of a recognised file, as float32."""
    from primal_compiler.frontend.weights import ModelTables, _read

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
        return _read(g, value, label, where)

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
        label = "final norm" if key[0] == found.model.num_layers else f"layer {key[0]} norm {key[1]}"
        w = tensor(ref.weight, f"{label} scale").reshape(-1) if ref.weight else None
        b = tensor(ref.bias, f"{label} bias").reshape(-1) if ref.bias else None
        norms[key] = (w, b)
    return ModelTables(embed=embed, pos_embed=pos, norms=norms)
