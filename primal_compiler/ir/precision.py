"""The bit widths of a model's stored values: weights, activations, partial sums and the KV cache."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Precision:
    """Bit widths of each kind of stored value (SEED.md section 6 default)."""

    base_weight_bits: int = 4
    lora_weight_bits: int = 8
    embed_bits: int = 16
    lm_head_bits: int = 16
    activation_bits: int = 8
    psum_bits: int = 16  # partial sums leaving an ADC / adder tree; lower-tiles derives it (mapping/lower.py)
    kv_bits: int = 16  # K/V cache entries in router scratchpads (FP16 for the DMACs)

    def __post_init__(self) -> None:
        for name in ("base_weight_bits", "lora_weight_bits", "embed_bits", "lm_head_bits", "activation_bits", "psum_bits", "kv_bits"):
            value = getattr(self, name)
            if not isinstance(value, int) or not 1 <= value <= 32:
                raise ValueError(f"precision {name} must be an integer in 1..32, got {value!r}")
        if self.kv_bits % 8:
            raise ValueError(f"precision kv_bits must be a multiple of 8 (the KV cache is stored in whole bytes), "
                             f"got {self.kv_bits}")
