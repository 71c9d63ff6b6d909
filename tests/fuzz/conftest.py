"""The fuzz suite's shared inputs, built once for the whole package."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fuzz.harness import build_assets


@pytest.fixture(scope="session")
def assets(tmp_path_factory) -> Path:
    """A compile output, its text, two PEFT adapters, an ONNX model, a trace, a pipeline file and a sweep spec
    (:func:`tests.fuzz.harness.build_assets`); tests copy what they need, never write here."""
    return build_assets(tmp_path_factory.mktemp("verb-fuzz-assets"))
