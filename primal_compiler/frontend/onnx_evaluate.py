"""A part of an ONNX graph computed by onnx's reference evaluator: the frontend's one way to run nodes.

What the recognisers cannot read as a constant but the file computes from constants and a probe input
(ALiBi's bias on a probe prompt, ``onnx_alibi``; DoRA's column scale from the weights, ``onnx_dora``) is
evaluated here: :func:`producers` gathers every node a tensor depends on (shape computations included),
:func:`run` runs those nodes alone on the given feeds. A subgraph the reference evaluator cannot run gives
None, never an exception; the caller refuses it naming what it needed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from primal_compiler.frontend.onnx_graph import GraphIndex


def producers(g: GraphIndex, tensor: str) -> set[int]:
    """Every node ``tensor`` depends on, shape computations included (the walks of ``GraphIndex`` skip them)."""
    seen: set[int] = set()
    todo = [tensor]
    while todo:
        i = g.producer.get(todo.pop())
        if i is not None and i not in seen:
            seen.add(i)
            todo.extend(x for x in g.nodes[i].input if x)
    return seen


def run(g: GraphIndex, closure: set[int], tensor: str, feeds: dict[str, np.ndarray],
        read: Callable[[onnx.TensorProto], np.ndarray] | None = None) -> np.ndarray | None:
    """``tensor`` computed by the nodes ``closure`` from the graph's initializers (each as ``read`` gives it, when
    given: external data, quantized codes) and ``feeds`` (one array per graph input the nodes read, by name);
    None when an input has no feed or the evaluator fails."""
    nodes = [g.nodes[i] for i in sorted(closure)]
    used = {x for n in nodes for x in n.input if x}
    inits = [g.inits[x] if read is None else numpy_helper.from_array(read(g.inits[x]), x)
             for x in sorted(used) if x in g.inits]
    inputs = [i for i in g.model.graph.input if i.name in used and i.name not in g.inits]
    if any(i.name not in feeds for i in inputs):
        return None
    graph = helper.make_graph(nodes, "part", inputs, [helper.make_value_info(tensor, onnx.TypeProto())], inits)
    model = helper.make_model(graph, opset_imports=list(g.model.opset_import))
    try:
        outputs = cast(list[Any], ReferenceEvaluator(model).run(None, {i.name: feeds[i.name] for i in inputs}))
        return np.asarray(outputs[0])  # a list unless intermediate=True
    except Exception:  # noqa: BLE001 - a part the reference evaluator cannot run is refused by the caller
        return None
