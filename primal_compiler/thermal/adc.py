"""The SAR ADCs' offset drift with die temperature (SEED.md section 6: 0.3 LSB per +10 degC).

An ADC's offset is trimmed to zero at ``thermal.adc_calibration_c`` and
grows linearly, ``thermal.adc_offset_lsb_per_k`` per kelvin, with every
ADC of a die drifting the same way (a systematic shift: the worst case for
the column sums, which add it up). Below the calibration temperature the
offset is negative. The linear rule is held only over ``model_min_c`` ..
``model_max_c``; a temperature outside is an error, never extrapolated.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from primal_compiler.errors import InputError

if TYPE_CHECKING:
    from primal_compiler.target.spec import PrimalTarget


def adc_offset_lsb(target: PrimalTarget, temperature_c: float | np.ndarray, where: str = "temperature") -> np.ndarray:
    """Offset in LSB of the ADCs of dies at ``temperature_c`` (a scalar, or one value per CT); an
    :class:`InputError` naming ``where`` when a temperature is outside the drift model's range."""
    th = target.thermal
    t = np.atleast_1d(np.asarray(temperature_c, dtype=np.float64))
    bad = t[~((t >= th.model_min_c) & (t <= th.model_max_c))]
    if len(bad):
        raise InputError(where, f"{bad[0]:g} degC is outside the ADC drift model's range {th.model_min_c:g}.."
                                f"{th.model_max_c:g} degC (target {target.name}, thermal.model_min_c/model_max_c)")
    return th.adc_offset_lsb_per_k * (t - th.adc_calibration_c)
