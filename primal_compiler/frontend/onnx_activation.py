"""An MLP's activation, checked by evaluating it: the graph's nodes must compute the function the IR names.

:func:`verify_activation` runs the nodes between the gate (or fc1) output
and the activation's output on probe values in float64, with the graph's
own scalar constants, and compares the result with :data:`REFERENCE` of
the recognised kind. So any decomposition an exporter writes (``Gelu`` as
an op, or ``Pow``/``Mul``/``Tanh``/``Add``, or ``Div``/``Erf``/``Add``/``Mul``;
``x * Sigmoid(x)``) is accepted exactly when it computes that function, and
QuickGELU's ``x * sigmoid(1.702 x)``, a squared ReLU or a scaled SiLU are
refused naming the first node, instead of being run as SiLU or ReLU.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from primal_compiler.frontend.onnx_graph import HALF_EPS, TRANSPARENT, GraphIndex, PatternError, attr
from primal_compiler.frontend.onnx_project import depends_on
from primal_compiler.ir.model import Activation

PROBE = np.linspace(-6.0, 6.0, 241)
_erf = np.vectorize(math.erf, otypes=[np.float64])


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


#: What each activation kind computes (Hugging Face's definitions; ``functional.ops`` runs the same).
REFERENCE = {
    Activation.SILU: lambda x: x / (1.0 + np.exp(-x)),
    Activation.GELU: lambda x: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0))),
    Activation.GELU_NEW: _gelu_tanh,
    Activation.RELU: lambda x: np.maximum(x, 0.0),
    Activation.RELU_SQUARED: lambda x: np.maximum(x, 0.0) ** 2,
}
TOLERANCE = 1e-5  # float32 constants hold 7 digits; the GELU forms differ by up to 5e-4 on the probe
_BINARY = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide, "Pow": np.power}
_UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "Neg": np.negative, "Sqrt": np.sqrt, "Tanh": np.tanh, "Erf": _erf, "Exp": np.exp, "Reciprocal": np.reciprocal,
    "Sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)), "Relu": lambda x: np.maximum(x, 0.0), "FastGelu": _gelu_tanh,
}


def verify_activation(g: GraphIndex, barriers: frozenset[int], start: str, end: str | None, kind: Activation,
                      where: str) -> set[int]:
    """The nodes that compute ``kind`` from ``start``, checked on :data:`PROBE`; :class:`PatternError` otherwise.

    ``end`` is the activation's output (the next projection's input of an ungated MLP); ``None`` for a gate,
    whose output is the operand it brings to the first node that also takes another (the up projection's).
    """
    values: dict[str, np.ndarray] = {start: PROBE}
    tolerance = [TOLERANCE]  # plus the rounding of each half-precision constant read (fp16 2^-11, bf16 2^-8)
    region, _ = g.forward([start], barriers)
    used: set[int] = set()
    out = None
    for i in sorted(region):
        node = g.nodes[i]
        label = f"node {node.name or '#' + str(i)} ({node.op_type})"
        if not any(x in values for x in node.input):
            continue
        given = [values[x] if x in values else _scalar(g, x, tolerance) for x in node.input]
        if any(a is None for a in given[: 2 if node.op_type in _BINARY else 1]):
            if end is None:  # the gate meets the up projection here
                out = next(values[x] for x in node.input if x in values)
                break
            raise PatternError(f"unsupported MLP activation in {where} at {label}: an operand is not a scalar")
        args = [a for a in given if a is not None]  # the operands read, all present (checked above)
        with np.errstate(all="ignore"):  # a file's odd constants make NaN or inf, judged below, not warned about
            if node.op_type in TRANSPARENT:
                value = args[0]
            elif node.op_type in _BINARY and len(args) == 2:
                value = _BINARY[node.op_type](args[0], args[1])
            elif node.op_type in _UNARY:
                value = _UNARY[node.op_type](args[0])
            elif node.op_type == "Gelu":
                tanh = attr(node, "approximate", b"none") in (b"tanh", "tanh")
                value = REFERENCE[Activation.GELU_NEW if tanh else Activation.GELU](args[0])
            else:
                raise PatternError(f"unsupported MLP activation in {where} at {label}: not an element-wise function")
        values[node.output[0]] = np.broadcast_to(value, PROBE.shape).astype(np.float64)
        used.add(i)
        if node.output[0] == end:
            out = values[node.output[0]]
            break
    if out is None:
        raise PatternError(f"unsupported MLP activation in {where}: its output could not be followed")
    want = REFERENCE[kind](PROBE)
    with np.errstate(all="ignore"):
        err = np.abs(out - want) / (1.0 + np.abs(want))
    if not err.max() <= sum(tolerance):
        worst = int(np.nanargmax(np.where(np.isnan(err), np.inf, err)))
        first = g.nodes[min(used)] if used else None
        name = f" at node {first.name or min(used)} ({first.op_type})" if first is not None else ""
        raise PatternError(f"unsupported MLP activation in {where}{name}: it does not compute {kind.value} "
                           f"(off by {err[worst]:.2g} at x = {PROBE[worst]:g})")
    return used


def _scalar(g: GraphIndex, name: str, tolerance: list[float]) -> np.ndarray | None:
    value = g.const(name, limit=1) if name else None
    if value is not None and value.dtype.name in HALF_EPS:
        tolerance.append(HALF_EPS[value.dtype.name] / 2)  # rounded to nearest: half an epsilon at most
    return None if value is None else np.full((), value.reshape(-1)[0], np.float64)


def activation_start(g: GraphIndex, p) -> str:
    """The pre-activation of projection ``p``: its output followed through layout ops, a bias Add of a constant
    vector and the Add of its LoRA adapter."""
    tensor = g.nodes[p.node].output[0]
    for _ in range(8):
        users = [i for i in g.consumers.get(tensor, ()) if g.nodes[i].op_type not in ("Shape", "Size")]
        if len(users) != 1:
            return tensor
        node = g.nodes[users[0]]
        others = [x for x in node.input if x != tensor]
        bias = node.op_type == "Add" and any(g.vector_len(x) is not None for x in others)
        lora = node.op_type == "Add" and bool(p.lora_nodes) and any(depends_on(g, x, p.lora_nodes[1]) for x in others)
        if node.op_type not in TRANSPARENT and not bias and not lora:
            return tensor
        tensor = node.output[0]
    return tensor
