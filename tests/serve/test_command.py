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
    assert r["policy"] == {"prefetch": True, "sparse": True, "max_batch": 2, "zero_fraction": 0.245,
                           "context_save": True, "batching": "mixed"}
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


def test_serve_takes_peft_directories_each_with_its_own_zero_blocks(tmp_path, capsys):
    """Two tiny-llama adapters: A dense, B with its V factors all zero. Each switch writes its own adapter's
    non-zero blocks, so switching to B writes half the bytes; the trace names them A and B."""
    from primal_compiler.frontend import load_model
    from primal_compiler.ir.model import Role
    from tests.frontend.test_weights import write_adapter

    model = load_model("tiny-llama", "q,v:8")

    def half(layer, role, a, b):
        if role == Role.V:
            a[:] = 0.0
            b[:] = 0.0

    write_adapter(tmp_path / "A", model)
    write_adapter(tmp_path / "B", model, zero=half)
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,adapter,prompt_tokens,generate_tokens\n0,A,8,2\n0,B,8,2\n", encoding="utf-8")
    capsys.readouterr()
    assert main(["serve", "tiny-llama", "--adapters", str(tmp_path / "A"), str(tmp_path / "B"), "--trace",
                 str(trace), "--context", "64", "-p", "fast", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["adapters"] == ["A", "B"]
    by_tail = {s["tail"]: s for s in r["shapes"]}
    a = next(s for t, s in by_tail.items() if f"adapter={tmp_path / 'A'}" in t)
    b = next(s for t, s in by_tail.items() if f"adapter={tmp_path / 'B'}" in t)
    assert b["config_bytes"] == a["config_bytes"] // 2  # q and v have the same shapes here
    assert r["per_request"]["switch"] == ["cold", "warm"]


def test_two_adapters_of_one_name_are_refused(tmp_path, trace_file, capsys):
    (tmp_path / "x" / "A").mkdir(parents=True)
    capsys.readouterr()
    assert _exit(["serve", "tiny-llama", "--adapters", str(tmp_path / "x" / "A"), "A", "--trace",
                  str(trace_file)]) == 2
    assert "--adapters: names an adapter twice: A A" in capsys.readouterr().err


def test_context_save_resumes_returning_turns_and_prefills_less(tmp_path, capsys):
    """Conversations of several turns on tiny-llama: with context save the returning turns resume their saved
    KV caches (shapes with a history), prefill fewer tokens and reach their first tokens sooner than when
    every turn prefills its history again."""
    trace = tmp_path / "talk.jsonl"
    assert main(["trace", "-o", str(trace), "--adapters", "A", "B", "--requests", "16", "--rate", "50",
                 "--prompt", "4:12", "--generate", "2:6", "--turns", "3:4", "--think", "0.05", "--context", "64",
                 "--seed", "1"]) == 0
    runs = {}
    for flag in ([], ["--no-context-save"]):
        capsys.readouterr()
        assert main(["serve", "tiny-llama", "--lora", "q,v:8", "--adapters", "A", "B", "--trace", str(trace),
                     "--context", "64", "-p", "fast", "--json", *flag]) == 0
        runs[bool(flag)] = json.loads(capsys.readouterr().out)
    on, off = runs[False], runs[True]
    assert on["context_save"]["returning"] == off["context_save"]["returning"] > 0
    assert on["context_save"]["resumed"] > 0 and off["context_save"]["resumed"] == 0
    # from the file: a resumed turn's cache holds its whole history but the last generated token
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    history = [sum(r["prompt_tokens"] + r["generate_tokens"] for r in rows[:i] if r["conversation"] == row["conversation"])
               for i, row in enumerate(rows)]
    saved = on["per_request"]["saved_tokens"]
    assert all(s in (0, h - 1) for s, h in zip(saved, history))
    assert on["context_save"]["saved_tokens"] == sum(saved)
    assert off["context_save"]["prefilled_tokens"] == sum(h + r["prompt_tokens"] for h, r in zip(history, rows))
    assert on["context_save"]["prefilled_tokens"] == off["context_save"]["prefilled_tokens"] - sum(saved)
    assert any(s["history"] for s in on["shapes"]) and not any(s["history"] for s in off["shapes"])
    back = [i for i, s in enumerate(on["per_request"]["saved_tokens"]) if s]
    ttft = lambda r: [r["per_request"]["first_token_s"][i] - r["per_request"]["start_s"][i] for i in back]  # noqa: E731
    assert sum(ttft(on)) < sum(ttft(off))


def test_mixed_batching_puts_several_adapters_in_a_batch_and_reports_the_reprogramming(tmp_path, capsys):
    """The issue's command: four adapters, batches of four. Rank 8 fills the one SRAM slot, so a mixed batch
    rewrites adapters between passes, and the report says how much of it shows; same-adapter batching shows none
    of it in decode, and resident batching, with one slot, never mixes."""
    path = tmp_path / "t4.jsonl"
    assert main(["trace", "-o", str(path), "--adapters", "A", "B", "C", "D", "--requests", "16", "--rate", "200000",
                 "--zipf", "0", "--prompt", "8:24", "--generate", "4:12", "--context", "64", "--seed", "1"]) == 0
    capsys.readouterr()
    base = ["serve", "tiny-llama", "--adapters", "A", "B", "C", "D", "--max-batch", "4", "--trace", str(path),
            "--context", "64", "-p", "fast", "--json", "--batching"]
    reports = {}
    for policy in ("mixed", "same-adapter", "resident"):
        assert main(base + [policy]) == 0
        reports[policy] = json.loads(capsys.readouterr().out)
    mixed = reports["mixed"]
    assert mixed["max_adapters_per_batch"] > 1 and mixed["reprogramming_exposed_s"] > 0
    assert mixed["reconfiguration"]["decode_exposed_s"] > 0
    assert any(s["adapters"] > 1 for s in mixed["shapes"])
    for policy in ("same-adapter", "resident"):
        r = reports[policy]
        assert r["max_adapters_per_batch"] == 1 and r["reconfiguration"]["decode_exposed_s"] == 0
        assert r["reprogramming_exposed_s"] == r["reconfiguration"]["exposed_s"]
