"""A file's own weight quantization as the IR records it (``frontend.onnx_quant`` reads it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WeightQuant:
    """How an imported file stores some of its projection weights: its own quantization (``frontend.onnx_quant``).

    ``group`` is the number of input rows sharing one scale (0: one scale per output column or for the
    whole matrix); ``zero_points`` whether the file stores zero points; ``projections`` how many
    projections (the LM head included) are stored this way. ``op`` ``MatMulInteger`` means ONNX Runtime
    also quantizes the projection's input at run time.
    """

    op: str
    bits: int
    group: int
    zero_points: bool
    projections: int

    def __post_init__(self) -> None:
        if not (1 <= self.bits <= 32 and self.group >= 0 and self.projections >= 1):
            raise ValueError(f"weight quantization {self.op}: bits 1..32, group >= 0 and projections >= 1, "
                             f"got {self.bits}, {self.group}, {self.projections}")

    @property
    def dynamic_inputs(self) -> bool:
        return self.op == "MatMulInteger"

    def describe(self) -> str:
        group = f"blocks of {self.group} rows" if self.group else "one scale per column or matrix"
        zp = "zero points" if self.zero_points else "no zero points"
        runtime = ", inputs quantized to uint8 at run time by onnxruntime" if self.dynamic_inputs else ""
        return f"{self.projections} projections {self.op} {self.bits}-bit, {group}, {zp}{runtime}"
