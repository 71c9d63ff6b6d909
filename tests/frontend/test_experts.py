"""A mixture of experts is refused as one (issue 52): the line names the routing node and says "experts", whether
the router is a TopK over gate scores (torch.onnx's form) or onnxruntime's fused MoE contrib op."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from primal_compiler.errors import InputError
from primal_compiler.frontend.onnx_import import load_onnx
from tests.frontend.families import family_decoder

HIDDEN = 32  # family_decoder's default hidden size


def _with_router(model: onnx.ModelProto, fused: bool) -> onnx.ModelProto:
    """The decoder with a router on its first hidden state: gate scores, then TopK (or a fused MoE node)."""
    g = model.graph
    hidden = next(n for n in g.node if n.op_type == "Gather").output[0]
    g.initializer.append(numpy_helper.from_array(np.ones((HIDDEN, 4), np.float32), "router.weight"))  # 4 experts
    g.initializer.append(numpy_helper.from_array(np.array([2], np.int64), "router.k"))
    g.node.append(helper.make_node("MatMul", [hidden, "router.weight"], ["router.scores"], name="router_gate"))
    if fused:
        g.node.append(helper.make_node("MoE", [hidden, "router.scores"], ["moe.out"], name="experts_fused",
                                       domain="com.microsoft"))
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    else:
        g.node.append(helper.make_node("TopK", ["router.scores", "router.k"], ["router.top", "router.index"],
                                       name="router_topk"))
    return model


@pytest.mark.parametrize("fused, node", [(False, "node router_topk (TopK)"), (True, "node experts_fused (MoE)")])
def test_a_mixture_of_experts_is_refused_naming_its_router(tmp_path, fused, node):
    path = tmp_path / "moe.onnx"
    onnx.save(_with_router(family_decoder(), fused), path)
    with pytest.raises(InputError) as err:
        load_onnx(path)
    message = str(err.value)
    assert f"a mixture of experts: {node} routes each token to its top experts" in message and "\n" not in message


def test_the_same_decoder_without_a_router_is_read(tmp_path):
    path = tmp_path / "dense.onnx"
    onnx.save(family_decoder(), path)
    assert load_onnx(path).num_layers == 2
