"""What ``primal check`` runs ONNX Runtime on: the file as written, or its float-activation twin.

A file quantized dynamically by ONNX Runtime (``DynamicQuantizeLinear``,
``MatMulInteger``, ``Cast``, ``Mul``) has each projection's input quantized
to uint8 per tensor at run time. That is the runtime's choice of how to
multiply, not part of the weights, and the replay keeps activations in
float (the accelerator quantizes its inputs its own way, in hardware mode).
The twin replaces every such chain by ``MatMul(x, (Cast(codes) -
Cast(zero point)) * scale)`` built with standard ops from the file's own
tensors, so ONNX Runtime, not this frontend, decodes the weights, and only
the activation quantization is gone. A file quantized statically
(``quantize_static``, QDQ: a ``QuantizeLinear`` of a computed tensor read
back by ``DequantizeLinear`` at a calibrated scale) gets each such pair
replaced by an ``Identity``, as the frontend reads it; its quantized
weights stay as the file computes them.
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper

from primal_compiler.frontend.onnx_quant import activation_pair, indexes, integer_chain, rebuild


def float_activation_twin(path: str | Path) -> bytes | None:
    """The serialized twin; None when the file quantizes no activation."""
    model = onnx.load(str(path))
    graph = model.graph
    inits, producer, consumers = indexes(graph)
    replace: dict[int, list[onnx.NodeProto]] = {}
    drop: set[int] = set()
    for i, node in enumerate(graph.node):
        if node.op_type == "QuantizeLinear" and (node.domain or "") in ("", "ai.onnx"):
            activation_pair(node, i, graph, inits, producer, consumers, replace, drop)
        if node.op_type != "MatMulInteger":
            continue
        chain = integer_chain(graph, i, inits, producer, consumers)
        if chain is None:
            continue
        out = chain.output
        codes = helper.make_node("Cast", [chain.codes], [f"{out}/codes"], to=TensorProto.FLOAT)
        nodes = [codes]
        centred = codes.output[0]
        if chain.zero_point:
            nodes.append(helper.make_node("Cast", [chain.zero_point], [f"{out}/zp"], to=TensorProto.FLOAT))
            nodes.append(helper.make_node("Sub", [centred, f"{out}/zp"], [f"{out}/centred"]))
            centred = f"{out}/centred"
        nodes.append(helper.make_node("Mul", [centred, chain.scale], [f"{out}/weight"]))
        nodes.append(helper.make_node("MatMul", [chain.x, f"{out}/weight"], [out]))
        replace[chain.final] = nodes
        drop.update(chain.nodes)
    if not replace and not drop:
        return None
    rebuild(graph, replace, drop)
    return model.SerializeToString()
