"""Reading an ONNX file for recognition: every check that comes first, each problem a one-line InputError.

:func:`read_onnx` refuses, in this order:

1. anything but a readable regular file of at most ``inputs.ONNX_LIMIT_BYTES``
   (``inputs.read_bytes``: a FIFO, a device such as ``/dev/zero`` or a
   directory is recognised by ``stat`` and never opened);
2. bytes that do not parse as an ONNX model, a model without nodes, or a
   name that is not UTF-8 (protobuf hands such a string back as bytes, so
   every name the frontend reads is checked here);
3. a graph of more than :data:`MAX_NODES` nodes, counting the nodes of
   model-local functions as they will be inlined (and of subgraphs), or a
   local function that calls itself;
4. an initializer with a negative dimension, or stored as external data that
   names no file, a file outside the model's directory (an absolute path,
   ``..``) or an offset or length that is not a byte count;
5. a cyclic graph, naming a node on the cycle;
6. whatever ``onnx.checker.check_model(..., full_check=True)`` rejects
   (structure, single assignment, topological order, op schemas, strict shape
   inference), with the checker's message on one line.

External data is never needed: the frontend reads shapes only, so external
initializers are handed to the checker as graph inputs of the same type and
shape, and an absent external-data file is not an error here.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from primal_compiler.errors import InputError, one_line
from primal_compiler.inputs import ONNX_LIMIT_BYTES, read_bytes

#: Most nodes a graph may have, local functions inlined: 1024 layers of the largest exports
#: (about 310 nodes a layer: optimum's Mistral) fit three times over.
MAX_NODES = 1 << 20
_BYTE_COUNT = re.compile(r"[0-9]{1,20}")


def read_onnx(path: Path) -> onnx.ModelProto:
    """The model in ``path`` (external data not loaded) once it passes every check above."""
    where = str(path)
    data = read_bytes(path, ONNX_LIMIT_BYTES, "ONNX model")
    try:
        model = onnx.load_model_from_string(data)
    except Exception as exc:  # noqa: BLE001 - protobuf raises DecodeError, RuntimeWarning-as-error, ...
        raise InputError(where, f"not a readable ONNX model ({type(exc).__name__}: {one_line(exc)})") from None
    if not model.graph.node:
        raise InputError(where, "not an ONNX model with a graph (no nodes; truncated or not ONNX)")
    _check_text(model, where)
    nodes = _inlined_size(model, where)
    if nodes > MAX_NODES:
        raise InputError(where, f"has over {MAX_NODES:,} nodes (local functions inlined), the most the frontend "
                                "accepts (docs/frontend.md)")
    _check_initializers(model.graph, where)
    _check_acyclic(model.graph, where)
    _check_with_onnx(model, data, where)
    return model


# --------------------------------------------------------------------------- text and size


def _check_text(model: onnx.ModelProto, where: str) -> None:
    for text in _names(model):
        if not isinstance(text, str):  # protobuf (upb) hands back a name that is not UTF-8 as bytes
            raise InputError(where, f"not a readable ONNX model (a name is not UTF-8 text: {text[:60]!r})")


def _names(model: onnx.ModelProto) -> Iterator[str | bytes]:
    """Every name the frontend reads: of the producer, functions, nodes, attributes, initializers, graph i/o."""
    yield model.producer_name
    yield model.producer_version
    for function in model.functions:
        yield from _key(function)
    bodies = (node for function in model.functions for node in function.node)
    for node in _nodes(itertools.chain(model.graph.node, bodies)):
        yield from (node.name, node.op_type, node.domain, *node.input, *node.output)
        for a in node.attribute:
            yield from (a.name, a.t.name)
    for tensor in model.graph.initializer:
        yield tensor.name
        for e in tensor.external_data:
            yield from (e.key, e.value)
    for value in (*model.graph.input, *model.graph.output):
        yield value.name


def _nodes(nodes: Iterable[onnx.NodeProto]) -> Iterator[onnx.NodeProto]:
    """``nodes`` and the nodes of their subgraphs (If/Loop/Scan bodies), depth first."""
    stack = [iter(nodes)]
    while stack:
        node = next(stack[-1], None)
        if node is None:
            stack.pop()
            continue
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                stack.append(iter(attr.g.node))
            elif attr.type == onnx.AttributeProto.GRAPHS:
                stack.extend(iter(g.node) for g in attr.graphs)


def _key(node_or_function) -> tuple[str, str, str]:
    name = node_or_function.name if isinstance(node_or_function, onnx.FunctionProto) else node_or_function.op_type
    return node_or_function.domain, name, getattr(node_or_function, "overload", "")


def _inlined_size(model: onnx.ModelProto, where: str) -> int:
    """Nodes of the graph once local functions are inlined, capped just over MAX_NODES."""
    functions = {_key(f): f for f in model.functions}
    size: dict[tuple[str, str, str], int] = {}
    active: set[tuple[str, str, str]] = set()

    def calls(key):
        return {_key(n) for n in _nodes(functions[key].node)} & functions.keys()

    for root in functions:
        stack = [(root, False)]
        while stack:
            key, finished = stack.pop()
            if finished:
                active.discard(key)
                size[key] = min(MAX_NODES + 1, sum(size.get(_key(n), 1) for n in _nodes(functions[key].node)))
                continue
            if key in size:
                continue
            if key in active:
                raise InputError(where, f"local function {key[0]}.{key[1]} calls itself")
            active.add(key)
            stack.append((key, True))
            for callee in calls(key):
                if callee in active:
                    raise InputError(where, f"local function {callee[0]}.{callee[1]} calls itself")
                if callee not in size:
                    stack.append((callee, False))
    total = 0
    for node in _nodes(model.graph.node):
        total += size.get(_key(node), 1)
        if total > MAX_NODES:
            break
    return total


# --------------------------------------------------------------------------- initializers and structure


def _check_initializers(graph: onnx.GraphProto, where: str) -> None:
    for tensor in graph.initializer:
        if any(d < 0 for d in tensor.dims):
            raise InputError(where, f"initializer {tensor.name!r} has a negative dimension {list(tensor.dims)}")
        if tensor.data_location != TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in tensor.external_data}
        location = info.get("location", "")
        if not location:
            raise InputError(where, f"initializer {tensor.name!r} is stored as external data but names no file")
        parts = Path(location).parts if "\x00" not in location else ("..",)
        if os.path.isabs(location) or location.startswith("\\") or ".." in parts:
            raise InputError(
                where, f"initializer {tensor.name!r} names external data {location!r} outside the model's directory"
            )
        for key in ("offset", "length"):
            if key in info and not _BYTE_COUNT.fullmatch(info[key]):
                raise InputError(where, f"initializer {tensor.name!r}: external data {key} {info[key]!r} is not "
                                        "a byte count")


def _check_acyclic(graph: onnx.GraphProto, where: str) -> None:
    """Kahn's algorithm over the data flow; on a cycle, name a node on it (not one merely after it)."""
    nodes = graph.node
    sources = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    producer: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for out in node.output:
            if out and out not in sources:
                producer.setdefault(out, i)
    users: list[list[int]] = [[] for _ in nodes]
    waiting = [0] * len(nodes)
    for i, node in enumerate(nodes):
        for x in set(node.input):
            j = producer.get(x)
            if j is not None:
                users[j].append(i)
                waiting[i] += 1
    ready = [i for i, w in enumerate(waiting) if w == 0]
    while ready:
        for k in users[ready.pop()]:
            waiting[k] -= 1
            if waiting[k] == 0:
                ready.append(k)
    stuck = next((i for i, w in enumerate(waiting) if w > 0), None)
    if stuck is None:
        return
    seen: set[int] = set()
    while stuck not in seen:  # every stuck node has a stuck producer: walking back must close a loop
        seen.add(stuck)
        stuck = next(producer[x] for x in nodes[stuck].input if x in producer and waiting[producer[x]] > 0)
    node = nodes[stuck]
    label = f"{node.name!r}" if node.name else f"#{stuck}"
    raise InputError(where, f"the graph has a cycle: node {label} ({node.op_type}) depends on its own output")


def _check_with_onnx(model: onnx.ModelProto, data: bytes, where: str) -> None:
    external = [t for t in model.graph.initializer if t.data_location == TensorProto.EXTERNAL]
    if external:
        probe = onnx.ModelProto()
        probe.CopyFrom(model)
        graph = probe.graph
        inline = [t for t in graph.initializer if t.data_location != TensorProto.EXTERNAL]
        declared = {i.name for i in graph.input}
        del graph.initializer[:]
        graph.initializer.extend(inline)
        graph.input.extend(
            helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in external if t.name not in declared
        )
        data = probe.SerializeToString()
    try:
        onnx.checker.check_model(data, full_check=True)
    except Exception as exc:  # noqa: BLE001 - ValidationError, InferenceError, ValueError (too large), ...
        raise InputError(where, f"rejected by onnx's checker: {one_line(exc)}") from None
