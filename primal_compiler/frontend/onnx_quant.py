"""Quantized ONNX weights, read as what the file stores: integer codes, scales, zero points and block sizes.

:func:`dequantize_graph` rewrites a loaded model in place, before the
decoder recogniser sees it, so that every recognised quantized pattern
becomes the float graph it computes; each rewritten weight becomes a float
*placeholder* initializer with the right dims and no data, and the returned
:class:`QuantTable` says how ``quant_codes.decode`` decodes it on demand
(``frontend.weights`` reads every constant through it). Shape-only imports never decode a weight. Recognised:

* ``DequantizeLinear(codes, scale[, zero_point])`` of constants (int4,
  uint4, int8, uint8, int16, uint16 codes): per tensor, per ``axis`` or in
  blocks of ``block_size`` along it (opset 21), also behind a
  ``QuantizeLinear`` of a float constant (fake-quantized weights); it
  folds to the constant it computes, whatever consumes it;
* ``com.microsoft`` ``MatMulNBits`` (2, 4 or 8 bits; ``block_size`` a power
  of two of at least 16; packed uint8 or float zero points, default
  ``2**(bits-1)``; no ``g_idx``): becomes ``MatMul`` with its weight, plus
  an ``Add`` of its bias;
* ``MatMulInteger(DynamicQuantizeLinear(x), codes, x_zp, w_zp)``, then
  ``Cast`` to float and ``Mul`` by ``x_scale * w_scale`` (ONNX Runtime's
  dynamic quantization): becomes ``MatMul(x, W)``. Its placeholder's op
  ``MatMulInteger`` records that onnxruntime quantizes that input to uint8
  per tensor at run time, which the replay does not (it is a property of
  the runtime, not of the weights);
* ``Gather`` of integer table codes followed by a per-tensor
  ``DequantizeLinear`` (a dynamically quantized embedding);
* ``QuantizeLinear`` of a computed tensor whose every consumer is a
  ``DequantizeLinear`` (ONNX Runtime's ``quantize_static`` in QDQ format:
  int8 activations at calibrated scales): each pair becomes an
  ``Identity``, counted in :attr:`QuantTable.activations`. As for dynamic
  quantization, how the runtime rounds activations is not the accelerator's
  (the replay keeps them in float; in hardware mode it quantizes its
  inputs its own way), and ``primal check`` compares with the file's
  float-activation twin.

A pattern recognised but not supported (float8 codes, a ``g_idx``, an odd
block size, shapes that disagree with the attributes) is a
:class:`PatternError` naming the node; quantized nodes outside these
patterns stay in the graph and the hidden-state guard refuses them by name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import onnx
from onnx import TensorProto, helper

from primal_compiler.frontend.onnx_graph import PatternError
from primal_compiler.frontend.quant_codes import CODE_BITS, QuantWeight
from primal_compiler.ir.quant import WeightQuant

#: The bit widths MatMulNBits may have here.
NBITS_BITS = (2, 4, 8)


@dataclass(eq=False)
class QuantTable:
    """The placeholders of a rewritten graph, by initializer name."""

    weights: dict[str, QuantWeight] = field(default_factory=dict)
    activations: int = 0  # activation tensors quantized and dequantized in place (static QDQ), now Identity


def dequantize_graph(model: onnx.ModelProto) -> QuantTable:
    """Rewrite ``model.graph`` in place (see the module docstring); the table of what was rewritten."""
    graph = model.graph
    inits, producer, consumers = indexes(graph)
    table, placeholders = QuantTable(), []
    drop: set[int] = set()
    replace: dict[int, list[onnx.NodeProto]] = {}

    def const(name: str) -> TensorProto | None:
        return inits.get(name) if name else None

    def placeholder(name: str, dims, spec: QuantWeight) -> None:
        placeholders.append((name, [int(d) for d in dims]))
        table.weights[name] = spec

    for i, node in enumerate(graph.node):
        label = node.name or f"{node.op_type} {i}"
        domain = node.domain or ""
        if node.op_type == "DequantizeLinear" and domain in ("", "ai.onnx"):
            _fold_dq(node, i, label, const, producer, graph, drop, placeholder)
        elif node.op_type == "MatMulNBits" and domain == "com.microsoft":
            replace[i] = _nbits(node, label, const, placeholder)
        elif node.op_type == "MatMulInteger" and domain in ("", "ai.onnx"):
            found = _integer(node, i, label, graph, inits, producer, consumers, placeholder)
            if found is not None:
                replace[found[0]] = found[1]
                drop.update(found[2])
        elif node.op_type == "Gather":
            _quantized_gather(node, i, graph, const, consumers, placeholder, replace, drop)
        elif node.op_type == "QuantizeLinear" and domain in ("", "ai.onnx"):
            table.activations += activation_pair(node, i, graph, inits, producer, consumers, replace, drop)
    if not table.weights and not table.activations:
        return table
    rebuild(graph, replace, drop)
    for name, dims in placeholders:
        graph.initializer.add(name=name, data_type=TensorProto.FLOAT, dims=dims)
    return table


def _fold_dq(node, i, label, const, producer, graph, drop, placeholder) -> None:
    """A DequantizeLinear of constants (or of QuantizeLinear of a float constant) becomes a placeholder."""
    inputs = list(node.input) + ["", ""]
    codes, quantize_from = const(inputs[0]), ""
    q = producer.get(inputs[0])
    if codes is None and q is not None and graph.node[q].op_type == "QuantizeLinear":
        qn = graph.node[q]
        src = const(qn.input[0])
        if src is None or src.data_type not in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16):
            return
        qin = list(qn.input) + ["", ""]
        if (qin[1], qin[2]) != (inputs[1], inputs[2]) or _attrs(qn) != _attrs(node):
            raise PatternError(f"node {label}: its QuantizeLinear uses another scale, zero point or axis")
        out_type = const(inputs[2]).data_type if inputs[2] else TensorProto.UINT8
        codes, quantize_from = TensorProto(name=qn.output[0], data_type=out_type, dims=src.dims), qn.input[0]
    if codes is None or const(inputs[1]) is None or (inputs[2] and const(inputs[2]) is None):
        return  # an activation's DequantizeLinear: left to the guard
    if codes.data_type not in CODE_BITS:
        name = TensorProto.DataType.Name(codes.data_type)
        raise PatternError(f"node {label}: DequantizeLinear of {name} codes is not supported "
                           f"(int4, uint4, int8, uint8, int16, uint16)")
    a = _attrs(node)
    spec = QuantWeight("DequantizeLinear", label, codes.name, inputs[1], inputs[2], a.get("axis", 1),
                       a.get("block_size", 0), CODE_BITS[codes.data_type], quantize_from=quantize_from,
                       code_type=codes.data_type)
    placeholder(node.output[0], codes.dims, spec)
    drop.add(i)


def activation_pair(node, i, graph, inits, producer, consumers, replace, drop) -> int:
    """1 when ``node`` quantizes a computed tensor that only ``DequantizeLinear`` nodes read back, with its own
    scale, zero point and axis (each becomes an ``Identity`` of the tensor); else 0, the graph untouched."""
    x = node.input[0]
    src = producer.get(x)
    if x in inits or (src is not None and graph.node[src].op_type == "Constant"):
        return 0  # a fake-quantized constant: _fold_dq's
    readers = consumers.get(node.output[0], [])
    own = (list(node.input) + ["", ""])[1:3]
    if not readers or any(graph.node[j].op_type != "DequantizeLinear" or (list(graph.node[j].input) + ["", ""])[1:3]
                          != own or _attrs(graph.node[j]) != _attrs(node) for j in readers):
        return 0
    for j in readers:
        replace[j] = [helper.make_node("Identity", [x], [graph.node[j].output[0]], name=graph.node[j].name)]
    drop.add(i)
    return 1


def _nbits(node, label, const, placeholder) -> list[onnx.NodeProto]:
    a = _attrs(node)
    k, n, bits, block = a.get("K", 0), a.get("N", 0), a.get("bits", 4), a.get("block_size", 0)
    inputs = list(node.input) + [""] * 6
    if bits not in NBITS_BITS:
        raise PatternError(f"node {label}: MatMulNBits with bits={bits} is not supported (2, 4 or 8)")
    if block < 16 or block & (block - 1):
        raise PatternError(f"node {label}: MatMulNBits block_size {block} is not supported "
                           "(a power of two, at least 16)")
    if inputs[4]:
        raise PatternError(f"node {label}: MatMulNBits with g_idx (act-order) is not supported")
    if k < 1 or n < 1 or any(const(x) is None for x in inputs[1:3]) or (inputs[3] and const(inputs[3]) is None):
        raise PatternError(f"node {label}: MatMulNBits needs K, N and constant weights, scales and zero points")
    blocks = -(-k // block)
    want = {inputs[1]: n * blocks * block * bits // 8, inputs[2]: n * blocks}
    for name, size in want.items():
        if math.prod(const(name).dims) != size:
            raise PatternError(f"node {label}: MatMulNBits input {name!r} has {math.prod(const(name).dims)} "
                               f"elements, K={k}, N={n}, bits={bits}, block_size={block} need {size}")
    out = node.output[0]
    weight = f"{out}/dequantized"
    placeholder(weight, (k, n), QuantWeight("MatMulNBits", label, inputs[1], inputs[2], inputs[3], 0, block,
                                            bits, k, n))
    if not inputs[5]:
        return [helper.make_node("MatMul", [inputs[0], weight], [out], name=node.name)]
    mid = f"{out}/matmul"
    return [helper.make_node("MatMul", [inputs[0], weight], [mid], name=node.name),
            helper.make_node("Add", [mid, inputs[5]], [out], name=f"{node.name}/bias")]


@dataclass(frozen=True)
class Chain:
    """One dynamically quantized MatMul: ``DynamicQuantizeLinear(x)``, ``MatMulInteger``, ``Cast``, ``Mul``."""

    x: str  # the float input
    codes: str  # the weight codes (K x N)
    zero_point: str  # the weight's zero point ("" for none)
    scale: str  # the weight's scale (scalar or N)
    output: str  # the float output of the final Mul
    final: int  # the final Mul's node index
    nodes: tuple[int, ...]  # MatMulInteger and Cast


def integer_chain(graph, i: int, inits: dict, producer: dict, consumers: dict) -> Chain | None:
    """The dynamic quantization chain whose ``MatMulInteger`` is node ``i``, or None."""
    node = graph.node[i]
    inputs = list(node.input) + ["", ""]
    dq = producer.get(inputs[0])
    w = inits.get(inputs[1])
    if dq is None or graph.node[dq].op_type != "DynamicQuantizeLinear" or w is None or w.data_type not in CODE_BITS:
        return None
    dql = graph.node[dq]
    if inputs[2] != dql.output[2] or (inputs[3] and inputs[3] not in inits):
        return None
    cast = _single(graph, consumers, node.output[0], "Cast")
    if cast is None or _attrs(graph.node[cast]).get("to") != TensorProto.FLOAT:
        return None
    mul = _single(graph, consumers, graph.node[cast].output[0], "Mul")
    if mul is None:
        return None
    other = [x for x in graph.node[mul].input if x != graph.node[cast].output[0]]
    s = producer.get(other[0]) if len(other) == 1 else None
    if s is None or graph.node[s].op_type != "Mul" or dql.output[1] not in graph.node[s].input:
        return None
    w_scale = [x for x in graph.node[s].input if x != dql.output[1]]
    if len(w_scale) != 1 or w_scale[0] not in inits:
        return None
    return Chain(dql.input[0], inputs[1], inputs[3], w_scale[0], graph.node[mul].output[0], mul, (i, cast))


def _integer(node, i, label, graph, inits, producer, consumers, placeholder):
    """A chain as (final Mul index, its replacing MatMul, nodes dropped), its weight a placeholder."""
    chain = integer_chain(graph, i, inits, producer, consumers)
    if chain is None:
        return None
    w = inits[chain.codes]
    weight = f"{chain.output}/dequantized"
    placeholder(weight, w.dims, QuantWeight("MatMulInteger", label, chain.codes, chain.scale, chain.zero_point,
                                            1, 0, CODE_BITS[w.data_type], code_type=w.data_type))
    return chain.final, [helper.make_node("MatMul", [chain.x, weight], [chain.output], name=node.name)], chain.nodes


def _quantized_gather(node, i, graph, const, consumers, placeholder, replace, drop) -> None:
    """A Gather of integer table codes then a per-tensor DequantizeLinear becomes a Gather of a placeholder."""
    table = const(node.input[0])
    dq = _single(graph, consumers, node.output[0], "DequantizeLinear")
    if table is None or table.data_type not in CODE_BITS or dq is None:
        return
    dqn = graph.node[dq]
    inputs = list(dqn.input) + ["", ""]
    scale, zp = const(inputs[1]), const(inputs[2]) if inputs[2] else None
    if scale is None or math.prod(scale.dims) != 1 or (inputs[2] and (zp is None or math.prod(zp.dims) != 1)):
        return
    label = dqn.name or f"DequantizeLinear {dq}"
    name = f"{table.name}/dequantized"
    placeholder(name, table.dims, QuantWeight("Gather", label, table.name, inputs[1], inputs[2], 1, 0,
                                              CODE_BITS[table.data_type], code_type=table.data_type))
    replace[i] = [helper.make_node("Gather", [name, node.input[1]], [dqn.output[0]], name=node.name,
                                   axis=_attrs(node).get("axis", 0))]
    drop.add(dq)


def indexes(graph) -> tuple[dict, dict[str, int], dict[str, list[int]]]:
    """(initializers by name, producing node of each tensor, consuming nodes of each tensor)."""
    producer = {o: i for i, n in enumerate(graph.node) for o in n.output if o}
    consumers: dict[str, list[int]] = {}
    for i, n in enumerate(graph.node):
        for x in n.input:
            consumers.setdefault(x, []).append(i)
    return {t.name: t for t in graph.initializer}, producer, consumers


def rebuild(graph, replace: dict[int, list], drop: set[int]) -> None:
    """Replace nodes by index (each by a list of nodes), drop others and what is left unconsumed."""
    drop = drop | _orphans(graph, drop, replace)
    nodes = []
    for i, node in enumerate(graph.node):
        if i in replace:
            nodes.extend(replace[i])
        elif i not in drop:
            nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)


def _orphans(graph, drop: set[int], replace: dict) -> set[int]:
    """Nodes left with no consumer once ``drop`` and ``replace`` are gone (the scale products, the
    DynamicQuantizeLinear shared by several projections), to a fixed point; graph outputs keep theirs."""
    gone = set(drop) | set(replace)
    outputs = {o.name for o in graph.output}
    orphans: set[int] = set()
    while True:
        live = {x for i, n in enumerate(graph.node) if i not in gone | orphans for x in n.input}
        live |= {x for nodes in replace.values() for n in nodes for x in n.input} | outputs
        more = {i for i, n in enumerate(graph.node) if i not in gone | orphans
                and n.op_type in ("Mul", "DynamicQuantizeLinear", "QuantizeLinear")
                and not any(o in live for o in n.output if o)}
        if not more:
            return orphans
        orphans |= more


def _single(graph, consumers: dict, tensor: str, op: str) -> int | None:
    users = consumers.get(tensor, [])
    return users[0] if len(users) == 1 and graph.node[users[0]].op_type == op else None


def _attrs(node) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def weight_formats(table: QuantTable | None, weights: list[str]) -> tuple[WeightQuant, ...]:
    """The distinct formats of the quantized weights among ``weights`` (one name per projection), with counts."""
    counts: dict[tuple[str, int, int, bool], int] = {}
    for name in weights:
        spec = table.weights.get(name) if table is not None else None
        if spec is not None:
            key = (spec.op, spec.bits, spec.block_size, bool(spec.zero_point))
            counts[key] = counts.get(key, 0) + 1
    return tuple(WeightQuant(*key, n) for key, n in sorted(counts.items()))
