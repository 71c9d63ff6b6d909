"""The ADC offset drift: the seed's 0.3 LSB per +10 degC from the calibration temperature, within its range."""

from __future__ import annotations

import numpy as np
import pytest

from primal_compiler.errors import InputError
from primal_compiler.target import load_target
from primal_compiler.thermal.adc import adc_offset_lsb


def test_offset_grows_three_tenths_of_an_lsb_per_ten_kelvin():
    t = load_target("primal-7nm")
    np.testing.assert_allclose(adc_offset_lsb(t, [25.0, 55.0, 85.0, 15.0]), [0.0, 0.9, 1.8, -0.3], atol=1e-12)


@pytest.mark.parametrize("temperature", [126.0, -41.0, float("nan"), float("inf")])
def test_a_temperature_outside_the_model_is_refused_naming_the_keys(temperature):
    with pytest.raises(InputError, match=r"outside the ADC drift model's range -40\.\.125 degC .*model_max_c"):
        adc_offset_lsb(load_target("primal-7nm"), temperature)
