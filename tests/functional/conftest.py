"""Fixture files and a target with small crossbars, so tiny models span many tiles, CTs and proxies.

The fixtures' random weights (std 0.05) make attention almost uniform and
its output small next to the residual stream: dropping every RoPE moves
their logits by under 1e-5. :func:`sharp` writes a copy whose attention
projections are scaled 4x, so scores, masks and positions decide the
logits (dropping RoPE then moves them by about 1e-3).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from primal_compiler.frontend import load_model
from primal_compiler.functional import compile_for_replay

FIXTURES = Path(__file__).parents[1] / "fixtures" / "onnx"
PLACE = ("lower-tiles{opts},blocking,zcurve-order,kv-ring{{context={context},chunk_tokens=4,reserve_bytes=0}},"
         "codegen,srpg")


SHARPEN = 4.0


def fixture(name: str) -> str:
    return str(FIXTURES / f"{name}.onnx")


@pytest.fixture(scope="session")
def sharp(tmp_path_factory):
    """``sharp(name)``: path of fixture ``name`` with its q, k, v (or fused qkv) and o weights scaled 4x."""
    import onnx
    from onnx import numpy_helper

    from primal_compiler.frontend.onnx_import import recognise_onnx
    from primal_compiler.ir.model import ATTENTION_ROLES

    directory = tmp_path_factory.mktemp("sharp")

    def make(name: str) -> str:
        out = directory / f"{name}.onnx"
        if not out.exists():
            found = recognise_onnx(fixture(name))
            names = {p.weight for (_, role), p in found.projections.items() if role in ATTENTION_ROLES}
            model = onnx.load(fixture(name))
            for t in model.graph.initializer:
                if t.name in names:
                    t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t) * np.float32(SHARPEN), t.name))
            onnx.save(model, str(out))
        return str(out)

    return make


@pytest.fixture(scope="session")
def replay_target():
    """primal-7nm cut down: 16x16 crossbars read 8 rows at a time, 16-row LoRA tiles, 4x4 PE meshes."""
    from primal_compiler.target import load_target, with_overrides

    return with_overrides(load_target("primal-7nm"), {
        "ct.mesh_rows": 4, "ct.mesh_cols": 4, "rram.rows": 16, "rram.cols": 16, "rram.rows_active_per_read": 8,
        "rram.adcs_per_macro": 4, "sram.rows": 16, "router.scratchpad_bytes": 2048,
    })


def compiled(name: str, target, prompt_len: int, generate: int, context: int = 32, lora: str | None = None,
             lower: str = ""):
    """Fixture ``name`` compiled on ``target`` for a replay of ``prompt_len`` tokens generating ``generate``."""
    model = load_model(fixture(name), lora)
    pipeline = PLACE.format(opts=f"{{{lower}}}" if lower else "", context=context)
    return compile_for_replay(model, target, prompt_len, generate, pipeline)
