"""Die temperature in the hardware-precision replay: the ADCs' offset drift moves the logits, and only there."""

from __future__ import annotations

import numpy as np
import pytest

from primal_compiler.errors import InputError
from primal_compiler.functional import replay_functional
from primal_compiler.functional.precision import HardwareSpec, Numerics, quantize
from primal_compiler.functional.temperature import temperature_sweep
from tests.functional.conftest import compiled, fixture

PROMPT = [3, 1, 4, 1, 5]
NAME = "mistral_lora_qv_r2_dynamo"
HW = HardwareSpec(bits_per_cell=4, input_bits=8, pulse_bits=1, rows_per_read=8, adc_bits=10, sram_input_bits=8,
                  embed_bits=16, kv_bits=16)


def test_an_offset_adds_its_lsbs_to_every_conversion_by_hand():
    rng = np.random.default_rng(1)
    w, x = rng.normal(size=(16, 5)).astype(np.float32), rng.normal(size=(3, 16)).astype(np.float32)
    qw, sw = quantize(w, 4)
    qx, sx = quantize(x, 8, axis=1)
    drifted = Numerics("hardware", HW, np.array([0.0, 2.0]))
    y = drifted.rram(drifted.crossbar(w, 4, 0, ct=1), x)
    # 2 LSB (the ADC is exact here: step 1) on each of 8 bit-serial pulses (weights 1..128) of 2 row groups
    want = (qx @ qw + 2 * 255 * 2) * sx * sw
    np.testing.assert_allclose(y, want, rtol=1e-6)
    same = drifted.rram(drifted.crossbar(w, 4, 0, ct=0), x)  # CT 0 sits at its calibration temperature
    np.testing.assert_allclose(same, (qx @ qw) * sx * sw, rtol=1e-6)


def test_an_offset_saturates_at_the_adcs_range():
    w = np.full((8, 1), 7.0, np.float32)  # every digit 7: a full pulse sums 56, the 4-bit ADC's 7 levels x step 8
    x = np.full((1, 8), 1.0, np.float32)  # quantized to 127: pulses 0..6 carry a one, pulse 7 a zero
    num = Numerics("hardware", HardwareSpec(**{**HW.__dict__, "adc_bits": 4}), np.array([5.0]))
    xbar = num.crossbar(w, 4, 0)
    assert xbar.adc_step == 8.0
    y = num.rram(xbar, x)
    # pulses 0..6: 7 + 5 LSB clips at 7; pulse 7: 0 + 5 = 5; each code x step 8, over the input scale 127
    assert float(y[0, 0]) == pytest.approx((127 * 7 + 128 * 5) * 8 / 127, rel=1e-6)


@pytest.fixture(scope="module")
def program(replay_target):
    return compiled(NAME, replay_target, len(PROMPT), 4)


def run(program, target, **kw):
    return replay_functional(program, target, fixture(NAME), prompt=PROMPT, generate=4, **kw)


def test_at_the_calibration_temperature_nothing_moves(program, replay_target):
    plain = run(program, replay_target, precision="hardware")
    calibrated = run(program, replay_target, precision="hardware", temperature_c=25.0)
    np.testing.assert_array_equal(plain.logits, calibrated.logits)


def test_hotter_dies_move_the_logits_further_from_the_exact_replay(program, replay_target):
    rows = temperature_sweep(program, replay_target, fixture(NAME), PROMPT, 4, [25.0, 55.0, 85.0])
    assert [r["adc_offset_lsb"] for r in rows] == pytest.approx([0.0, 0.9, 1.8])
    errors = [r["logit_error"] for r in rows]
    assert errors[0] < errors[1] < errors[2]
    assert all(0.0 <= r["top1"] <= 1.0 for r in rows)


def test_a_map_heats_only_its_own_cts(program, replay_target):
    cts = int(program.need_tiles().ct.max()) + 1
    uniform = run(program, replay_target, precision="hardware", temperature_c=85.0)
    as_map = run(program, replay_target, precision="hardware", temperature_c=np.full(cts, 85.0))
    np.testing.assert_array_equal(uniform.logits, as_map.logits)
    one = np.full(cts, 25.0)
    one[0] = 85.0
    partial = run(program, replay_target, precision="hardware", temperature_c=one)
    assert not np.array_equal(partial.logits, uniform.logits)


@pytest.mark.parametrize("kw, message", [
    ({"temperature_c": 85.0}, "applies to hardware precision only"),
    ({"temperature_c": 130.0, "precision": "hardware"}, "130 degC is outside the ADC drift model's range"),
    ({"temperature_c": np.full(2, 30.0), "precision": "hardware"}, "one per CT"),
])
def test_a_bad_temperature_is_an_input_error(program, replay_target, kw, message):
    with pytest.raises(InputError, match=message):
        run(program, replay_target, **kw)
