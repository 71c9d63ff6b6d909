"""Generation past the KV context: the ring wraps and the model attends to the last ``context`` tokens."""

from __future__ import annotations

import numpy as np
import pytest

from primal_compiler.functional import replay_functional
from primal_compiler.functional.params import load_params
from tests.functional.conftest import compiled
from tests.functional.reference import dense_greedy, ort_greedy

PROMPT = [3, 1, 4, 1, 5]
CONTEXT, GENERATE = 8, 12  # positions up to 15: the ring of 8 wraps in the 4th decode step


def rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("name", ["llama_lora_qkvo_r8_dynamo", "mistral_dynamo", "gpt2_dynamo",
                                  "opt_lora_qv_r4_optimum"])
def test_generation_past_the_context_wraps_the_ring(name, replay_target, sharp):
    program = compiled(name, replay_target, len(PROMPT), GENERATE, context=CONTEXT)
    result = replay_functional(program, replay_target, sharp(name), prompt=PROMPT, generate=GENERATE)
    params = load_params(program.model, sharp(name))
    window = dense_greedy(program.model, params, PROMPT, GENERATE, window=CONTEXT)
    assert rel(result.logits, window) < 1e-5
    unwrapped = CONTEXT - len(PROMPT) + 1  # steps whose positions fit the ring: full attention still applies
    assert rel(result.logits[:unwrapped], ort_greedy(sharp(name), PROMPT, unwrapped)) < 1e-5
    full = dense_greedy(program.model, params, PROMPT, GENERATE, window=GENERATE + len(PROMPT))
    assert rel(result.logits[unwrapped:], full[unwrapped:]) > 1e-2  # the window really cut old tokens
