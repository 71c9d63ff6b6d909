"""Small decoders built in-process with ``onnx.helper``, for tests that edit or mutate a graph.

:func:`fused_decoder` writes the same structure as a hand-written opset-23
export (RMSNormalization, RotaryEmbedding, the ONNX Attention op, tanh
Gelu); with ``external=True`` every weight is declared as external data in a
file that is never written, so its dimensions can be anything (10^12 included)
without allocating a byte.
"""

from __future__ import annotations

from math import prod

import onnx
from onnx import TensorProto, helper

ABSENT_DATA = "weights.absent.bin"  # the external-data file ``external=True`` names; never written


def fused_decoder(
    layers: int = 3,
    hidden: int = 64,
    heads: int = 8,
    kv_heads: int | tuple[int, ...] = 2,
    inter: int = 96,
    vocab: int = 100,
    *,
    parallel: bool = False,
    rope: bool = True,
    external: bool = False,
) -> onnx.ModelProto:
    """A decoder of ``layers`` blocks: hidden ``hidden``, ``heads`` query heads, ``kv_heads`` kv heads, MLP ``inter``.

    ``kv_heads`` may be a tuple, one count per layer.

    ``parallel`` makes it a GPT-J style block (the MLP reads the attention's
    input); ``rope=False`` drops the rotary embedding (no position encoding).
    Weights are zeros, or external and absent with ``external=True``.
    """
    head_dim = hidden // heads
    inits, nodes = [], []

    def weight(name, *dims):
        if external:
            tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=list(dims))
            tensor.data_location = TensorProto.EXTERNAL
            tensor.external_data.add(key="location", value=ABSENT_DATA)
        else:
            tensor = helper.make_tensor(name, TensorProto.FLOAT, list(dims), [0.0] * prod(dims))
        inits.append(tensor)
        return name

    def node(op, inputs, output, **attrs):
        nodes.append(helper.make_node(op, inputs, [output], **attrs))

    node("Gather", [weight("E", vocab, hidden), "ids"], "h0")
    weight("cos", 64, max(head_dim // 2, 1))
    weight("sin", 64, max(head_dim // 2, 1))
    h = "h0"
    per_layer = kv_heads if isinstance(kv_heads, tuple) else (kv_heads,) * layers
    for i, kv in enumerate(per_layer[:layers]):
        p = f"l{i}_"
        node("RMSNormalization", [h, weight(p + "n1", hidden)], p + "x", axis=-1)
        for r, out in (("q", heads * head_dim), ("k", kv * head_dim), ("v", kv * head_dim)):
            node("MatMul", [p + "x", weight(p + "W" + r, hidden, out)], p + r)
        for r in ("q", "k"):
            if rope:
                node("RotaryEmbedding", [p + r, "cos", "sin", "pos"], p + r + "r",
                     num_heads=heads if r == "q" else kv)
            else:
                node("Identity", [p + r], p + r + "r")
        node("Attention", [p + "qr", p + "kr", p + "v"], p + "a", q_num_heads=heads, kv_num_heads=kv)
        node("MatMul", [p + "a", weight(p + "Wo", heads * head_dim, hidden)], p + "o")
        node("Add", [h, p + "o"], p + "h1")
        node("RMSNormalization", [p + "h1", weight(p + "n2", hidden)], p + "y", axis=-1)
        node("MatMul", [p + ("x" if parallel else "y"), weight(p + "W1", hidden, inter)], p + "f")
        node("Gelu", [p + "f"], p + "g", approximate="tanh")
        node("MatMul", [p + "g", weight(p + "W2", inter, hidden)], p + "d")
        node("Add", [p + "h1", p + "d"], p + "h2")
        h = p + "h2"
    node("RMSNormalization", [h, weight("nf", hidden)], "hf", axis=-1)
    node("MatMul", ["hf", weight("H", hidden, vocab)], "logits")
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", "s"])
    pos = helper.make_tensor_value_info("pos", TensorProto.INT64, ["b", "s"])
    logits = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", "s", vocab])
    graph = helper.make_graph(nodes, "fused", [ids, pos], [logits], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
