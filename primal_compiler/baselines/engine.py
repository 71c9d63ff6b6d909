"""Engine-profile model: one GPU serving a model with one engine at one precision.

:func:`serve` prices a static batch: a prefill of ``batch`` prompts of
``prompt`` tokens, then ``generate - 1`` decode steps (the prefill yields the
first token). It combines a GPU target (peaks, stream bandwidth, power by
load; ``targets/<gpu>.toml``) with an engine profile (kernels, fixed costs,
achieved fractions; :mod:`.profile`). docs/baselines.md gives every formula
and every metric's definition.

Per forward pass over T token rows (decode: T = batch; prefill: batch x prompt):

* GEMMs: max(weight bytes / (stream BW x weight fraction of the precision's
  kernel), 2 T x params / (tensor peak of the data type x GEMM fraction));
* attention: decode reads the KV cache at the attention bandwidth fraction;
  prefill runs causal attention at the attention compute fraction;
* non-GEMM kernels move ``hidden_passes`` / ``intermediate_passes`` vectors
  per token and layer at the stream roof;
* every kernel adds the engine's fixed (GPU) time, every pass its host
  time; an eager engine's host dispatches each kernel asynchronously
  (``host_dispatch_s``), so a pass takes the longer of that dispatch and the
  GPU's work (the ``host`` part is the excess);
* unmerged LoRA adds ``kernels_per_projection`` kernels per adapted
  projection (fixed time + their own roofline), and each further distinct
  adapter in the batch (``adapters``) ``gather_fixed_s`` plus its A and B
  read at ``gather_bandwidth_fraction`` of the HBM peak (an SGMV/BGMV-class
  kernel, Punica); merged LoRA adds nothing and serves one adapter.

Power per phase = min(TDP, idle + memory_dynamic_w x HBM utilisation +
compute_dynamic_w x tensor utilisation); energy sums power x time over the
prefill and every decode step.

Guarantees: pure (no I/O, no randomness); every time, power and energy is
positive and finite; ``tokens_per_s == batch / itl_s``,
``tokens_per_j == 1 / energy_per_token_j``, ``power_w <= tdp_w``; a
configuration whose weights, adapters and KV cache exceed the usable HBM, an
engine or GPU without kernels for the precision, or a bad count raises
:class:`InputError` with a one-line message.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, Mapping

import numpy as np

from primal_compiler.baselines.profile import PRECISIONS, EngineProfile
from primal_compiler.errors import InputError
from primal_compiler.ir.model import Model
from primal_compiler.target.gpu import GpuTarget

__all__ = ["LORA_MODES", "Precision", "PRECISION", "Serving", "memory_need", "serve"]

GB = 1e9
LORA_MODES = ("merged", "unmerged")
KV_BITS = (16, 8)


@dataclass(frozen=True)
class Precision:
    """How a precision stores decoder-layer weights and which tensor cores its GEMMs use.

    Embeddings, norms and the LM head stay 16-bit in every precision (AWQ/GPTQ
    and FP8 recipes quantize the decoder linears only).
    """

    name: str
    weight_bits: float  # per decoder-linear weight in HBM, scales included
    tensor: str  # "fp16", "bf16" or "fp8": the peak the GEMMs run at
    kernel: str  # "dense", "w8a16" or "w4a16": the decode bandwidth fraction that applies


PRECISION: dict[str, Precision] = {
    "fp16": Precision("fp16", 16, "fp16", "dense"),
    "bf16": Precision("bf16", 16, "bf16", "dense"),
    "fp8": Precision("fp8", 8, "fp8", "dense"),
    "w8a16": Precision("w8a16", 8, "fp16", "w8a16"),  # per-channel scales
    "w4a16": Precision("w4a16", 4 + 16 / 128, "fp16", "w4a16"),  # FP16 scale per group of 128 (AWQ/GPTQ default)
    "w4a8": Precision("w4a8", 4 + 16 / 128, "fp8", "w4a16"),  # INT4 weights, FP8 activations (TensorRT-LLM W4A8 AWQ)
}
assert tuple(PRECISION) == PRECISIONS


@dataclass(frozen=True)
class Serving:
    """Costs of one static batch (metric definitions: docs/baselines.md).

    ``ttft_s``: the prefill of the batch. ``itl_s``: mean decode step over the
    generation; ``itl_end_s``: its last step (context prompt + generate - 1).
    ``tokens_per_s``: batch / itl_s (steady decode, as ``primal run``);
    ``end_to_end_tokens_per_s``: batch x generate / (ttft + all steps).
    ``energy_per_token_j``/``tokens_per_j``: decode energy per generated token;
    ``power_w``: mean decode board power; ``prefill_power_w``/``prefill_energy_j``
    the prefill's. ``memory_bytes``: weights + adapters + KV cache of
    batch x (prompt + generate) positions.
    """

    gpu: str
    engine: str
    precision: str
    kv_bits: int
    lora_mode: str
    batch: int
    adapters: int
    prompt: int
    generate: int
    ttft_s: float
    itl_s: float
    itl_end_s: float
    tokens_per_s: float
    end_to_end_tokens_per_s: float
    tokens_per_j: float
    energy_per_token_j: float
    power_w: float
    prefill_power_w: float
    prefill_energy_j: float
    decode_energy_j: float
    memory_bytes: float
    memory_usable_bytes: float
    fits: bool
    details: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict of every field (details included)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["details"] = {k: dict(v) if isinstance(v, Mapping) else v for k, v in self.details.items()}
        return out


def memory_need(model: Model, gpu: GpuTarget, precision: str, kv_bits: int, lora_mode: str, batch: int,
                positions: int, adapters: int = 1) -> dict[str, float]:
    """HBM bytes of weights, ``adapters`` adapters (unmerged only) and the KV cache of ``batch x positions``, and
    the usable share."""
    prec = PRECISION[precision]
    lin = sum(_linear_params(layer) for layer in model.layers)
    weights = lin * prec.weight_bits / 8 + (model.base_params - lin) * 2
    lora = model.lora_params * 2 * adapters if lora_mode == "unmerged" else 0.0
    kv = batch * positions * sum(2 * layer.attention.kv_size for layer in model.layers) * kv_bits / 8
    need = weights + lora + kv
    usable = gpu.memory.hbm_capacity_bytes * gpu.memory.usable_fraction
    return {"weight_bytes": weights, "lora_bytes": lora, "kv_bytes": kv, "need_bytes": need, "usable_bytes": usable}


def serve(model: Model, gpu: GpuTarget, engine: EngineProfile, *, precision: str, batch: int, prompt: int,
          generate: int, kv_bits: int = 16, lora_mode: str = "unmerged", adapters: int = 1) -> Serving:
    """Prefill and decode costs of ``model`` on ``gpu`` with ``engine`` (see the module docstring), its ``batch``
    sequences on ``adapters`` distinct adapters (1 .. batch; more than one only unmerged)."""
    _check(gpu, engine, precision, kv_bits, lora_mode, batch=batch, prompt=prompt, generate=generate, adapters=adapters)
    mem = memory_need(model, gpu, precision, kv_bits, lora_mode, batch, prompt + generate, adapters)
    if mem["need_bytes"] > mem["usable_bytes"]:
        raise InputError(gpu.name, f"does not fit: {model.name} in {precision} at batch {batch}, {prompt + generate} "
                                   f"positions needs {mem['need_bytes'] / GB:.1f} GB (weights {mem['weight_bytes'] / GB:.1f}, "
                                   f"LoRA {mem['lora_bytes'] / GB:.2f}, KV cache {mem['kv_bytes'] / GB:.1f}) but "
                                   f"{mem['usable_bytes'] / GB:.1f} GB is usable")
    w = _Work(model, gpu, engine, PRECISION[precision], kv_bits, lora_mode, adapters)
    pre_t, pre_bytes, pre_flops, pre_parts = w.prefill(batch, prompt)
    ctx = np.arange(prompt + 1, prompt + generate, dtype=np.float64)  # KV positions each decode step attends over
    dec_t, dec_bytes, dec_flops, dec_parts = w.decode(batch, ctx)
    pre_p = float(w.power(pre_bytes, pre_flops, pre_t))
    dec_p = w.power(dec_bytes, dec_flops, dec_t)
    decode_s, decode_j = float(dec_t.sum()), float((dec_p * dec_t).sum())
    itl = decode_s / len(ctx)
    energy_per_token = decode_j / (batch * len(ctx))
    peak = w.peak(PRECISION[precision].tensor)
    details = {
        "prefill_s": dict(pre_parts), "decode_end_s": {k: float(v[-1]) for k, v in dec_parts.items()},
        "decode_end_bytes": float(dec_bytes[-1]), "decode_end_flops": float(dec_flops[-1]),
        "decode_end_bandwidth_fraction": float(dec_bytes[-1] / dec_t[-1] / gpu.memory.hbm_bandwidth_bytes_per_s),
        "prefill_flops": pre_flops, "prefill_compute_fraction": pre_flops / pre_t / peak,
        "decode_end_power_w": float(dec_p[-1]), "tensor_peak_flop_per_s": peak, "tensor": PRECISION[precision].tensor,
        "memory": mem, "tdp_w": gpu.power.tdp_w, "idle_w": gpu.power.idle_w,
    }
    return Serving(
        gpu=gpu.name, engine=engine.name, precision=precision, kv_bits=kv_bits, lora_mode=lora_mode, batch=batch,
        adapters=adapters, prompt=prompt, generate=generate, ttft_s=pre_t, itl_s=itl, itl_end_s=float(dec_t[-1]),
        tokens_per_s=batch / itl, end_to_end_tokens_per_s=batch * generate / (pre_t + decode_s),
        tokens_per_j=1.0 / energy_per_token, energy_per_token_j=energy_per_token, power_w=decode_j / decode_s,
        prefill_power_w=pre_p, prefill_energy_j=pre_p * pre_t, decode_energy_j=decode_j,
        memory_bytes=mem["need_bytes"], memory_usable_bytes=mem["usable_bytes"], fits=True,
        details=MappingProxyType(details),
    )


def _check(gpu: GpuTarget, engine: EngineProfile, precision: str, kv_bits: int, lora_mode: str, **counts: int) -> None:
    for name, value in counts.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"--{name}", f"must be an integer >= 1, got {value!r}")
    if counts["generate"] < 2:
        raise InputError("--generate", "needs at least 2 generated tokens (the first comes from the prefill, "
                                       "an inter-token latency needs a second)")
    if precision not in PRECISION:
        raise InputError("--precision", f"unknown precision {precision!r}; known: {', '.join(PRECISION)}")
    if precision not in engine.precision_set:
        raise InputError("--precision", f"{engine.name} has no {precision} kernels (it serves {', '.join(engine.precision_set)})")
    if PRECISION[precision].tensor == "fp8" and gpu.compute.fp8_dense_flop_per_s == 0:
        raise InputError("--precision", f"{gpu.name} has no FP8 tensor cores, so no {precision} kernels "
                                        f"(use fp16, bf16, w8a16 or w4a16)")
    if kv_bits not in KV_BITS:
        raise InputError("--kv-bits", f"must be 16 or 8, got {kv_bits!r}")
    if lora_mode not in LORA_MODES:
        raise InputError("--lora-mode", f"must be merged or unmerged, got {lora_mode!r}")
    if counts["adapters"] > counts["batch"]:
        raise InputError("--adapters", f"{counts['adapters']} distinct adapters in a batch of {counts['batch']}: "
                                       f"at most one per sequence")
    if counts["adapters"] > 1 and lora_mode == "merged":
        raise InputError("--adapters", "a merged model serves one adapter; several in one batch run unmerged "
                                       "(--lora-mode unmerged)")


def _linear_params(layer) -> int:
    return sum(lin.in_features * lin.out_features for lin in layer.linears)


class _Work:
    """Bytes, FLOPs and times of the passes of one configuration."""

    def __init__(self, model: Model, gpu: GpuTarget, engine: EngineProfile, prec: Precision, kv_bits: int,
                 lora_mode: str, adapters: int = 1) -> None:
        self.m, self.g, self.e, self.p, self.adapters = model, gpu, engine, prec, adapters
        self.bw = gpu.memory.hbm_bandwidth_bytes_per_s * gpu.memory.stream_bandwidth_fraction
        d = engine.decode
        self.f_w = {"dense": d.weight_bandwidth_fraction, "w8a16": d.w8a16_bandwidth_fraction,
                    "w4a16": d.w4a16_bandwidth_fraction}[prec.kernel]
        pf = engine.prefill
        self.f_c = pf.gemm_compute_fraction if prec.kernel == "dense" else pf.quantized_gemm_compute_fraction
        lin = sum(_linear_params(layer) for layer in model.layers)
        self.lin_params = lin
        self.weight_bytes = lin * prec.weight_bits / 8 + sum(layer.base_params(model.hidden_size) for layer in model.layers) * 2 - lin * 2
        self.kv_per_pos = sum(2 * layer.attention.kv_size for layer in model.layers) * kv_bits / 8
        self.q_total = sum(layer.attention.q_size for layer in model.layers)
        self.vec = model.num_layers * (pf.hidden_passes * model.hidden_size + pf.intermediate_passes * model.intermediate_size) * 2
        self.kernels = engine.kernels.per_layer * model.num_layers + engine.kernels.per_pass
        self.head = model.hidden_size * model.vocab_size
        self.lora = [(lin.in_features, lin.out_features, lin.lora.rank) for layer in model.layers
                     for lin in layer.linears if lin.lora is not None] if lora_mode == "unmerged" else []

    def peak(self, tensor: str) -> float:
        c = self.g.compute
        return float({"fp16": c.fp16_dense_flop_per_s, "bf16": c.bf16_dense_flop_per_s, "fp8": c.fp8_dense_flop_per_s}[tensor])

    def _common(self, tokens, rows):
        """GEMM, LM head, non-GEMM vectors, fixed and LoRA time of a pass over ``tokens`` rows (``rows`` reach the head)."""
        e, peak16 = self.e, self.peak("fp16" if self.p.tensor == "fp8" else self.p.tensor)
        gemm_flops = 2 * tokens * self.lin_params
        gemm = np.maximum(self.weight_bytes / (self.bw * self.f_w), gemm_flops / (self.peak(self.p.tensor) * self.f_c))
        head_flops = 2 * rows * self.head
        head = max(self.head * 2 / (self.bw * e.decode.weight_bandwidth_fraction), head_flops / (peak16 * e.prefill.gemm_compute_fraction))
        vec_bytes = tokens * (self.vec + self.m.hidden_size * 2)  # + embedding rows gathered
        fixed = self.kernels * e.kernels.fixed_s  # the GPU side of every kernel; the host's in _with_host
        lora_t, lora_bytes, lora_flops = 0.0, 0.0, 0.0
        hbm = self.g.memory.hbm_bandwidth_bytes_per_s
        for fan_in, fan_out, r in self.lora:
            nbytes = (fan_in + fan_out) * r * 2 + tokens * (fan_in + 2 * r + 2 * fan_out) * 2
            nflops = 2 * tokens * r * (fan_in + fan_out)
            lora_t += e.lora.kernels_per_projection * e.kernels.fixed_s + max(nbytes / self.bw, nflops / (peak16 * e.prefill.gemm_compute_fraction))
            further = (self.adapters - 1) * (fan_in + fan_out) * r * 2  # the other distinct adapters' A and B
            lora_t += (self.adapters - 1) * e.lora.gather_fixed_s + further / (hbm * e.lora.gather_bandwidth_fraction)
            lora_bytes, lora_flops = lora_bytes + nbytes + further, lora_flops + nflops
        parts = {"gemm": gemm, "lm_head": head, "vectors": vec_bytes / self.bw, "fixed": fixed, "lora": lora_t}
        nbytes = self.weight_bytes + self.head * 2 + vec_bytes + lora_bytes
        return parts, nbytes, gemm_flops + head_flops + lora_flops

    def _with_host(self, parts: dict) -> dict:
        """``parts`` (the GPU's time) and ``host``: the host time per pass not hidden behind the GPU, plus what
        the host's kernel dispatch takes beyond the GPU's work. An eager engine dispatches every kernel (its
        adapters' in a loop over the distinct ones) asynchronously, so the pass takes the longer of the two."""
        k = self.e.kernels
        dispatched = self.kernels + len(self.lora) * self.e.lora.kernels_per_projection * self.adapters
        gpu = sum(parts.values())
        return {**parts, "host": k.host_per_pass_s + np.maximum(dispatched * k.host_dispatch_s - gpu, 0.0)}

    def prefill(self, batch: int, prompt: int) -> tuple[float, float, float, dict[str, float]]:
        """(seconds, bytes, FLOPs, time by part) of the prefill of ``batch`` prompts."""
        tokens = batch * prompt
        parts, nbytes, flops = self._common(tokens, batch)
        attn_flops = 4.0 * batch * prompt * (prompt + 1) / 2 * self.q_total  # causal: query t scores t keys
        peak16 = self.peak("fp16" if self.p.tensor == "fp8" else self.p.tensor)
        parts["attention"] = attn_flops / (peak16 * self.e.prefill.attention_compute_fraction) + tokens * self.kv_per_pos / self.bw
        parts = {k: float(v) for k, v in self._with_host(parts).items()}
        return sum(parts.values()), nbytes + tokens * self.kv_per_pos, flops + attn_flops, parts

    def decode(self, batch: int, ctx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """Per-step (seconds, bytes, FLOPs, time by part) of decode steps attending over ``ctx`` positions."""
        parts, nbytes, flops = self._common(batch, batch)
        kv = batch * (ctx + 1) * self.kv_per_pos  # read ctx positions (the new one included) and write one
        attn_flops = 4.0 * batch * ctx * self.q_total
        parts["attention"] = np.maximum(kv / (self.bw * self.e.decode.attention_bandwidth_fraction),
                                        attn_flops / (self.peak("fp16") * self.e.prefill.attention_compute_fraction))
        parts = {k: np.broadcast_to(np.asarray(v, dtype=np.float64), ctx.shape) for k, v in self._with_host(parts).items()}
        return sum(parts.values()), nbytes + kv, flops + attn_flops, parts

    def power(self, nbytes, flops, seconds):
        """Board power of a phase moving ``nbytes`` and doing ``flops`` in ``seconds``, capped at TDP."""
        pw = self.g.power
        u_mem = nbytes / seconds / self.g.memory.hbm_bandwidth_bytes_per_s
        u_tc = flops / seconds / self.peak(self.p.tensor)
        return np.minimum(pw.tdp_w, pw.idle_w + pw.memory_dynamic_w * u_mem + pw.compute_dynamic_w * u_tc)
