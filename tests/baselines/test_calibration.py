"""The engine-profile model against published measurements (primal_compiler/baselines/measurements.toml)."""

from __future__ import annotations

import pytest

from primal_compiler.baselines.calibration import load_points, predict, table, tolerance
from primal_compiler.errors import InputError

POINTS = load_points()


@pytest.mark.parametrize("point", POINTS, ids=[p.id for p in POINTS])
def test_model_lands_within_its_tolerance(point):
    """15% (20% for board power), or a known miss that is still one."""
    error, bound = predict(point) / point.value - 1, tolerance(point.metric)
    if point.miss:  # a known miss stays one until the model improves and the mark is removed
        assert abs(error) > bound, f"{point.id} is within {bound:.0%} now ({error:+.1%}): remove its miss mark"
    else:
        assert abs(error) <= bound, f"{point.id}: model {error:+.1%} off {point.value} ({point.source})"


def test_the_issue_points_are_all_there_and_unmarked():
    by = {p.id: p for p in POINTS}
    want = {
        "lmdeploy-13b-b1-2048-2048-throughput": 52.1, "lmdeploy-13b-b1-2048-2048-p50": 0.019,
        "lmdeploy-13b-b1-2048-ftl": 0.243, "lmdeploy-7b-b1-2048-2048-throughput": 93.8,
        "lmdeploy-7b-b1-2048-2048-p50": 0.011, "lmdeploy-7b-b1-2048-ftl": 0.14,
        "lmdeploy-13b-b16-2048-2048-throughput": 366.7, "lmdeploy-13b-b16-2048-2048-p50": 0.040,
        "trtllm-a100-7b-ftl-2048": 0.133, "trtllm-h100-fp8-vs-fp16-7b-b1": 1.51, "trtllm-h100-fp8-vs-fp16-7b-b8": 1.40,
    }
    for pid, value in want.items():
        assert by[pid].value == pytest.approx(value, rel=0.002) and not by[pid].miss
    assert len(POINTS) > len(want) + 5  # more published points than the issue lists


def test_table_rows():
    rows = table(POINTS[:2])
    assert [r["id"] for r in rows] == [p.id for p in POINTS[:2]]
    assert rows[0]["error"] == pytest.approx(rows[0]["model"] / rows[0]["measured"] - 1)


def test_strict_file(tmp_path):
    bad = tmp_path / "m.toml"
    bad.write_text('[[point]]\nid = "x"\nmetric = "ttft_s"\nvalue = 1.0\nwatts = 3\n', encoding="utf-8")
    with pytest.raises(InputError, match="watts: unknown key"):
        load_points(bad)
    bad.write_text('[[point]]\nid = "x"\nmetric = "ttft_s"\nvalue = 1.0\n', encoding="utf-8")
    with pytest.raises(InputError, match="model: missing key"):
        load_points(bad)
    whole = ('[[point]]\nid = "x"\nmetric = "ttft_s"\nvalue = 1\nmodel = "llama2-7b"\ngpu = "a100"\nengine = "vllm"\n'
             'precision = "fp16"\nprompt = 8\ngenerate = 2\nsource = "s"\nstudy = "t"\n')
    bad.write_text(whole + "batch = 1\n", encoding="utf-8")
    assert load_points(bad)[0].value == 1.0  # an integer is a number
    bad.write_text(whole + 'batch = 1\nlora = ""\nmiss = ""\n', encoding="utf-8")
    assert load_points(bad)[0].lora == ""  # "" is an optional text's "none"
    bad.write_text(whole.replace('study = "t"\n', "") + "batch = 1\n", encoding="utf-8")
    with pytest.raises(InputError, match="study: missing key"):  # leave-one-study-out needs every point's study
        load_points(bad)
    for line, problem in (('batch = "8"', 'batch: expected an integer, got string "8"'),
                          ("batch = true", "batch: expected an integer, got boolean true"),
                          ("batch = 1\nheld_out = 1", "held_out: expected a boolean, got integer 1"),
                          ("batch = 1\nkv_bits = 8.0", "kv_bits: expected an integer, got float 8.0")):
        bad.write_text(whole + line + "\n", encoding="utf-8")
        with pytest.raises(InputError, match=problem):
            load_points(bad)


def test_regimes_follow_the_points_conditions():
    """Each regime of issue 51 is a rule on a point's conditions, checked on points whose regimes are known by hand."""
    from primal_compiler.baselines.calibration import regimes

    by = {p.id: p for p in POINTS}
    assert regimes(by["trtllm09-h100-fp8-mistral-7b-b120-128-2048"]) == ("grouped-query attention",)  # 8 KV heads
    assert regimes(by["trtllm09-h100-fp8-llama2-7b-b896-128-128"]) == ("large static batch",)
    assert regimes(by["trtllm09-h100-fp8-mistral-7b-b896-128-128"]) == ("grouped-query attention", "large static batch")
    assert regimes(by["trtllm09-h100-fp8-llama2-7b-ftl-2048"]) == ("FP8 prefill",)
    assert regimes(by["trtllm09-h100-fp8-llama2-7b-b120-128-2048"]) == ()  # FP8, but decode-heavy
    assert regimes(by["optimum-a100-llama2-13b-gptq-exllamav2-b8"]) == ("eager engine", "INT4 weight-only")
    assert regimes(by["modelopt-h200-llama3.1-8b-int4awq-vs-bf16-b8"]) == ("grouped-query attention", "INT4 weight-only")
    assert "board power" in regimes(next(p for p in POINTS if p.metric == "power_w"))
