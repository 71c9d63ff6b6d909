"""``primal baseline`` and the baseline-family options of ``primal run``."""

from __future__ import annotations

import json

import pytest

from primal_compiler.cli import main

ISSUE = ["baseline", "llama2-13b", "--lora", "q,v:8", "--gpu", "h100", "--precision", "w4a16", "--batch", "1",
         "--prompt", "2047", "--generate", "128"]


def test_issue_command_json(capsys):
    assert main([*ISSUE, "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    for key in ("ttft_s", "itl_s", "itl_end_s", "tokens_per_s", "tokens_per_j", "energy_per_token_j", "power_w",
                "memory_bytes", "fits"):
        assert key in r
    assert r["fits"] is True and r["precision"] == "w4a16" and r["gpu"] == "h100" and r["lora"] == "q,v:8"
    assert r["tokens_per_s"] == pytest.approx(1 / r["itl_s"])


def test_issue_command_table(capsys):
    assert main(ISSUE) == 0
    out = capsys.readouterr().out
    assert "TTFT" in out and "tokens/J" in out and "fits" in out and "memory used" in out


def test_llama3_in_fp8_on_an_h100(capsys):
    """The issue's command on a Llama-3 built-in: FP8 on an H100 runs, its weights the published 8,030,261,248
    parameters at a byte each plus a second byte for the 16-bit embedding, LM head and 65 norms."""
    assert main(["baseline", "llama3-8b", "--gpu", "h100", "--precision", "fp8", "--batch", "1", "--prompt", "128",
                 "--generate", "128", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["fits"] is True and r["precision"] == "fp8"
    assert r["details"]["memory"]["weight_bytes"] == 8_030_261_248 + 2 * 128256 * 4096 + 65 * 4096


@pytest.mark.parametrize("extra, message", [
    (["--gpu", "a200"], "--gpu: unknown GPU 'a200'"),
    (["--gpu", "a100", "--precision", "fp8"], "a100 has no FP8 tensor cores"),
    (["--precision", "int3"], "unknown precision 'int3'"),
    (["--engine", "tgi"], "unknown engine 'tgi'"),
    (["--lora-mode", "both"], "merged or unmerged"),
    (["--adapters", "2"], "--adapters: 2 distinct adapters in a batch of 1"),
    (["--adapters", "2", "--batch", "4", "--lora-mode", "merged"], "a merged model serves one adapter"),
])
def test_bad_input_is_one_line(capsys, extra, message):
    assert main([*ISSUE, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_several_adapters_in_one_batch(capsys):
    assert main(["baseline", "llama2-7b", "--lora", "all:16", "--gpu", "a100", "--precision", "fp16", "--batch", "32",
                 "--prompt", "256", "--generate", "256", "--adapters", "32"]) == 0
    assert "32 distinct adapters" in capsys.readouterr().out
    assert main(["baseline", "llama2-7b", "--gpu", "a100", "--precision", "fp16", "--batch", "32", "--prompt", "256",
                 "--generate", "256", "--adapters", "2"]) == 2
    assert "--adapters" in capsys.readouterr().err


def test_does_not_fit_says_how_much(capsys):
    assert main(["baseline", "llama2-70b", "--gpu", "a100", "--precision", "fp16", "--batch", "1", "--prompt", "16",
                 "--generate", "16"]) == 2
    err = capsys.readouterr().err
    assert "does not fit" in err and "needs 138.0 GB" in err


@pytest.mark.parametrize("flag", ["--batch", "--prompt", "--generate"])
def test_counts_below_one(capsys, flag):
    args = list(ISSUE)
    args[args.index(flag) + 1] = "0"
    assert main(args) == 2 and f"argument {flag}: must be >= 1" in capsys.readouterr().err


def test_run_json_carries_the_family_and_the_choice(capsys):
    assert main(["run", "tiny-llama", "-p", "fast", "--json", "--baseline-gpu", "a100",
                 "--baselines", "trtllm:fp16,vllm:w4a16,trtllm:fp8"]) == 0
    report = json.loads(capsys.readouterr().out)
    fam = report["baselines"]
    assert fam["gpu"] == "a100" and [m["label"] for m in fam["members"]] == ["trtllm:fp16", "vllm:w4a16", "trtllm:fp8"]
    assert "no FP8 tensor cores" in fam["members"][2]["error"]
    assert fam["members"][0]["itl_s"] > 0 and report["h100"]["itl_s"] > 0


def test_run_table_shows_family_and_seed_point(capsys):
    assert main(["run", "tiny-llama", "-p", "fast"]) == 0
    out = capsys.readouterr().out
    assert "H100 FP16 roofline (seed's point)" in out
    for label in ("vllm:fp16", "trtllm:fp16", "trtllm:fp8", "vllm:w4a16"):
        assert f"h100 {label}" in out


def test_a_member_that_cannot_run_is_a_line_under_the_table(capsys):
    """An A100 has no FP8 tensor cores: that member's reason follows the table in one line, and the table's columns
    keep the width of the figures (the reason had widened the TTFT column of every row)."""
    assert main(["run", "tiny-llama", "-p", "fast", "--baseline-gpu", "a100", "--baselines", "vllm:fp16,trtllm:fp8"]) == 0
    lines = capsys.readouterr().out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("GPU baseline "))
    block = lines[head : lines.index("", head)]
    assert [x.split()[1] for x in block[2:4]] == ["FP16", "vllm:fp16"] and max(map(len, block[:4])) < 140
    assert block[4:] == [next(x for x in block if x.startswith("a100 trtllm:fp8: --precision: a100 has no FP8"))]


def test_bad_family_choice(capsys):
    assert main(["run", "tiny-llama", "-p", "fast", "--baselines", "vllm"]) == 2
    assert "ENGINE:PRECISION" in capsys.readouterr().err
    assert main(["run", "tiny-llama", "-p", "fast", "--baseline-gpu", "primal-7nm"]) == 2
    assert "give a GPU" in capsys.readouterr().err


def test_reproduce_takes_the_family_choice(capsys):
    args = ["reproduce", "--model", "tiny-llama", "--context", "64", "--batch8-context", "32",
            "-p", "lower-tiles,blocking,zcurve-order", "--json", "--baseline-gpu", "a100",
            "--baselines", "trtllm:fp16,trtllm:fp8"]
    assert main(args) == 0
    metrics = [r["metric"] for r in json.loads(capsys.readouterr().out)]
    assert "throughput PRIMAL/a100 trtllm:fp16, batch 1" in metrics
    assert not any("trtllm:fp8" in m for m in metrics)  # no FP8 on the A100: left out (primal run says why)
    assert "throughput PRIMAL/H100, batch 1" in metrics  # the seed's point stays
