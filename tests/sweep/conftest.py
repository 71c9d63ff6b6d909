from __future__ import annotations

import pytest

from tests.sweep.helpers import write_spec


@pytest.fixture
def tiny_spec(tmp_path):
    return write_spec(tmp_path)
