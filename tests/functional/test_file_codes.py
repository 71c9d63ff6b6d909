"""Hardware mode stores a quantized file's own codes in the crossbars where they fit, and requantizes elsewhere."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from primal_compiler.functional import compile_for_replay, replay_functional
from primal_compiler.functional.precision import HardwareSpec, Numerics, quantize
from primal_compiler.target import load_target, with_overrides

QUANTIZED = Path(__file__).resolve().parents[1] / "fixtures" / "onnx" / "quantized"
HW = HardwareSpec(bits_per_cell=4, input_bits=8, pulse_bits=1, rows_per_read=8, adc_bits=12, sram_input_bits=8,
                  embed_bits=16, kv_bits=16)


def _codes(rng, rows=24, cols=5, group=8):
    codes = rng.integers(-8, 8, size=(rows, cols))
    scale = np.repeat(rng.uniform(0.01, 0.1, size=(-(-rows // group), cols)), group, axis=0)[:rows]
    return codes, scale.astype(np.float32)


def test_codes_that_fit_are_stored_and_multiply_exactly_with_an_exact_adc():
    rng = np.random.default_rng(0)
    codes, scale = _codes(rng)
    w = (codes * scale).astype(np.float32)
    x = rng.normal(size=(3, 24)).astype(np.float32)
    num = Numerics("hardware", HW)
    xbar = num.crossbar(w, 4, 0, (codes, scale))
    assert xbar.stored and xbar.scale.shape == (3, 5)
    qx, sx = quantize(x, 8, axis=1)  # 8 rows x 8 levels x 1-bit pulses = 64 < 2047 ADC levels: exact
    np.testing.assert_allclose(num.rram(xbar, x), (qx @ w) * sx, rtol=1e-5, atol=1e-6)
    requantized = num.crossbar(w, 4, 0)  # per-tile requantization of the same weights loses the group scales
    assert not requantized.stored and not np.allclose(num.rram(requantized, x), (qx @ w) * sx, rtol=1e-3)


def test_a_scale_that_changes_inside_a_row_group_or_codes_too_wide_are_requantized():
    rng = np.random.default_rng(1)
    codes, scale = _codes(rng, group=4)  # blocks of 4 rows under 8-row reads
    num = Numerics("hardware", HW)
    assert not num.crossbar(codes * scale, 4, 0, (codes, scale)).stored
    codes, scale = _codes(rng)
    assert not num.crossbar(codes * scale * 2, 4, 0, (codes * 2, scale)).stored  # -16..14 needs 5 bits
    assert num.crossbar(codes * scale * 2, 8, 0, (codes * 2, scale)).stored  # fits 8 bits


@pytest.mark.parametrize("name,stored", [
    ("llama_nbits4_sym", 16),  # all but the two 88-row down projections, whose 32-row blocks split 64-row reads
    ("llama_nbits8_asym", 4),  # 8-bit codes fit only the 16-bit LM head (4 crossbar slices)
    ("llama_dynamic_int8", 4),
])
def test_the_replay_reports_which_crossbars_hold_the_files_codes(name, stored):
    target = load_target("primal-7nm")
    path = str(QUANTIZED / f"{name}.onnx")
    from primal_compiler.frontend import load_model

    program = compile_for_replay(load_model(path), target, 4, 2, "fast")
    hw = replay_functional(program, target, path, prompt=[1, 2, 3, 4], generate=2, precision="hardware")
    exact = replay_functional(program, target, path, prompt=[1, 2, 3, 4], generate=2, precision="exact")
    assert (hw.crossbars, hw.crossbars_stored) == (18, stored)
    assert exact.crossbars_stored == 0


def test_stored_codes_bring_hardware_mode_closer_to_the_file_than_requantizing(monkeypatch):
    """With fine inputs and ADCs, a 4-bit file on 4-bit cells is read as it is; requantizing per tile is not."""
    from primal_compiler.frontend import load_model
    from primal_compiler.functional import params

    fine = with_overrides(load_target("primal-7nm"), {"rram.adc_bits": 14, "rram.input_bits": 12,
                                                      "sram.input_bits": 12, "sram.mac_latency_cycles": 14})
    path = str(QUANTIZED / "llama_nbits4_sym.onnx")
    program = compile_for_replay(load_model(path), fine, 4, 1, "fast")

    def run(precision: str):
        return replay_functional(program, fine, path, prompt=[1, 2, 3, 4], precision=precision)

    exact, stored = run("exact").logits, run("hardware")
    monkeypatch.setattr(params, "_keep_codes", lambda *args: None)  # forget the file's codes: requantize all
    requantized = run("hardware")
    assert (stored.crossbars_stored, requantized.crossbars_stored) == (16, 0)
    assert np.abs(stored.logits - exact).max() < 0.5 * np.abs(requantized.logits - exact).max()


def test_narrow_codes_sit_in_the_top_slices_of_a_wider_width():
    """4-bit codes at 16 bits: the three low slices hold zeros, so no slice carries cancelling partial sums."""
    rng = np.random.default_rng(2)
    codes, scale = _codes(rng)
    w = (codes * scale).astype(np.float32)
    num = Numerics("hardware", HW)
    slices = [num.crossbar(w, 16, s, (codes, scale)) for s in range(4)]
    assert all(x.stored for x in slices)
    assert all(not x.weights.any() for x in slices[:3])
    np.testing.assert_array_equal(slices[3].weights[:24], codes)
    x = rng.normal(size=(2, 24)).astype(np.float32)
    total = sum(num.rram(xb, x) * 16.0 ** s for s, xb in enumerate(slices))  # the column REDUCE's shifts
    qx, sx = quantize(x, 8, axis=1)
    np.testing.assert_allclose(total, (qx @ w) * sx, rtol=1e-5, atol=1e-6)
