"""The engine-profile model: precision, engine, batch, context, LoRA and power move the costs the way they should."""

from __future__ import annotations

import math

import pytest

from primal_compiler.baselines.engine import PRECISION, memory_need, serve
from primal_compiler.baselines.profile import engine_names, load_engine
from primal_compiler.errors import InputError
from primal_compiler.frontend import load_model
from primal_compiler.target import load_target


@pytest.fixture(scope="module")
def m13():
    return load_model("llama2-13b", "q,v:8")


def run(model, gpu="h100", engine="vllm", **kw):
    args = {"precision": "fp16", "batch": 1, "prompt": 2047, "generate": 128, **kw}
    return serve(model, load_target(gpu), load_engine(engine), **args)


def test_identities_and_bounds(m13):
    for gpu in ("a100", "h100", "h200"):
        for engine in engine_names():
            s = run(m13, gpu, engine, batch=4)
            assert s.tokens_per_s == pytest.approx(s.batch / s.itl_s)
            assert s.tokens_per_j == pytest.approx(1 / s.energy_per_token_j)
            assert s.energy_per_token_j == pytest.approx(s.decode_energy_j / (s.batch * (s.generate - 1)))
            tdp, idle = load_target(gpu).power.tdp_w, load_target(gpu).power.idle_w
            assert idle < s.power_w <= tdp and idle < s.prefill_power_w <= tdp
            assert s.itl_end_s >= s.itl_s * (1 - 1e-12) and s.itl_s > 0 and s.ttft_s > 0 and s.fits  # equal when host-bound
            assert all(math.isfinite(v) for v in (s.ttft_s, s.itl_s, s.power_w, s.prefill_energy_j))


def test_decode_follows_weight_bytes(m13):
    f16, f8, w4 = (run(m13, "h100", "trtllm", precision=p) for p in ("fp16", "fp8", "w4a16"))
    assert f16.itl_s > f8.itl_s > w4.itl_s
    # Fixed kernel and host time do not shrink with the weights: less than the ideal 2x and 3.9x.
    assert 1.3 < f16.itl_s / f8.itl_s < 2 and 1.8 < f16.itl_s / w4.itl_s < 3.9
    assert f8.ttft_s < f16.ttft_s  # FP8 tensor cores in the compute-bound prefill


def test_kv_bits_and_context(m13):
    short, long = run(m13, prompt=128, generate=128), run(m13, prompt=4000, generate=64)
    assert long.itl_s > short.itl_s
    kv8 = run(m13, prompt=4000, generate=64, kv_bits=8)
    assert kv8.itl_s < long.itl_s and kv8.memory_bytes < long.memory_bytes
    s = run(m13, prompt=1000, generate=1000)
    assert s.itl_end_s > s.itl_s  # the last step reads the longest cache


def test_batch_amortises_weights_until_the_kv_cache_dominates(m13):
    b1, b8 = run(m13, batch=1, prompt=256), run(m13, batch=8, prompt=256)
    assert 5 < b8.tokens_per_s / b1.tokens_per_s < 8
    assert b8.tokens_per_j > b1.tokens_per_j
    assert b8.ttft_s > 4 * b1.ttft_s  # a compute-bound prefill: eight prompts take several times as long


def test_engines_order(m13):
    hf, vllm, trt = (run(m13, engine=e) for e in ("hf-eager", "vllm", "trtllm"))
    assert hf.itl_s > vllm.itl_s > trt.itl_s


def test_lora_merged_costs_nothing_unmerged_adds_kernels(m13):
    base = run(load_model("llama2-13b"))
    merged, unmerged = run(m13, lora_mode="merged"), run(m13, lora_mode="unmerged")
    assert merged.itl_s == pytest.approx(base.itl_s)
    extra = unmerged.itl_s - merged.itl_s
    # 40 layers x 2 projections x 2 kernels x 4 us, plus a little streaming
    assert 0.6e-3 < extra < 0.8e-3
    hf_extra = run(m13, engine="hf-eager").itl_s - run(m13, engine="hf-eager", lora_mode="merged").itl_s
    assert hf_extra > 5 * extra


def test_each_further_distinct_adapter_reads_its_own_a_and_b(m13):
    """Hand computation: N distinct adapters add (N - 1) x every adapted projection's A and B bytes at the engine's
    gather bandwidth (vLLM: 0.9 of the HBM peak, no fixed time) to each pass; PEFT's loop also its kernels' fixed
    time per adapter; memory holds N adapters."""
    h100 = load_target("h100")
    hbm = h100.memory.hbm_bandwidth_bytes_per_s
    per_adapter = sum((lin.in_features + lin.out_features) * lin.lora.rank * 2 for layer in m13.layers
                      for lin in layer.linears if lin.lora is not None)  # 40 layers x (q, v) x 2 x 5120 x 8 x 2 B
    assert per_adapter == 40 * 2 * 2 * 5120 * 8 * 2
    one, four = run(m13, batch=8, adapters=1), run(m13, batch=8, adapters=4)
    step = four.details["decode_end_s"]["lora"] - one.details["decode_end_s"]["lora"]
    assert step == pytest.approx(3 * per_adapter / (hbm * 0.9), rel=1e-9)
    assert four.details["memory"]["lora_bytes"] == pytest.approx(4 * one.details["memory"]["lora_bytes"])
    hf = [run(m13, engine="hf-eager", batch=8, adapters=n).details["decode_end_s"]["lora"] for n in (1, 4)]
    assert hf[1] - hf[0] == pytest.approx(3 * (80 * 1.6e-5 + per_adapter / (hbm * 0.9)), rel=1e-9)
    assert four.tokens_per_s < one.tokens_per_s


def test_an_eager_engine_takes_the_longer_of_its_dispatch_and_the_gpu():
    """Hand computation: hf-eager dispatches 45 x 40 + 12 = 1812 kernels a pass at 15 us, 27.18 ms, while the GPU
    works asynchronously; a step is the longer of the two plus the 1 ms of generate()'s bookkeeping. At batch 1
    the GPU's step is shorter (host-bound: the dispatch sets the step), at batch 32 over 1024 positions longer
    (the dispatch hides);
    a CUDA-graph engine (vLLM) dispatches nothing per kernel, its host part is its per-pass time alone."""
    m = load_model("llama2-13b")
    dispatch = (45 * 40 + 12) * 15e-6
    for batch, prompt, bound in ((1, 128, "host"), (32, 1024, "gpu")):
        s = run(m, engine="hf-eager", batch=batch, prompt=prompt, generate=16)
        parts = s.details["decode_end_s"]
        gpu = sum(v for k, v in parts.items() if k != "host")
        assert parts["host"] == pytest.approx(1e-3 + max(dispatch - gpu, 0.0), rel=1e-12)
        assert s.itl_end_s == pytest.approx(max(dispatch, gpu) + 1e-3, rel=1e-12)
        assert (dispatch > gpu) == (bound == "host")
    vllm = run(m, batch=1, prompt=128, generate=16).details["decode_end_s"]
    assert vllm["host"] == pytest.approx(5e-4, rel=1e-12)


@pytest.mark.parametrize("kw, match", [({"adapters": 9, "batch": 8}, "9 distinct adapters in a batch of 8"),
                                       ({"adapters": 2, "batch": 8, "lora_mode": "merged"}, "merged model serves one"),
                                       ({"adapters": 0}, "--adapters")])
def test_adapters_beyond_the_batch_or_merged_are_refused(m13, kw, match):
    with pytest.raises(InputError, match=match):
        run(m13, **kw)


def test_gpus_order(m13):
    a, h, h2 = (run(m13, g) for g in ("a100", "h100", "h200"))
    assert a.itl_s > h.itl_s > h2.itl_s
    assert a.ttft_s > 2.5 * h.ttft_s  # 312 vs 989 TFLOP/s
    assert h2.ttft_s == pytest.approx(h.ttft_s, rel=0.1)  # same tensor cores


def test_power_rises_with_load(m13):
    b1, b32 = run(m13, batch=1, prompt=512), run(m13, batch=32, prompt=512)
    assert b32.power_w > b1.power_w
    assert b1.prefill_power_w > b1.power_w  # compute-bound prefill draws more than memory-bound decode
    a = run(m13, "a100", batch=8)
    assert 0.9 * 400 < a.prefill_power_w <= 400.0  # near the A100's TDP, never above


def test_memory_need_and_refusal(m13):
    need = memory_need(m13, load_target("h100"), "fp16", 16, "unmerged", 1, 2175)
    assert need["weight_bytes"] == pytest.approx(m13.base_params * 2)
    assert need["kv_bytes"] == pytest.approx(2175 * 40 * 2 * 5120 * 2)
    w4 = memory_need(m13, load_target("h100"), "w4a16", 16, "merged", 1, 2175)
    assert w4["weight_bytes"] < need["weight_bytes"] / 3 and w4["lora_bytes"] == 0
    with pytest.raises(InputError, match=r"does not fit: llama2-70b in fp16 .* needs 138\.\d GB .* 77\.3 GB is usable"):
        run(load_model("llama2-70b"))
    assert run(load_model("llama2-70b"), "h200", precision="w4a16").fits


@pytest.mark.parametrize("kw, match", [
    ({"precision": "fp9"}, "unknown precision 'fp9'"),
    ({"precision": "w4a8"}, "vllm has no w4a8 kernels"),
    ({"batch": 0}, "--batch: must be an integer >= 1"),
    ({"prompt": -1}, "--prompt: must be an integer >= 1"),
    ({"generate": 1}, "at least 2 generated tokens"),
    ({"kv_bits": 4}, "must be 16 or 8"),
    ({"lora_mode": "fused"}, "merged or unmerged"),
])
def test_bad_arguments(m13, kw, match):
    with pytest.raises(InputError, match=match):
        run(m13, **kw)


def test_no_fp8_on_a100(m13):
    for p in ("fp8", "w4a8"):
        with pytest.raises(InputError, match="a100 has no FP8 tensor cores"):
            run(m13, "a100", "trtllm", precision=p)
    assert set(PRECISION) == {"fp16", "bf16", "fp8", "w8a16", "w4a16", "w4a8"}
