"""Serving-engine profiles: what an engine's kernels achieve, as strictly loaded TOML data.

A profile (``primal_compiler/baselines/engines/<name>.toml``) holds the
component-level facts the engine-profile model (:mod:`.engine`) combines with
a GPU target: how many kernels a decoder layer launches and the fixed time of
each, host time per forward pass, the fraction of the GPU's stream bandwidth
its decode GEMVs, attention and weight-only quantized kernels reach, the
fraction of the dense tensor peak its prefill GEMMs and attention reach, and
how unmerged LoRA is run. Every value carries a source comment in its file
(docs/baselines.md tabulates them). Loading is as strict as for targets: a
missing, unknown or mistyped key or an impossible value is an
:class:`~primal_compiler.errors.InputError` naming the file and key.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from primal_compiler.errors import InputError
from primal_compiler.target.loader import load_table
from primal_compiler.target.table import SCHEMA_VERSION, Problem, Table
from primal_compiler.target.table import internal_field as _internal
from primal_compiler.target.table import spec_field as _f

__all__ = ["ENGINES_DIR", "EngineProfile", "PRECISIONS", "engine_names", "load_engine"]

ENGINES_DIR = Path(__file__).resolve().parent / "engines"

#: Every precision the model knows; an engine lists the ones it has kernels for.
PRECISIONS = ("fp16", "bf16", "fp8", "w8a16", "w4a16", "w4a8")


@dataclass(frozen=True)
class KernelSpec(Table):
    """Fixed costs: kernels per decoder layer and per forward pass, their fixed time, host time."""

    per_layer: int = _f("count", "kernels one decoder layer launches per forward pass (GEMMs, norms, rotary, cache write, attention, activations, adds)", ge=1, le=10_000)
    per_pass: int = _f("count", "kernels outside the decoder layers per forward pass (embedding gather, final norm, LM head, sampling)", ge=0, le=10_000)
    fixed_s: float = _f("s", "fixed GPU time of one kernel on top of its roofline time (launch, ramp-up, tail, dependency gap)", gt=0, le=1e-2)
    host_dispatch_s: float = _f("s", "host time to dispatch one kernel from an eager framework, asynchronous to the GPU: a pass takes the longer of the host's dispatch and the GPU's work (0: a captured CUDA graph, nothing dispatched per kernel)", ge=0, le=1e-3)
    host_per_pass_s: float = _f("s", "host time per forward pass not hidden behind the GPU (scheduling, sampling, bookkeeping)", ge=0, le=1.0)


@dataclass(frozen=True)
class DecodeSpec(Table):
    """Achieved bandwidth of the memory-bound decode kernels, as fractions of the GPU's stream bandwidth."""

    weight_bandwidth_fraction: float = _f("fraction", "16- and 8-bit dense GEMV/GEMM weight streaming, of the stream roof", gt=0, le=1)
    attention_bandwidth_fraction: float = _f("fraction", "decode attention over the KV cache, of the stream roof", gt=0, le=1)
    w8a16_bandwidth_fraction: float = _f("fraction", "8-bit weight-only GEMV/GEMM (dequantized in the kernel), of the stream roof", gt=0, le=1)
    w4a16_bandwidth_fraction: float = _f("fraction", "4-bit weight-only GEMV/GEMM (group-128 scales), of the stream roof; also W4A8", gt=0, le=1)


@dataclass(frozen=True)
class PrefillSpec(Table):
    """Achieved compute of the prefill kernels, as fractions of the dense tensor peak of the data type."""

    gemm_compute_fraction: float = _f("fraction", "large dense GEMMs (16-bit and FP8)", gt=0, le=1)
    quantized_gemm_compute_fraction: float = _f("fraction", "weight-only quantized GEMMs (W8A16, W4A16, W4A8) once compute-bound: dequantization in the main loop", gt=0, le=1)
    attention_compute_fraction: float = _f("fraction", "fused causal attention (FlashAttention-2 class) in 16-bit", gt=0, le=1)
    hidden_passes: int = _f("count", "hidden-size activation vectors per token and layer read or written by non-GEMM kernels (norms, residual adds, rotary, cache write)", ge=0, le=1000)
    intermediate_passes: int = _f("count", "intermediate-size activation vectors per token and layer read or written by non-GEMM kernels (gated activation)", ge=0, le=1000)


@dataclass(frozen=True)
class LoraSpec(Table):
    """How unmerged LoRA adapters run (merged adapters cost nothing at inference)."""

    kernels_per_projection: int = _f("count", "kernels per adapted projection and pass when unmerged (shrink x@A, expand (xA)@B, any scale/add)", ge=1, le=100)
    gather_fixed_s: float = _f("s", "fixed time per further distinct adapter in a batch, per adapted projection and pass (gathering its A and B: SGMV/BGMV segment set-up, or a per-adapter loop's kernels)", ge=0, le=1e-3)
    gather_bandwidth_fraction: float = _f("fraction", "HBM bandwidth at which a further distinct adapter's A and B are read, of the HBM peak", gt=0, le=1)


@dataclass(frozen=True)
class EngineProfile(Table):
    """One serving engine: identity, supported precisions, and its kernel tables."""

    schema_version: int = _f("count", "profile file format version", choices=(SCHEMA_VERSION,))
    name: str = _f("text", "engine name (the file stem)")
    description: str = _f("text", "one-line description: the engine class and versions the numbers describe")
    precisions: str = _f("text", "comma-separated precisions the engine has kernels for (of fp16, bf16, fp8, w8a16, w4a16, w4a8)")
    kernels: KernelSpec = _f("table", "fixed costs")
    decode: DecodeSpec = _f("table", "decode bandwidth fractions")
    prefill: PrefillSpec = _f("table", "prefill compute fractions")
    lora: LoraSpec = _f("table", "unmerged LoRA")
    source: str = _internal("file the profile was loaded from")

    @property
    def precision_set(self) -> tuple[str, ...]:
        """The supported precisions, in the order of :data:`PRECISIONS`."""
        given = {p.strip() for p in self.precisions.split(",")}
        return tuple(p for p in PRECISIONS if p in given)

    def _problems(self) -> Iterator[Problem]:
        given = [p.strip() for p in self.precisions.split(",")]
        bad = [p for p in given if p not in PRECISIONS]
        if bad:
            yield "precisions", f"unknown precision {bad[0]!r} (known: {', '.join(PRECISIONS)})"


def engine_names() -> tuple[str, ...]:
    """Bundled engine profiles by name, sorted."""
    return tuple(sorted(p.stem for p in ENGINES_DIR.glob("*.toml")))


def load_engine(name: str) -> EngineProfile:
    """The bundled profile ``name``; an unknown name or a bad file raises :class:`InputError`."""
    if name not in engine_names():
        raise InputError("--engine", f"unknown engine {name!r}; known engines: {', '.join(engine_names())}")
    path = ENGINES_DIR / f"{name}.toml"
    profile = load_table(EngineProfile, path, "engine profile")
    if profile.name != name:
        raise InputError(str(path), f"name: {profile.name!r} does not match the file name {name!r}")
    object.__setattr__(profile, "source", str(path))
    return profile
