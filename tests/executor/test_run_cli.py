"""``primal run``: compile-and-run, replay of a compiled directory, JSON, and one-line errors."""

from __future__ import annotations

import json

import pytest

from primal_compiler.cli import main

FAST = "lower-tiles,blocking,zcurve-order,kv-ring,codegen,srpg"


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "tiny"
    assert main(["run", "tiny-llama", "--lora", "q,v:8", "-p", FAST, "--context", "64", "-o", str(out)]) == 0
    return out


def test_run_prints_the_report(out_dir, capsys):
    assert main(["run", str(out_dir)]) == 0
    text = capsys.readouterr().out
    for word in ("TTFT", "ITL", "tokens/J", "hop validation", "power by component", "H100"):
        assert word in text


def test_run_json_has_the_promised_keys(out_dir, capsys):
    assert main(["run", str(out_dir), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    m = report["metrics"]
    for key in ("ttft_s", "itl_s", "tokens_per_s", "tokens_per_j", "power_w", "energy_per_token_j", "max_hops",
                "mean_hops", "weighted_hops", "power_breakdown_w"):
        assert key in m
    assert m["context"] == 64 and report["h100"]["itl_s"] > 0
    assert report["validation"]["mapped_legs"] > 0


def test_run_of_a_program_file_equals_run_of_its_directory(out_dir, capsys):
    assert main(["run", str(out_dir), "--json"]) == 0
    a = json.loads(capsys.readouterr().out)
    assert main(["run", str(out_dir / "program.primal"), "--json"]) == 0
    b = json.loads(capsys.readouterr().out)
    for r in (a, b):
        r.pop("program"), r["metrics"].pop("replay_s")
    assert a == b


@pytest.mark.parametrize("extra, message", [
    (["--batch", "4"], "compiled for batch 1, not 4"),
    (["--target", "primal-5nm"], "target: compiled for target primal-7nm"),
    (["--lora", "q:8"], "apply when compiling a model"),
    (["--generate", "2"], "compiled for 3 decode steps, more than --generate 2"),
    (["--replay-steps", "4"], "--replay-steps applies when compiling a model"),
])
def test_run_rejects_mismatches(out_dir, capsys, extra, message):
    assert main(["run", str(out_dir)] + extra) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_run_generates_64_tokens_from_3_replayed_steps_and_a_program_keeps_that(out_dir, capsys):
    assert main(["run", str(out_dir), "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)["metrics"]
    assert planned["generation"] | {"period_s": 0} == {"tokens": 64, "replayed_steps": 3, "repeated_steps": 61,
                                                       "period_s": 0, "planned": 64, "unsettled": None}
    assert planned["decode_steps"] == 64 and planned["generation"]["period_s"] > 0
    assert main(["run", str(out_dir), "--json", "--generate", "100"]) == 0
    longer = json.loads(capsys.readouterr().out)["metrics"]
    assert longer["generation"]["repeated_steps"] == 97 and longer["ttft_s"] == planned["ttft_s"]


def test_a_generation_one_replayed_step_cannot_settle_is_refused(tmp_path, capsys):
    out = tmp_path / "one"
    assert main(["run", "tiny-llama", "-p", FAST, "--context", "64", "--generate", "1", "-o", str(out)]) == 0
    capsys.readouterr()
    assert main(["run", str(out), "--generate", "3"]) == 2
    err = capsys.readouterr().err
    assert "cannot extend 1 replayed decode steps to 3 generated tokens" in err and err.count("\n") == 1


def test_run_rejects_a_kv_space_that_does_not_fit(tmp_path, capsys):
    out = tmp_path / "x"
    assert main(["run", "tiny-llama", "-p", FAST, "--batch", "64", "--context", "4096", "-o", str(out)]) == 2
    assert "largest" in capsys.readouterr().err
    assert not out.exists()


def test_run_rejects_a_corrupted_program(out_dir, tmp_path, capsys):
    bad = tmp_path / "bad.primal"
    data = bytearray((out_dir / "program.primal").read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad.write_bytes(bytes(data))
    assert main(["run", str(bad)]) == 2
    assert "checksum" in capsys.readouterr().err


FIXTURE = "tests/fixtures/onnx/llama_lora_qv_r4_torchscript.onnx"
SMALL = "lower-tiles,blocking,zcurve-order,kv-ring{context=64},codegen,srpg"


def test_run_functional_generates_and_saves_logits(tmp_path, capsys):
    import numpy as np

    from primal_compiler.frontend import load_model
    from primal_compiler.functional import compile_for_replay, replay_functional
    from primal_compiler.target import load_target

    logits = tmp_path / "logits.npy"
    args = ["run", FIXTURE, "--functional", "--weights", FIXTURE, "--prompt", "1,2,3,4", "--generate", "3",
            "-p", SMALL, "--json", "--save-logits", str(logits)]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    target = load_target("primal-7nm")
    program = compile_for_replay(load_model(FIXTURE), target, 4, 3, SMALL)
    expect = replay_functional(program, target, FIXTURE, prompt=[1, 2, 3, 4], generate=3)
    assert out["tokens"] == expect.tokens and len(out["tokens"]) == 3
    assert np.array_equal(np.load(logits), expect.logits)


@pytest.mark.parametrize("extra, message", [
    ([], "needs --weights"),
    (["--weights", FIXTURE, "--prompt", "1,x"], "--prompt: expected comma-separated token ids"),
    (["--weights", "tests/fixtures/onnx/mistral_dynamo.onnx", "--prompt", "1,2"], "file has LoRA on nothing"),
])
def test_run_functional_bad_input(capsys, extra, message):
    assert main(["run", FIXTURE, "--functional", "-p", SMALL] + extra) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_run_reports_scratchpad_overflow_and_strict_refuses_it(out_dir, capsys):
    """Context 64 prefill of 63 tokens in one pass: the hubs' hidden vectors do not fit 16 KiB."""
    assert main(["run", str(out_dir), "--json"]) == 0
    mem = json.loads(capsys.readouterr().out)["metrics"]["memory"]
    assert not mem["fits"] and mem["peak_bytes"] > mem["capacity_bytes"] == 16384 and mem["pes_over_capacity"] > 0
    assert main(["run", str(out_dir)]) == 0
    text = capsys.readouterr().out
    warning = text.index("WARNING: these figures assume scratchpads that hold these buffers")
    assert warning < text.index("metric ")  # above the headline table it qualifies
    assert main(["run", str(out_dir), "--memory", "strict"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "program.primal: record " in err and "of 16,384 B" in err


def test_the_compiler_chunks_the_prefill_to_fit_and_strict_refuses_a_forced_chunk_naming_the_limit(capsys):
    """Issue 48: under --memory strict, with no --prefill-chunk, the compiler takes the largest chunk whose
    allocation fits, so tiny-llama at context 2048 runs; a forced chunk past that limit is refused in one line
    naming it, and the chosen chunk is that limit (one token more does not fit)."""
    assert main(["run", "tiny-llama", "-p", FAST, "--memory", "strict", "--json"]) == 0
    mem = json.loads(capsys.readouterr().out)["metrics"]["memory"]
    assert mem["fits"] and mem["pes_over_capacity"] == 0 and mem["allocated_pes_over"] == 0
    assert mem["peak_bytes"] <= mem["allocated_bytes"] <= mem["capacity_bytes"] == 16384
    assert main(["run", "tiny-llama", "-p", FAST, "--prefill-chunk", "2047", "--memory", "strict"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "prefill chunk 2047 does not fit the scratchpads" in err and "of its 16,384 B" in err
    limit = int(err.rsplit("at most ", 1)[1].split()[0])
    assert 1 <= limit < 2047
    assert main(["run", "tiny-llama", "-p", FAST, "--prefill-chunk", str(limit), "--memory", "strict", "--json"]) == 0
    capsys.readouterr()
    assert main(["run", "tiny-llama", "-p", FAST, "--prefill-chunk", str(limit + 1), "--memory", "strict"]) == 2
    assert f"at most {limit} tokens" in capsys.readouterr().err




def test_compile_under_strict_memory_writes_a_program_the_strict_replay_accepts(tmp_path, capsys):
    """primal compile --memory strict: the stream's prefill is chunked to fit, so the file replays under
    --memory strict with every buffer in its scratchpad; the same compile without it does not fit."""
    pipe = "lower-tiles,blocking,zcurve-order,kv-ring{context=64},codegen,srpg"
    assert main(["compile", "tiny-llama", "--lora", "q,v:8", "-p", pipe, "--memory", "strict",
                 "-o", str(tmp_path / "fit")]) == 0
    capsys.readouterr()
    assert main(["run", str(tmp_path / "fit"), "--memory", "strict", "--json"]) == 0
    mem = json.loads(capsys.readouterr().out)["metrics"]["memory"]
    assert mem["fits"] and mem["allocated_pes_over"] == 0
    assert main(["compile", "tiny-llama", "--lora", "q,v:8", "-p", pipe, "-o", str(tmp_path / "whole")]) == 0
    capsys.readouterr()
    assert main(["run", str(tmp_path / "whole"), "--memory", "strict"]) == 2
    assert "of 16,384 B" in capsys.readouterr().err


def test_memory_strict_in_the_pipeline_holds_unless_the_command_line_says_otherwise(tmp_path, capsys):
    """codegen{memory=strict} given in -p is the compile's, not replaced by the flag's default: a forced chunk
    that does not fit is refused and nothing is written; --memory report on the command line overrides it."""
    pipe = "lower-tiles,blocking,zcurve-order,kv-ring,codegen{prefill_chunk=16,memory=strict},srpg"
    assert main(["compile", "tiny-llama", "-p", pipe, "-o", str(tmp_path / "out")]) == 2
    assert "prefill chunk 16 does not fit the scratchpads" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    assert main(["compile", "tiny-llama", "-p", pipe, "--memory", "report", "-o", str(tmp_path / "out")]) == 0
