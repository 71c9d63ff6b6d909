"""GPU baseline targets: one frozen dataclass per TOML table of a GPU target file (``kind = "gpu"``)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from primal_compiler.target.table import MAX_BYTES_PER_S, MAX_OPS_PER_S, MAX_RATE_HZ, SCHEMA_VERSION, Problem, Table, TargetBase
from primal_compiler.target.table import internal_field as _internal
from primal_compiler.target.table import ranges_field
from primal_compiler.target.table import spec_field as _f


@dataclass(frozen=True)
class GpuMemorySpec(Table):
    """HBM: capacity, peak bandwidth and the share a serving engine may fill."""

    hbm_capacity_bytes: int = _f("bytes", "HBM capacity", gt=0, le=1 << 50)
    hbm_bandwidth_bytes_per_s: int = _f("bytes/s", "peak HBM bandwidth", gt=0, le=MAX_BYTES_PER_S)
    usable_fraction: float = _f("fraction", "share of HBM the serving engine may fill with weights, adapters and KV cache", gt=0, le=1)
    stream_bandwidth_fraction: float = _f("fraction", "best achieved / peak HBM bandwidth of a large streaming kernel (the engine-profile model's memory roof)", gt=0, le=1)


@dataclass(frozen=True)
class GpuComputeSpec(Table):
    """Dense tensor-core peaks (no 2:4 structured sparsity)."""

    fp16_dense_flop_per_s: int = _f("FLOP/s", "dense FP16 tensor-core peak (no structured sparsity)", gt=0, le=MAX_OPS_PER_S)
    bf16_dense_flop_per_s: int = _f("FLOP/s", "dense BF16 tensor-core peak", gt=0, le=MAX_OPS_PER_S)
    fp8_dense_flop_per_s: int = _f("FLOP/s", "dense FP8 tensor-core peak; 0 = no FP8 tensor cores (no FP8 or W4A8 kernels)", ge=0, le=MAX_OPS_PER_S)
    int8_dense_op_per_s: int = _f("OP/s", "dense INT8 tensor-core peak", gt=0, le=MAX_OPS_PER_S)
    sm_count: int = _f("count", "streaming multiprocessors", ge=1, le=100_000)


@dataclass(frozen=True)
class GpuPowerSpec(Table):
    """Board power by phase."""

    tdp_w: float = _f("W", "board power limit (TDP)", gt=0)
    idle_w: float = _f("W", "board power idle with a model resident (CUDA context held)", ge=0)
    decode_power_w: float = _f("W", "average board power during memory-bound decode", gt=0)
    prefill_power_w: float = _f("W", "average board power during compute-bound prefill", gt=0)
    memory_dynamic_w: float = _f("W", "board power above idle per unit of HBM utilisation (achieved / peak bandwidth); engine-profile model", ge=0)
    compute_dynamic_w: float = _f("W", "board power above idle per unit of tensor-core utilisation (achieved / dense peak of the data type); engine-profile model", ge=0)

    def _problems(self) -> Iterator[Problem]:
        if self.idle_w >= self.tdp_w:
            yield "idle_w", f"{self.idle_w} W is not below tdp_w {self.tdp_w} W"
        for name in ("decode_power_w", "prefill_power_w"):
            value = getattr(self, name)
            if not self.idle_w <= value <= self.tdp_w:
                yield name, f"{value} W is outside [idle_w, tdp_w] = [{self.idle_w}, {self.tdp_w}] W"


@dataclass(frozen=True)
class GpuEfficiencySpec(Table):
    """Achieved fractions of peak, calibrated on published end-to-end serving measurements."""

    decode_bandwidth_fraction: float = _f("fraction", "achieved / peak HBM bandwidth in decode (MBU)", gt=0, le=1)
    prefill_compute_fraction: float = _f("fraction", "achieved / peak dense tensor throughput in prefill (MFU); also used for any compute-bound decode", gt=0, le=1)


@dataclass(frozen=True)
class GpuServingSpec(Table):
    """Data types the GPU serves the model in (not PRIMAL's 4/8-bit precision)."""

    weight_bits: int = _f("bits", "bits per base weight in HBM (16 = FP16; 8 = FP8)", choices=(8, 16))
    lora_weight_bits: int = _f("bits", "bits per LoRA A/B weight in HBM", choices=(8, 16))
    kv_bits: int = _f("bits", "bits per K/V cache entry in HBM", choices=(8, 16))
    activation_bits: int = _f("bits", "bits per activation; GEMMs run on FP8 tensor cores only when weights and activations are both 8-bit", choices=(8, 16))


@dataclass(frozen=True)
class GpuKernelSpec(Table):
    """Fixed per-kernel cost: small dependent kernels take a fixed time however little they move."""

    serial_rate_hz: int = _f("Hz", "small dependent kernels completed per second back to back (1 / fixed time of one kernel)", gt=0, le=MAX_RATE_HZ)
    per_layer: int = _f("count", "kernels one decoder layer of the base model launches per forward pass (sets a step-time floor)", ge=1, le=10_000)
    per_lora_projection: int = _f("count", "extra kernels per projection carrying an unmerged LoRA adapter (shrink x@A, expand (xA)@B)", ge=1, le=10_000)


@dataclass(frozen=True)
class GpuTarget(TargetBase):
    """A GPU baseline for a roofline model: peaks, power, achieved-efficiency factors, serving data types, kernel costs."""

    schema_version: int = _f("count", "target file format version", choices=(SCHEMA_VERSION,))
    name: str = _f("text", "target name (bundled targets: the file stem)")
    description: str = _f("text", "one-line description")
    kind: str = _f("enum", "target family", choices=("gpu",))
    memory: GpuMemorySpec = _f("table", "memory")
    compute: GpuComputeSpec = _f("table", "compute peaks")
    power: GpuPowerSpec = _f("table", "board power")
    efficiency: GpuEfficiencySpec = _f("table", "achieved fractions of peak")
    serving: GpuServingSpec = _f("table", "data types as served")
    kernels: GpuKernelSpec = _f("table", "fixed per-kernel costs")
    source: str = _internal("file the target was loaded from (not part of the hash)")
    ranges: dict[str, tuple[float, float]] = ranges_field()
