"""The two precision modes of the functional replay: how a macro turns weights and inputs into outputs.

``exact``: float32 everywhere. A weight matrix cut into ``S`` bit slices
(``bits > bits_per_cell``) is split evenly: slice ``s`` holds
``W / (S * 2**(bits_per_cell * s))``, so the significance shifts of the
column REDUCE give back W and dropping any slice changes the result.

``hardware`` (SEED.md sections 2 and 6, with the target's macro parameters):

* RRAM-ACIM tiles hold weights quantized symmetrically to the program's bit
  width (``base_bits``; ``lm_head_bits`` for the LM head) with one scale per
  tile, cut into ``bits_per_cell`` two's-complement digits (the top digit
  signed), one digit per crossbar slice. A quantized file's own codes
  (minus their zero points) are stored as they are instead when they fit:
  every code within the program's signed bit width, and the file's scale
  constant over each group of ``rram.rows_active_per_read`` rows of a
  column, so it can multiply that group's converted partial sums digitally
  (4-bit files on a 4-bit target need no requantization; blocks of 32 rows
  under 64-row reads do not fit and are requantized per tile). Codes
  narrower than the bit width are shifted to its top (the scale divided to
  match), so the slices below them hold zeros: sign-extended small codes
  would spread over every slice as large partial sums that cancel only
  after the shift-add, each slice's ADC error amplified by its weight;
* a tile's input block is quantized per token vector to ``rram.input_bits``
  (symmetric) and applied ``rram.dac_bits`` at a time (1 = bit-serial), in
  groups of ``rram.rows_active_per_read`` word lines; every pulse of every group is
  converted by a signed ``rram.adc_bits`` ADC whose full scale is
  calibrated per tile to the largest sum the tile can produce (so it never
  clips; when that sum fits the ADC's levels the conversion is exact); at a
  die temperature other than the ADC's calibration temperature every
  conversion of the die's ADCs adds its offset drift
  (:func:`primal_compiler.thermal.adc.adc_offset_lsb`, in LSB) before
  rounding, and saturates at the ADC's signed range;
  partial sums are then shifted and added digitally, exactly;
* SRAM-DCIM tiles hold LoRA weights (B already scaled) quantized to
  ``lora_bits`` per tile and multiply ``sram.input_bits`` inputs exactly
  (digital adder tree);
* embeddings are stored at ``embed_bits`` and K/V cache entries at
  ``kv_bits`` (16 = FP16, fewer = symmetric integers per row); norms,
  softmax, attention, residuals and every transfer stay float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from primal_compiler.target.spec import PrimalTarget

PRECISIONS = ("exact", "hardware")


@dataclass(frozen=True)
class HardwareSpec:
    """The bit widths the hardware mode applies (from the target and the program's model precision)."""

    bits_per_cell: int
    input_bits: int
    pulse_bits: int  # input bits per read pulse (1 = bit-serial)
    rows_per_read: int
    adc_bits: int
    sram_input_bits: int
    embed_bits: int
    kv_bits: int

    @classmethod
    def of(cls, target: PrimalTarget, precision) -> HardwareSpec:
        r = target.rram
        return cls(r.bits_per_cell, r.input_bits, r.dac_bits, r.rows_active_per_read, r.adc_bits,
                   target.sram.input_bits, precision.embed_bits, precision.kv_bits)


@dataclass(frozen=True, eq=False)
class Crossbar:
    """What one RRAM macro holds: float weights (exact) or integer digits, tile scale and ADC step (hardware)."""

    weights: np.ndarray  # rows x cols: float32 slice (exact) or signed integer digits (hardware)
    scale: float | np.ndarray = 1.0  # one per tile, or per (row group, column) for a file's own codes
    adc_step: float = 1.0
    adc_offset_lsb: float = 0.0  # the drift of its die's ADCs at the replay's temperature

    @property
    def stored(self) -> bool:
        """Whether the crossbar holds a quantized file's codes as they are (not requantized)."""
        return isinstance(self.scale, np.ndarray)


@dataclass(frozen=True, eq=False)
class SramTile:
    weights: np.ndarray  # in x out: float32 (exact) or integers (hardware)
    scale: float = 1.0


def quantize(x: np.ndarray, bits: int, axis=None) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric quantization to signed ``bits``: (integers, scale) with ``x ~ integers * scale``."""
    qmax = 2 ** (bits - 1) - 1
    peak = np.abs(x).max(axis=axis, keepdims=axis is not None).astype(np.float64)
    scale = np.where(peak > 0, peak / qmax, 1.0)
    return np.clip(np.rint(x / scale), -qmax, qmax).astype(np.int64), scale


def _group_scales(stored: tuple[np.ndarray, np.ndarray] | None, bits: int, group: int) -> np.ndarray | None:
    """The file's scales per (row group, column) when its codes fit ``bits`` signed bits and its scale is
    constant over each ``group`` rows of a column; else None (the block is requantized)."""
    if stored is None:
        return None
    codes, scale = stored
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    if codes.size == 0 or codes.min() < lo or codes.max() > hi:
        return None
    rows = -(-scale.shape[0] // group) * group
    padded = np.empty((rows, scale.shape[1]), np.float64)
    padded[: scale.shape[0]] = scale
    padded[scale.shape[0] :] = scale[-1:]  # rows past the block hold zeros: any scale serves them
    grouped = padded.reshape(rows // group, group, -1)
    if not (grouped == grouped[:, :1]).all():
        return None
    return grouped[:, 0]


def _signed_bits(codes: np.ndarray) -> int:
    """The fewest two's-complement bits that hold every code."""
    lo, hi = int(codes.min(initial=0)), int(codes.max(initial=0))
    return max(1, max(hi, -lo - 1).bit_length() + 1)


def digits(q: np.ndarray, bits: int, width: int) -> np.ndarray:
    """Two's-complement digits of ``width`` bits of ``bits``-bit integers, least significant first, top signed."""
    count = -(-bits // width)
    u = q % (1 << (count * width))
    out = np.stack([(u >> (width * s)) & ((1 << width) - 1) for s in range(count)])
    top = out[-1]
    out[-1] = np.where(top >= 1 << (width - 1), top - (1 << width), top)
    return out


class Numerics:
    """Macro arithmetic of one precision mode; ``hw`` is None in exact mode. ``adc_offset_lsb``: per CT, the
    offset of its ADCs (hardware mode; None: every ADC at its calibration temperature)."""

    def __init__(self, mode: str, hw: HardwareSpec, adc_offset_lsb: np.ndarray | None = None) -> None:
        self.mode = mode
        self.hw = hw if mode == "hardware" else None
        self.bits_per_cell = hw.bits_per_cell
        self.adc_offset_lsb = adc_offset_lsb

    # --- RRAM-ACIM -------------------------------------------------------------------------
    def crossbar(self, block: np.ndarray, bits: int, slice_index: int,
                 stored: tuple[np.ndarray, np.ndarray] | None = None, ct: int = 0) -> Crossbar:
        """The crossbar holding bit slice ``slice_index`` of ``block`` stored at ``bits`` bits on CT ``ct``;
        ``stored`` is the file's (codes, scales) of the block, used as they are where they fit."""
        slices = -(-bits // self.bits_per_cell)
        if self.hw is None:
            return Crossbar((block / (slices * 2.0 ** (self.bits_per_cell * slice_index))).astype(np.float32))
        g = self.hw.rows_per_read
        own = _group_scales(stored, bits, g)
        if own is not None and stored is not None:  # left-aligned in the bit width, so the digits below the codes hold zeros
            shift = bits - _signed_bits(stored[0])
            q, scale = stored[0].astype(np.int64) << shift, own / float(1 << shift)
        else:
            q, scale = quantize(block, bits)
        d = digits(q, bits, self.bits_per_cell)[slice_index]
        rows = -(-d.shape[0] // g) * g
        padded = np.zeros((rows, d.shape[1]), np.int64)
        padded[: d.shape[0]] = d
        full_scale = np.abs(padded).reshape(rows // g, g, -1).sum(axis=1).max(initial=0) * (2 ** self.hw.pulse_bits - 1)
        levels = 2 ** (self.hw.adc_bits - 1) - 1
        step = full_scale / levels if full_scale > levels else 1.0
        offset = 0.0 if self.adc_offset_lsb is None else float(self.adc_offset_lsb[ct])
        return Crossbar(padded, scale if own is not None else float(scale), float(step), offset)

    def rram(self, xbar: Crossbar, x: np.ndarray) -> np.ndarray:
        """Partial sums ``x @ W`` of one crossbar for token vectors ``x`` (V x rows)."""
        if self.hw is None:
            return x @ xbar.weights
        hw = self.hw
        xq, sx = quantize(x, hw.input_bits, axis=1)
        pulses = digits(xq, hw.input_bits, hw.pulse_bits)  # P x V x rows
        rows, g = xbar.weights.shape[0], hw.rows_per_read
        inputs = np.zeros(pulses.shape[:2] + (rows,), np.float64)
        inputs[:, :, : x.shape[1]] = pulses
        groups = rows // g
        w = xbar.weights.reshape(groups, g, -1).astype(np.float64)
        sums = np.einsum("pvgr,grc->pvgc", inputs.reshape(pulses.shape[:2] + (groups, g)), w)
        levels = 2 ** (hw.adc_bits - 1) - 1
        codes = np.clip(np.rint(sums / xbar.adc_step + xbar.adc_offset_lsb), -levels - 1, levels)
        converted = codes * xbar.adc_step
        if xbar.stored:  # the file's scale of each row group, applied digitally after its conversion
            converted = converted * xbar.scale
        weight = 2.0 ** (hw.pulse_bits * np.arange(len(pulses)))
        acc = np.einsum("p,pvc->vc", weight, converted.sum(axis=2))
        return (acc * sx * (1.0 if xbar.stored else xbar.scale)).astype(np.float32)

    # --- SRAM-DCIM -------------------------------------------------------------------------
    def sram_tile(self, block: np.ndarray, bits: int) -> SramTile:
        if self.hw is None:
            return SramTile(block.astype(np.float32))
        q, scale = quantize(block, bits)
        return SramTile(q, float(scale))

    def sram(self, tile: SramTile, x: np.ndarray) -> np.ndarray:
        if self.hw is None:
            return x @ tile.weights
        xq, sx = quantize(x, self.hw.sram_input_bits, axis=1)
        return ((xq @ tile.weights) * sx * tile.scale).astype(np.float32)

    # --- stored tables -----------------------------------------------------------------------
    def table(self, values: np.ndarray) -> np.ndarray:
        """An embedding table as the controller stores it (``embed_bits`` per value)."""
        return values if self.hw is None else stored(values, self.hw.embed_bits)

    def kv(self, values: np.ndarray) -> np.ndarray:
        """K or V entries as a scratchpad stores them (``kv_bits`` per value)."""
        return values if self.hw is None else stored(values, self.hw.kv_bits)


def stored(values: np.ndarray, bits: int) -> np.ndarray:
    """Rows of ``values`` kept at ``bits``: float32 from 32 bits, FP16 at 16, else symmetric integers per row."""
    if bits >= 32:
        return values
    if bits == 16:
        return values.astype(np.float16).astype(np.float32)
    q, scale = quantize(values, bits, axis=-1)
    return (q * scale).astype(np.float32)
