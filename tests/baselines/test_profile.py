"""Engine profiles load strictly, like targets."""

from __future__ import annotations

import pytest

from primal_compiler.baselines.profile import ENGINES_DIR, EngineProfile, engine_names, load_engine
from primal_compiler.errors import InputError
from primal_compiler.target.loader import load_table


def test_bundled_profiles():
    assert engine_names() == ("hf-eager", "trtllm", "vllm")
    assert "w4a8" in load_engine("trtllm").precision_set and "w4a8" not in load_engine("vllm").precision_set


def test_every_value_has_a_source_comment():
    for path in ENGINES_DIR.glob("*.toml"):
        for line in path.read_text(encoding="utf-8").splitlines():
            s = line.strip()
            if "=" in s and not s.startswith("#") and s.split("=")[0].strip() not in ("schema_version", "name", "description"):
                assert "#" in s, f"{path.name}: {s} has no source comment"
                note = s.split("#", 1)[1]
                assert any(w in note.lower() for w in ("derived", "assumed", "20", "as ")), f"{path.name}: {s}"


@pytest.mark.parametrize("edit, match", [
    (("fixed_s = 4e-6", "fixed_s = -1.0"), "kernels.fixed_s: must be > 0"),
    (("per_layer = 10", "per_layer = 10\nper_layers = 3"), "kernels.per_layers: unknown key"),
    (('precisions = "fp16,', 'precisions = "fp4,fp16,'), "unknown precision 'fp4'"),
    (("per_layer = 10 ", "per_layer = 1.5 "), "kernels.per_layer: expected an integer"),
])
def test_strict(tmp_path, edit, match):
    text = (ENGINES_DIR / "vllm.toml").read_text(encoding="utf-8").replace(*edit)
    path = tmp_path / "vllm.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InputError, match=match):
        load_table(EngineProfile, path, "engine profile")


def test_unknown_engine():
    with pytest.raises(InputError, match="unknown engine 'sglang'"):
        load_engine("sglang")
