"""Hardware precision: quantized macros, bit-serial inputs and ADCs move the logits, more bits move them less."""

from __future__ import annotations

import numpy as np
import pytest

from primal_compiler.functional import replay_functional
from primal_compiler.functional.metrics import mean_kl, top1_agreement
from primal_compiler.functional.precision import HardwareSpec, Numerics, digits, quantize
from primal_compiler.target import with_overrides
from tests.functional.conftest import compiled
from tests.functional.reference import ort_greedy

PROMPT = [3, 1, 4, 1, 5]
NAME = "mistral_lora_qv_r2_dynamo"


def test_digits_recompose_two_complement_integers():
    q = np.arange(-127, 128)
    d = digits(q, 8, 4)
    assert d.shape == (2, 255) and (d[0] >= 0).all() and d[1].min() == -8 and d[1].max() == 7
    np.testing.assert_array_equal(d[0] + 16 * d[1], q)
    np.testing.assert_array_equal(digits(q[120:], 8, 8)[0], q[120:])


def test_an_adc_with_enough_levels_is_exact():
    rng = np.random.default_rng(0)
    w, x = rng.normal(size=(16, 5)).astype(np.float32), rng.normal(size=(3, 16)).astype(np.float32)
    hw = HardwareSpec(bits_per_cell=4, input_bits=8, pulse_bits=1, rows_per_read=8, adc_bits=10, sram_input_bits=8,
                      embed_bits=16, kv_bits=16)
    num = Numerics("hardware", hw)
    y = num.rram(num.crossbar(w, 4, 0), x)
    qw, sw = quantize(w, 4)
    qx, sx = quantize(x, 8, axis=1)
    np.testing.assert_allclose(y, (qx @ qw) * sx * sw, rtol=1e-6)  # 8 rows x 7 x 1 = 56 < 511 levels
    coarse = Numerics("hardware", HardwareSpec(**{**hw.__dict__, "adc_bits": 4}))
    assert not np.allclose(coarse.rram(coarse.crossbar(w, 4, 0), x), y, rtol=1e-3)


@pytest.fixture(scope="module")
def reference():
    from tests.functional.conftest import fixture

    want = ort_greedy(fixture(NAME), PROMPT, 4)
    return want, [int(t) for t in want.argmax(axis=1)]


def hardware(target, reference, lower=""):
    from tests.functional.conftest import fixture

    program = compiled(NAME, target, len(PROMPT), 4, lower=lower)
    return replay_functional(program, target, fixture(NAME), prompt=PROMPT, generate=4, precision="hardware",
                             force=reference[1]).logits


def test_more_bits_bring_hardware_mode_to_the_reference(replay_target, reference):
    want = reference[0]
    coarse = hardware(replay_target, reference)
    fine_target = with_overrides(replay_target, {"rram.adc_bits": 14, "rram.input_bits": 12, "sram.input_bits": 12,
                                                 "sram.mac_latency_cycles": 14})
    fine = hardware(fine_target, reference, lower="base_bits=12,lora_bits=12,lm_head_bits=16")
    assert np.isfinite(coarse).all() and not np.allclose(coarse, want, rtol=1e-3)
    assert mean_kl(fine, want) < mean_kl(coarse, want) / 10
    assert top1_agreement(fine, want) == 1.0
    assert np.abs(fine - want).max() / np.abs(want).max() < 1e-2
