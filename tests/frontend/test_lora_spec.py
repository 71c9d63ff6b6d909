"""``--lora`` specs: rank and alpha are finite, positive and bounded; every error is one line naming --lora."""

from __future__ import annotations

import pytest

from primal_compiler.errors import InputError
from primal_compiler.frontend.lora_spec import MAX_ALPHA, MAX_RANK, parse_lora_spec


@pytest.mark.parametrize("spec, lora", [
    ("q,v:8", (8, 8.0)),
    ("q,k,v,o:16:32", (16, 32.0)),
    ("attn: 4 :0.5", (4, 0.5)),
    (f"q:{MAX_RANK}:{MAX_ALPHA}", (MAX_RANK, MAX_ALPHA)),
    ("q:1:1e-3", (1, 0.001)),
])
def test_good_specs(spec, lora):
    got = parse_lora_spec(spec)[0].lora
    assert (got.rank, got.alpha) == lora


@pytest.mark.parametrize("spec, message", [
    ("q:10000000000000000000000", f"rank must be >= 1 and <= {MAX_RANK}, got '10000000000000000000000'"),
    (f"q:{MAX_RANK + 1}", f"rank must be >= 1 and <= {MAX_RANK}"),
    ("q:0", "rank must be >= 1"),
    ("q:-3", "rank must be >= 1"),
    ("q:" + "9" * 5000, "is not a number"),  # more digits than int() converts
    ("q:8.5", "rank '8.5' is not a number"),
    ("q:8:nan", "need alpha > 0 and alpha <= 65504, got nan"),
    ("q:8:inf", "got inf"),
    ("q:8:-inf", "got -inf"),
    ("q:8:1e400", "got inf"),
    ("q:8:-1", "need alpha > 0"),
    ("q:8:0", "need alpha > 0"),
    ("q:8:70000", "alpha <= 65504, got 70000"),
    ("q:8:x", "alpha 'x' is not a number"),
    ("q:8:1:2", "is not TARGETS:RANK[:ALPHA]"),
    ("q:8;;v:8", "empty part"),
    ("nope:8", "unknown target 'nope'"),
])
def test_bad_specs_are_one_line_naming_lora(spec, message):
    with pytest.raises(InputError) as err:
        parse_lora_spec(spec)
    assert err.value.where == "--lora" and message in err.value.problem
    assert "\n" not in str(err.value) and len(str(err.value)) < 400  # long input is cut, not echoed whole
