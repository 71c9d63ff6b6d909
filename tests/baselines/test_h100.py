"""H100 roofline baseline: behaviour of the cost model, not particular numbers."""

from __future__ import annotations

import dataclasses
import math

import pytest

from primal_compiler.baselines.h100 import GpuCosts, gpu_costs
from primal_compiler.errors import InputError
from primal_compiler.frontend import load_model
from primal_compiler.target import load_target, with_overrides


@pytest.fixture(scope="module")
def h100():
    return load_target("h100")


@pytest.fixture(scope="module")
def base():
    return load_model("llama2-13b")


@pytest.fixture(scope="module")
def qv8():
    return load_model("llama2-13b", "q,v:8")


def test_api_shape(h100, qv8):
    r = gpu_costs(qv8, h100, batch=1, context=2048)
    assert isinstance(r, GpuCosts)
    for f in dataclasses.fields(GpuCosts):
        if f.name != "details":
            value = getattr(r, f.name)
            assert isinstance(value, float) and math.isfinite(value) and value > 0, f.name
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.itl_s = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        r.details["bound"] = "compute"  # type: ignore[index]
    for key in ("bytes_per_step", "flops_per_step", "lora_overhead_s", "bound"):
        assert key in r.details
    assert r.details["prompt"] == 2047  # prompt defaults to context - 1


def test_decode_is_memory_bound_at_batch_1_and_reads_weights_plus_kv(h100, base):
    r = gpu_costs(base, h100, batch=1, context=2048)
    assert r.details["bound"] == "memory"
    assert r.details["memory_time_s"] > 10 * r.details["compute_time_s"]
    # Every FP16 weight of the layers and LM head is read once per step (embeddings only gathered).
    assert r.details["weight_bytes_per_step"] == pytest.approx(2 * (base.base_params - base.embed_params), rel=1e-3)
    kv = 1 * 2048 * base.num_layers * 2 * base.attention.kv_size * 2
    assert r.details["kv_bytes_per_step"] == pytest.approx(kv, rel=2e-3)


def test_itl_grows_with_context(h100, qv8):
    itls = [gpu_costs(qv8, h100, 1, c).itl_s for c in (128, 512, 2048, 4096)]
    assert itls == sorted(itls) and itls[-1] > itls[0]


def test_itl_grows_weakly_with_batch_while_throughput_grows(h100, qv8):
    one, eight = gpu_costs(qv8, h100, 1, 256), gpu_costs(qv8, h100, 8, 256)
    assert one.itl_s < eight.itl_s < 1.2 * one.itl_s  # weights dominate, read once for the batch
    assert eight.tokens_per_s > 6 * one.tokens_per_s


def test_large_batch_decode_turns_compute_bound(h100, base):
    r = gpu_costs(base, h100, batch=512, context=16)
    assert r.details["bound"] == "compute"


def test_prefill_is_compute_bound_for_long_prompts(h100, qv8):
    r = gpu_costs(qv8, h100, batch=1, context=2048)
    assert r.details["prefill_bound"] == "compute"
    assert r.ttft_s > r.itl_s
    longer = gpu_costs(qv8, h100, batch=1, context=4096)
    assert longer.ttft_s > 1.9 * r.ttft_s  # at least linear in the prompt (attention adds more)


def test_explicit_prompt_sets_ttft_only(h100, qv8):
    short = gpu_costs(qv8, h100, batch=1, context=2048, prompt=128)
    default = gpu_costs(qv8, h100, batch=1, context=2048)
    assert short.ttft_s < default.ttft_s and short.itl_s == default.itl_s
    assert short.details["prompt"] == 128


def test_lora_adds_overhead_growing_with_rank_and_targets(h100, base):
    def itl(spec):
        model = load_model("llama2-13b", spec) if spec else base
        return gpu_costs(model, h100, batch=4, context=1024)

    none, qv8, qv64, all8 = itl(None), itl("q,v:8"), itl("q,v:64"), itl("all:8")
    assert none.details["lora_overhead_s"] == 0 and none.details["lora_kernels_per_step"] == 0
    assert none.itl_s < qv8.itl_s < all8.itl_s
    assert qv8.details["lora_bytes_per_step"] < qv64.details["lora_bytes_per_step"]
    assert qv8.details["lora_overhead_s"] < qv64.details["lora_overhead_s"]
    assert qv8.itl_s < qv64.itl_s and qv8.ttft_s < qv64.ttft_s
    # Two serial kernels per LoRA'd projection per layer.
    assert qv8.details["lora_kernels_per_step"] == 2 * 2 * base.num_layers
    assert all8.details["lora_kernels_per_step"] == 2 * 7 * base.num_layers


def test_decode_lora_overhead_is_mostly_fixed_kernel_latency_at_small_rank(h100, qv8):
    r = gpu_costs(qv8, h100, batch=1, context=2048)
    fixed = r.details["lora_kernels_per_step"] / h100.kernels.serial_rate_hz
    assert fixed < r.details["lora_overhead_s"] < 1.05 * fixed


def test_energy_is_power_times_time(h100, qv8):
    for batch, context in ((1, 2048), (8, 256), (8, 2048)):
        r = gpu_costs(qv8, h100, batch, context)
        assert r.power_w == h100.power.decode_power_w
        assert r.prefill_power_w == h100.power.prefill_power_w
        assert r.energy_per_token_j == pytest.approx(r.power_w * r.itl_s / batch)
        assert r.tokens_per_j == pytest.approx(1 / r.energy_per_token_j)
        assert r.tokens_per_s == pytest.approx(batch / r.itl_s)
        assert r.prefill_energy_j == pytest.approx(r.prefill_power_w * r.ttft_s)


def test_constants_come_from_the_target(h100, qv8):
    r = gpu_costs(qv8, h100, 1, 2048)
    faster = with_overrides(h100, {"efficiency.decode_bandwidth_fraction": 0.9})
    assert gpu_costs(qv8, faster, 1, 2048).itl_s < r.itl_s
    slow_kernels = with_overrides(h100, {"kernels.serial_rate_hz": 100_000})
    assert gpu_costs(qv8, slow_kernels, 1, 2048).details["lora_overhead_s"] > r.details["lora_overhead_s"]
    fp8 = with_overrides(h100, {"serving.weight_bits": 8, "serving.activation_bits": 8, "serving.kv_bits": 8})
    r8 = gpu_costs(qv8, fp8, 1, 2048)
    assert r8.itl_s < r.itl_s and r8.ttft_s < r.ttft_s


def test_tiny_model_hits_the_kernel_floor(h100):
    r = gpu_costs(load_model("tiny-llama"), h100, batch=1, context=64)
    assert r.details["kernel_floor_binds"]
    assert r.itl_s == pytest.approx(h100.kernels.per_layer * 2 / h100.kernels.serial_rate_hz)


@pytest.mark.parametrize("name", ["gpt2", "opt-1.3b", "mistral-7b", "llama3-8b", "qwen2.5-7b"])
def test_other_families(h100, name):
    r = gpu_costs(load_model(name, "attn:4"), h100, batch=2, context=512)
    assert r.itl_s > 0 and r.details["lora_kernels_per_step"] > 0


def test_model_that_does_not_fit_is_a_one_line_error(h100):
    with pytest.raises(InputError) as info:
        gpu_costs(load_model("llama2-70b"), h100, batch=1, context=2048)
    msg = str(info.value)
    assert "\n" not in msg and "HBM" in msg and info.value.where == "h100"


def test_kv_cache_that_does_not_fit_is_an_error(h100, qv8):
    gpu_costs(qv8, h100, batch=8, context=4096)  # 26 GB weights + 27 GB KV fits
    with pytest.raises(InputError, match="KV cache"):
        gpu_costs(qv8, h100, batch=64, context=4096)


@pytest.mark.parametrize("kwargs", [
    {"batch": 0, "context": 16}, {"batch": 1, "context": 0}, {"batch": 1.5, "context": 16},
    {"batch": True, "context": 16}, {"batch": 1, "context": 16, "prompt": 0}, {"batch": 1, "context": 16, "prompt": 17},
])
def test_bad_arguments(h100, qv8, kwargs):
    with pytest.raises(InputError):
        gpu_costs(qv8, h100, **kwargs)


def test_context_one_uses_a_one_token_prompt(h100, qv8):
    assert gpu_costs(qv8, h100, 1, 1).details["prompt"] == 1
