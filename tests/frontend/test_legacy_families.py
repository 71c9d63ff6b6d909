"""Legacy (TorchScript) exports of the parallel-block families (``tests/fixtures/make_families.py``): read as
their dynamo exports are, and replayed to ONNX Runtime's logits.

The TorchScript exporter computes head splits and rotary slices from ``Shape`` (``onnx_fold``), takes
Falcon's key and value heads with ``Gather``, splits NeoX's qkv with three ``Slice`` nodes and repeats
GPT-J's sin | cos table with ``Tile`` before gathering it. Before these were read, NeoX and GPT-J were refused
for the wrong reason (no head size, no position encoding) and Falcon for a qkv cut it does not make.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import onnx
import pytest

from primal_compiler.errors import InputError

from primal_compiler.frontend.onnx_import import load_onnx

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "onnx"
LEGACY = sorted(p.stem for p in (FIXTURES / "legacy").glob("*.onnx"))


def sidecar(name: str) -> dict:
    return json.loads((FIXTURES / "legacy" / f"{name}.json").read_text())


def test_the_set_has_the_parallel_families_and_stays_small():
    assert LEGACY == ["falcon", "falcon_grouped", "gpt_neox", "gptj", "phi2"]
    assert all(sidecar(n)["exporter"].startswith("torch.onnx(dynamo=False)") for n in LEGACY)
    assert sum(p.stat().st_size for p in (FIXTURES / "legacy").glob("*.onnx")) < 1536 * 1024


@pytest.mark.parametrize("name", LEGACY)
def test_a_legacy_export_reads_as_its_dynamo_export(name):
    legacy, dynamo = load_onnx(FIXTURES / "legacy" / f"{name}.onnx"), load_onnx(FIXTURES / "families" / f"{name}.onnx")
    truth = sidecar(name)
    assert (legacy.num_layers, legacy.hidden_size, legacy.vocab_size) == (truth["num_layers"], truth["hidden_size"],
                                                                          truth["vocab_size"])
    att = legacy.attention
    assert (att.num_heads, att.num_kv_heads, att.head_dim) == (truth["num_heads"], truth["num_kv_heads"],
                                                               truth["head_dim"])
    assert legacy.base_params == truth["base_params"]
    assert replace(legacy, source=dynamo.source) == dynamo  # every field: layers, rotary, qkv layout, norms, ...


@pytest.mark.parametrize("name", LEGACY)
def test_a_legacy_export_replays_to_onnxruntime(name):
    pytest.importorskip("onnxruntime")
    from primal_compiler.report.check import check_onnx
    from primal_compiler.target import load_primal_target

    fixed = sidecar(name).get("static_seq_len")
    prompt, generate = (list(range(1, fixed + 1)), 1) if fixed else (None, None)
    info = check_onnx(str(FIXTURES / "legacy" / f"{name}.onnx"), load_primal_target("primal-7nm"), prompt, generate)
    assert info["verdict"] == "OK" and info["relative_error"] < 1e-5, info


def test_a_neox_split_whose_value_slice_is_not_the_third_is_refused(tmp_path):
    """The value's slice is checked too: rewired to take the key's columns, the file is refused, never read."""
    model = onnx.load(str(FIXTURES / "legacy" / "gpt_neox.onnx"))
    q_slice, v_slice = (next(n for n in model.graph.node if n.name == f"/gpt_neox/layers.0/attention/{s}")
                        for s in ("Slice", "Slice_2"))
    k_slice = next(n for n in model.graph.node if n.name == "/gpt_neox/layers.0/attention/Slice_1")
    v_slice.input[1], v_slice.input[2] = k_slice.input[1], k_slice.input[2]
    assert q_slice.input[0] == v_slice.input[0]
    path = tmp_path / "neox.onnx"
    onnx.save(model, str(path))
    with pytest.raises(InputError) as err:
        load_onnx(path)
    assert "unsupported fused qkv" in err.value.problem and "the value [(16, 32, 1)]" in err.value.problem
