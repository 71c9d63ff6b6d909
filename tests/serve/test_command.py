"""``primal trace`` and ``primal serve``: files written whole, the report, and one-line errors."""

from __future__ import annotations

import json

import pytest

from primal_compiler.cli import main


def _exit(argv) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse refused a flag
        return int(exc.code or 0)


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("serve") / "t.jsonl"
    assert main(["trace", "-o", str(path), "--adapters", "A", "B", "--requests", "12", "--rate", "20000",
                 "--prompt", "4:20", "--generate", "1:6", "--seed", "3"]) == 0
    return path


def test_trace_is_deterministic_and_never_overwritten(trace_file, tmp_path, capsys):
    again = tmp_path / "again.jsonl"
    assert main(["trace", "-o", str(again), "--adapters", "A", "B", "--requests", "12", "--rate", "20000",
                 "--prompt", "4:20", "--generate", "1:6", "--seed", "3"]) == 0
    assert again.read_bytes() == trace_file.read_bytes()
    capsys.readouterr()
    assert _exit(["trace", "-o", str(again), "--adapters", "A", "--requests", "1", "--rate", "1"]) == 2
    assert "exists" in capsys.readouterr().err
    assert again.read_bytes() == trace_file.read_bytes()


def test_serve_prints_the_report_and_its_json(trace_file, capsys):
    args = ["serve", "tiny-llama", "--lora", "q,v:8", "--adapters", "A", "B", "--trace", str(trace_file),
            "--context", "64", "-p", "fast", "--max-batch", "2"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.startswith("serve: tiny-llama on primal-7nm, 2 adapters, 12 requests") and "adapter switch" in out
    assert main(args + ["--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["requests"] == 12 and len(r["per_request"]["first_token_s"]) == 12
    assert r["policy"] == {"prefetch": True, "sparse": True, "max_batch": 2, "zero_fraction": 0.245}
    assert r["tokens_per_j"] > 0 and r["ttft_s"]["p99"] >= r["ttft_s"]["p50"] > 0


def test_serve_writes_its_timeline(trace_file, tmp_path, capsys):
    out = tmp_path / "serve.json"
    args = ["serve", "tiny-llama", "--lora", "q,v:8", "--adapters", "A", "B", "--trace", str(trace_file),
            "--context", "64", "-p", "fast", "--perfetto", str(out)]
    assert main(args) == 0
    ev = json.loads(out.read_text())["traceEvents"]
    assert sum(e["ph"] == "b" for e in ev) >= 12 and any(e["name"] == "prefill" for e in ev)
    capsys.readouterr()
    assert _exit(args) == 2  # never replaced without --force
    assert "exists" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["--adapters", "A"], "unknown adapter 'B'"),
    (["--adapters", "A", "B", "--lora", ""], "has no LoRA adapter to switch"),
    (["--adapters", "A", "A"], "--adapters: names an adapter twice"),
    (["--adapters", "A", "B", "--context", "8"], "exceeds the context of 8 tokens"),
    (["--adapters", "A", "B", "--max-batch", "0"], "argument --max-batch"),
])
def test_serve_errors_are_one_line(trace_file, capsys, args, message):
    base = ["serve", "tiny-llama", "--trace", str(trace_file), "-p", "fast", "--context", "64", "--lora", "q,v:8"]
    capsys.readouterr()
    assert _exit(base + args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and "Traceback" not in "\n".join(err)


def test_serve_refuses_an_adapter_directory(trace_file, tmp_path, capsys):
    (tmp_path / "A").mkdir()
    capsys.readouterr()
    assert _exit(["serve", "tiny-llama", "--lora", "q,v:8", "--adapters", str(tmp_path / "A"), "B", "--trace",
                  str(trace_file)]) == 2
    assert "is a directory: serve takes adapter names" in capsys.readouterr().err
