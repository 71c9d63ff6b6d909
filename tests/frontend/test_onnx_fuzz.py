"""Mutated ONNX models (tests/frontend/fuzzing.py): the importer, inspect and the weight reader either work
or end in a one-line InputError, never another exception, and accept no non-finite weight. A short hypothesis
budget here (1500 cases, about 15 s on 2 cores); ``python benchmarks/fuzz.py onnx-model --examples N`` runs the
same target longer."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from tests.frontend.fuzzing import base_models, consume, mutants

FUZZ = settings(max_examples=1500, deadline=None, database=None, suppress_health_check=list(HealthCheck))


@pytest.mark.parametrize("name", sorted(base_models()))
def test_every_base_imports(tmp_path, name):
    path = tmp_path / f"{name}.onnx"
    path.write_bytes(base_models()[name])
    assert consume(path) == ("inspected" if name.endswith("_external") else "weights read")


@FUZZ
@given(mutant=mutants())
def test_mutated_models_end_in_input_error(tmp_path_factory, mutant):
    name, data = mutant
    path = tmp_path_factory.mktemp("fuzz") / f"{name}.onnx"
    path.write_bytes(data)
    consume(path)
