"""GPU baseline: a roofline cost model of serving a LoRA-adapted decoder on one GPU (the H100).

:func:`gpu_costs` takes the same model (with its LoRA adapters), batch and
context as a PRIMAL program and returns the GPU's TTFT, ITL, throughput and
energy. Every constant comes from the :class:`GpuTarget` (``targets/h100.toml``,
each value cited there); docs/baselines.md gives every formula.

Model, per phase (prefill of the prompt, or one decode step):

* base time = max(bytes / (HBM bandwidth x MBU), FLOPs / (dense peak x MFU),
  kernel floor); bytes are the weights read once per pass plus the KV cache
  and activations, FLOPs the GEMMs, attention and LM head; the floor is
  ``kernels.per_layer x layers`` kernels at ``kernels.serial_rate_hz``.
* LoRA (unmerged, PEFT-style ``y = xW + (xA)B``) adds per LoRA'd projection
  ``kernels.per_lora_projection`` serial kernels, each taking a fixed
  1 / serial_rate plus max(its bytes / (bandwidth x MBU), its FLOPs / (peak x MFU)).
* energy = phase time x the phase's board power.

Guarantees: the result is a pure function of its arguments (no I/O, no
randomness); every time is positive and finite; ``tokens_per_s == batch /
itl_s``, ``energy_per_token_j == power_w * itl_s / batch``, ``tokens_per_j ==
1 / energy_per_token_j`` and ``prefill_energy_j == prefill_power_w * ttft_s``
exactly; the model, adapters and KV cache of ``batch x context`` tokens must
fit in ``memory.usable_fraction`` of HBM or :class:`InputError` is raised.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from primal_compiler.errors import InputError
from primal_compiler.ir.model import Model, Positional
from primal_compiler.target.gpu import GpuTarget

__all__ = ["GpuCosts", "gpu_costs"]

GB = 1e9


@dataclass(frozen=True)
class GpuCosts:
    """Costs of serving one batch on the GPU.

    ``ttft_s``: prefill of the ``prompt``-token prompts of the whole batch (its
    last position's LM head yields the first token). ``itl_s``: one decode step
    of the batch whose KV cache holds ``context`` positions per sequence.
    ``tokens_per_s``: batch / ITL. ``power_w``: decode board power;
    ``energy_per_token_j``/``tokens_per_j`` are decode energy per generated
    token. ``prefill_energy_j``: energy of the prefill (all sequences).
    ``details``: read-only breakdown (bytes and FLOPs per step, LoRA overhead,
    which roof binds); not part of equality.
    """

    ttft_s: float
    itl_s: float
    tokens_per_s: float
    tokens_per_j: float
    energy_per_token_j: float
    power_w: float
    prefill_energy_j: float
    prefill_power_w: float
    details: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)


@dataclass
class _Pass:
    """Traffic and work of one forward pass, split into base model and LoRA kernels."""

    weight_bytes: float = 0.0
    kv_bytes: float = 0.0
    act_bytes: float = 0.0
    flops: float = 0.0
    lora_bytes: float = 0.0
    lora_flops: float = 0.0
    lora_s: float = 0.0
    lora_kernels: int = 0

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.kv_bytes + self.act_bytes


def gpu_costs(model: Model, target: GpuTarget, batch: int, context: int, prompt: int | None = None) -> GpuCosts:
    """Prefill, decode and energy costs of ``model`` on ``target`` (see the module docstring).

    ``batch`` sequences decode together with ``context`` KV positions each;
    ``prompt`` (default ``context - 1``, at least 1) is the prompt length of
    the prefill. Bad arguments or a model that does not fit raise
    :class:`InputError` with a one-line message.
    """
    _check_ints(batch=batch, context=context)
    prompt = max(context - 1, 1) if prompt is None else prompt
    _check_ints(prompt=prompt)
    if prompt > context:
        raise InputError("gpu_costs", f"prompt {prompt} is longer than context {context}")
    hbm = _check_fits(model, target, batch, context)

    bw = target.memory.hbm_bandwidth_bytes_per_s * target.efficiency.decode_bandwidth_fraction
    peak = _peak_flop_per_s(target) * target.efficiency.prefill_compute_fraction
    t_kernel = 1.0 / target.kernels.serial_rate_hz
    floor_s = target.kernels.per_layer * model.num_layers * t_kernel

    dec = _forward(model, target, batch, tokens=batch, kv_read=batch * context, kv_write=batch, attn_pairs=batch * context, bw=bw, peak=peak)
    pre_pairs = batch * prompt * (prompt + 1) // 2  # causal: query t attends to t positions
    pre = _forward(model, target, batch, tokens=batch * prompt, kv_read=batch * prompt, kv_write=batch * prompt, attn_pairs=pre_pairs, bw=bw, peak=peak)

    dec_mem, dec_comp = dec.bytes / bw, dec.flops / peak
    pre_mem, pre_comp = pre.bytes / bw, pre.flops / peak
    itl = max(dec_mem, dec_comp, floor_s) + dec.lora_s
    ttft = max(pre_mem, pre_comp, floor_s) + pre.lora_s

    p_dec, p_pre = target.power.decode_power_w, target.power.prefill_power_w
    energy_per_token = p_dec * itl / batch
    details = {
        "batch": batch, "context": context, "prompt": prompt,
        "bytes_per_step": dec.bytes + dec.lora_bytes,
        "weight_bytes_per_step": dec.weight_bytes,
        "kv_bytes_per_step": dec.kv_bytes,
        "activation_bytes_per_step": dec.act_bytes,
        "lora_bytes_per_step": dec.lora_bytes,
        "flops_per_step": dec.flops + dec.lora_flops,
        "lora_flops_per_step": dec.lora_flops,
        "memory_time_s": dec_mem,
        "compute_time_s": dec_comp,
        "kernel_floor_s": floor_s,
        "kernel_floor_binds": floor_s > max(dec_mem, dec_comp),
        "lora_overhead_s": dec.lora_s,
        "lora_kernels_per_step": dec.lora_kernels,
        "bound": "memory" if dec_mem >= dec_comp else "compute",
        "prefill_bytes": pre.bytes + pre.lora_bytes,
        "prefill_flops": pre.flops + pre.lora_flops,
        "prefill_memory_time_s": pre_mem,
        "prefill_compute_time_s": pre_comp,
        "prefill_lora_overhead_s": pre.lora_s,
        "prefill_bound": "memory" if pre_mem >= pre_comp else "compute",
        "achieved_bandwidth_bytes_per_s": bw,
        "achieved_flop_per_s": peak,
        **hbm,
    }
    return GpuCosts(
        ttft_s=ttft,
        itl_s=itl,
        tokens_per_s=batch / itl,
        tokens_per_j=1.0 / energy_per_token,
        energy_per_token_j=energy_per_token,
        power_w=p_dec,
        prefill_energy_j=p_pre * ttft,
        prefill_power_w=p_pre,
        details=MappingProxyType(details),
    )


def _check_ints(**values: Any) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError("gpu_costs", f"{name} must be an integer >= 1, got {value!r}")


def _peak_flop_per_s(target: GpuTarget) -> float:
    """Dense tensor peak of the served data types: FP8 only when weights and activations are 8-bit."""
    s = target.serving
    if s.weight_bits == 8 and s.activation_bits == 8:
        return float(target.compute.fp8_dense_flop_per_s)
    return float(target.compute.fp16_dense_flop_per_s)


def _kv_bytes_per_token(model: Model, target: GpuTarget) -> float:
    """K and V of one position in every layer."""
    return sum(2 * layer.attention.kv_size for layer in model.layers) * target.serving.kv_bits / 8


def _check_fits(model: Model, target: GpuTarget, batch: int, context: int) -> dict[str, float]:
    """HBM needed (weights + adapters + KV of batch x context); raises InputError past the usable share."""
    s = target.serving
    weights = model.base_params * s.weight_bits / 8
    adapters = model.lora_params * s.lora_weight_bits / 8
    kv = batch * context * _kv_bytes_per_token(model, target)
    usable = target.memory.hbm_capacity_bytes * target.memory.usable_fraction
    need = weights + adapters + kv
    if need > usable:
        raise InputError(
            target.name,
            f"{model.name} at batch {batch}, context {context} needs {need / GB:.1f} GB of HBM"
            f" (weights {weights / GB:.1f} GB, LoRA {adapters / GB:.2f} GB, KV cache {kv / GB:.1f} GB)"
            f" but {usable / GB:.1f} GB is usable ({target.memory.hbm_capacity_bytes / GB:.1f} GB"
            f" x memory.usable_fraction {target.memory.usable_fraction})",
        )
    return {"hbm_weight_bytes": weights, "hbm_lora_bytes": adapters, "hbm_kv_bytes": kv,
            "hbm_required_bytes": need, "hbm_usable_bytes": usable}


def _forward(model: Model, target: GpuTarget, batch: int, *, tokens: int, kv_read: int, kv_write: int,
             attn_pairs: int, bw: float, peak: float) -> _Pass:
    """One forward pass over ``tokens`` token rows (decode: batch; prefill: batch x prompt).

    ``kv_read``/``kv_write``: KV positions read/written per layer (summed over
    the batch); ``attn_pairs``: (query, key) pairs scored per layer. Only the
    last position of each sequence goes through the LM head.
    """
    s = target.serving
    wb, lb, kvb, ab = s.weight_bits / 8, s.lora_weight_bits / 8, s.kv_bits / 8, s.activation_bits / 8
    t_kernel = 1.0 / target.kernels.serial_rate_hz
    p = _Pass()
    h = model.hidden_size
    for layer in model.layers:
        p.weight_bytes += layer.base_params(h) * wb
        attn = layer.attention
        p.kv_bytes += (kv_read + kv_write) * 2 * attn.kv_size * kvb
        p.flops += 4 * attn_pairs * attn.q_size  # q.k scores and p.v sums
        for lin in layer.linears:
            p.act_bytes += tokens * (lin.in_features + lin.out_features) * ab
            p.flops += 2 * tokens * lin.in_features * lin.out_features
            if lin.lora is None:
                continue
            r = lin.lora.rank
            shrink = (lin.in_features * r * lb + tokens * (lin.in_features + r) * ab, 2 * tokens * lin.in_features * r)
            expand = (r * lin.out_features * lb + tokens * (r + 2 * lin.out_features) * ab, 2 * tokens * r * lin.out_features)
            n = target.kernels.per_lora_projection
            steps: list[tuple[float, float]]  # (bytes, FLOPs) of each kernel
            if n == 1:  # one fused kernel
                steps = [(shrink[0] + expand[0], shrink[1] + expand[1])]
            else:  # extra kernels (e.g. a separate scale-add) move no counted bytes
                steps = [shrink, expand] + [(0.0, 0.0)] * (n - 2)
            for nbytes, nflops in steps:
                p.lora_bytes += nbytes
                p.lora_flops += nflops
                p.lora_s += t_kernel + max(nbytes / bw, nflops / peak)  # fixed latency + streaming
                p.lora_kernels += 1
    # Embedding rows gathered, final norm, LM head (a tied head reads the embedding table).
    p.weight_bytes += tokens * h * wb * (2 if model.positional == Positional.LEARNED else 1)
    p.weight_bytes += (model.base_params - sum(layer.base_params(h) for layer in model.layers)
                       - model.embed_params - model.pos_embed_params) * wb
    if model.tie_word_embeddings:
        p.weight_bytes += model.embed_params * wb
    p.act_bytes += batch * (h + model.vocab_size) * ab
    p.flops += 2 * batch * h * model.vocab_size
    return p
