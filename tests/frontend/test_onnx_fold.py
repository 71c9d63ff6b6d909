"""onnx-fold: shape arithmetic on static dimensions folds to constants; anything dynamic stays unknown."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from primal_compiler.frontend.onnx_fold import fold_shapes


def _graph(nodes, inits=(), x_shape=("batch", "seq", 4, 48)) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "g", [x], [y], [numpy_helper.from_array(np.asarray(v), k) for k, v in inits])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _const(name: str, value) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value, np.int64)))


def test_a_neox_style_slice_end_folds_and_the_sliced_shape_then_too():
    """x[..., d : 2d] with d = x.size(-1) // 3, and rotate_half's y.size(-1) // 2 on the slice (a second round)."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]), _const("last", 3), helper.make_node("Gather", ["s", "last"], ["n"]),
        _const("three", 3), helper.make_node("Div", ["n", "three"], ["d"]), _const("two", 2),
        helper.make_node("Mul", ["d", "two"], ["d2"]), _const("ax0", [0]), _const("axis", [3]),
        helper.make_node("Unsqueeze", ["d", "ax0"], ["lo"]), helper.make_node("Unsqueeze", ["d2", "ax0"], ["hi"]),
        helper.make_node("Slice", ["x", "lo", "hi", "axis"], ["k"]),
        helper.make_node("Shape", ["k"], ["sk"]), helper.make_node("Gather", ["sk", "last"], ["nk"]),
        helper.make_node("Div", ["nk", "two"], ["half"]), helper.make_node("Identity", ["k"], ["y"]),
    ]
    folded = fold_shapes(_graph(nodes))
    assert folded["d"] == 16 and folded["d2"] == 32 and list(folded["lo"]) == [16] and list(folded["hi"]) == [32]
    assert folded["half"] == 8  # known only once the slice's bounds are: the fold repeats
    assert "s" not in folded and "k" not in folded  # a shape with dynamic dims, and data, are never folded


def test_a_dynamic_dimension_stays_unknown_and_constants_alone_are_left_as_written():
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]), _const("one", 1), helper.make_node("Gather", ["s", "one"], ["seq"]),
        helper.make_node("Add", ["seq", "one"], ["seq1"]), _const("one1", [1]),
        helper.make_node("Concat", ["s", "one1"], ["shape"], axis=0), helper.make_node("Add", ["w", "one"], ["w1"]), helper.make_node("Identity", ["x"], ["y"]),
    ]
    folded = fold_shapes(_graph(nodes, inits=[("w", np.arange(4, dtype=np.int64))]))
    assert not {"seq", "seq1", "shape", "w1"} & folded.keys()


def test_integer_division_truncates_as_onnx_does_and_a_constant_of_shape_is_filled():
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], start=2), _const("minus7", -7), _const("zero", 0),
        helper.make_node("Gather", ["s", "zero"], ["heads"]),
        helper.make_node("Div", ["minus7", "heads"], ["q"]), helper.make_node("ConstantOfShape", ["s"], ["ones"],
                                                                              value=numpy_helper.from_array(np.ones(1, np.int64))),
        helper.make_node("Identity", ["x"], ["y"]),
    ]
    folded = fold_shapes(_graph(nodes, x_shape=("batch", "seq", 4, 8)))
    assert list(folded["s"]) == [4, 8] and folded["q"] == -1  # -7 / 4 truncates to -1 (floor would give -2)
    assert folded["ones"].shape == (4, 8) and folded["ones"].dtype == np.int64 and (folded["ones"] == 1).all()


def test_the_shape_of_what_onnx_cannot_type_stays_unknown():
    nodes = [helper.make_node("Unknown", ["x"], ["u"], domain="nowhere"), helper.make_node("Shape", ["u"], ["su"]),
             helper.make_node("Shape", ["x"], ["sx"]), helper.make_node("Identity", ["x"], ["y"])]
    model = _graph(nodes, x_shape=(2, 3))
    model.opset_import.append(helper.make_opsetid("nowhere", 1))
    folded = fold_shapes(model)
    assert list(folded["sx"]) == [2, 3] and "su" not in folded


def test_what_onnx_computes_otherwise_is_left_unknown():
    """A shape cast to float (its division is no longer an integer's), a division by zero, an Unsqueeze to two
    axes: each would fold to another value than onnx computes, so none folds."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]), _const("zero", 0), _const("two", 2), _const("last", 3),
        helper.make_node("Cast", ["s"], ["sf"], to=TensorProto.FLOAT),
        helper.make_node("Gather", ["sf", "last"], ["nf"]),
        helper.make_node("Constant", [], ["three"], value=numpy_helper.from_array(np.array(3.0, np.float32))),
        helper.make_node("Div", ["nf", "three"], ["ratio"]),
        helper.make_node("Gather", ["s", "last"], ["n"]), helper.make_node("Div", ["n", "zero"], ["by_zero"]),
        _const("ax01", [0, 1]), helper.make_node("Unsqueeze", ["n", "ax01"], ["n2"]),
        helper.make_node("Gather", ["s", "two"], ["heads"]), helper.make_node("Identity", ["x"], ["y"]),
    ]
    folded = fold_shapes(_graph(nodes, x_shape=("batch", "seq", 4, 8)))
    assert folded["n"] == 8 and folded["heads"] == 4  # the static dims themselves fold
    assert not {"sf", "nf", "ratio", "by_zero", "n2"} & folded.keys()
