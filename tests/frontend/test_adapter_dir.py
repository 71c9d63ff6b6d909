"""``--adapter DIR`` alone: the PEFT config sets the LoRA of ``inspect``, ``compile`` and ``run``.

Adapters are written with :func:`tests.frontend.test_weights.write_adapter` (random factors, PEFT
layout) for the ``llama_dynamo`` fixture: hidden 32, q and v 32x32.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.numpy import load_file, save_file

from primal_compiler.cli import main
from primal_compiler.frontend import load_model
from primal_compiler.ir.model import Role
from tests.frontend.test_weights import write_adapter

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "onnx"
MODEL = str(FIXTURES / "llama_dynamo.onnx")
FAST = "lower-tiles,blocking,zcurve-order,kv-ring,codegen"


@pytest.fixture(scope="module")
def llama():
    return load_model(MODEL)


def one_line_error(capsys, *needles: str) -> str:
    captured = capsys.readouterr()
    err = captured.err
    assert err.count("\n") == 1 and "Traceback" not in err and captured.out == "", err
    for needle in needles:
        assert needle in err, err
    return err


def test_adapter_alone_compiles_the_same_program_as_the_explicit_lora(tmp_path, llama, capsys):
    adapter = tmp_path / "ad"
    write_adapter(adapter, llama, rank=8, alpha=16.0)
    by_adapter, by_lora, both = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    assert main(["compile", MODEL, "--adapter", str(adapter), "-p", FAST, "-o", str(by_adapter)]) == 0
    assert main(["compile", MODEL, "--lora", "q,v:8:16", "-p", FAST, "-o", str(by_lora)]) == 0
    assert main(["compile", MODEL, "--lora", "v,q:8:16", "--adapter", str(adapter), "-p", FAST, "-o", str(both)]) == 0
    capsys.readouterr()
    names = sorted(p.name for p in by_lora.iterdir())
    assert "program.primal" in names and sorted(p.name for p in by_adapter.iterdir()) == names
    for name in names:
        assert (by_adapter / name).read_bytes() == (by_lora / name).read_bytes() == (both / name).read_bytes()


def test_the_cost_replay_takes_the_adapter_alone(tmp_path, llama, capsys):
    adapter = tmp_path / "ad"
    write_adapter(adapter, llama, rank=8, alpha=16.0)
    reports = []
    for extra in (["--adapter", str(adapter)], ["--lora", "q,v:8:16"]):
        assert main(["run", MODEL, "-p", FAST, "--json"] + extra) == 0
        report = json.loads(capsys.readouterr().out)
        report["metrics"].pop("replay_s")
        reports.append(report)
    assert reports[0] == reports[1]


def test_the_functional_replay_takes_the_adapter_alone(tmp_path, llama, capsys):
    adapter = tmp_path / "ad"
    write_adapter(adapter, llama, roles=(Role.Q, Role.K, Role.V), rank=4, alpha=8.0)
    common = ["run", MODEL, "--functional", "--weights", MODEL, "--prompt", "1,2,3", "--adapter", str(adapter),
              "--json"]
    summaries = []
    for extra in ([], ["--lora", "q,k,v:4:8"]):
        assert main(common + extra) == 0
        summary = json.loads(capsys.readouterr().out)
        summary.pop("seconds")
        summaries.append(summary)
    assert summaries[0] == summaries[1] and summaries[0]["tokens"]


def test_a_disagreeing_lora_is_refused_naming_both(tmp_path, llama, capsys):
    adapter = tmp_path / "ad"
    write_adapter(adapter, llama, rank=8, alpha=16.0)
    for lora in ("q,v:4", "q:8:16", "q,v:8"):  # rank, targets, alpha
        out = tmp_path / "out"
        assert main(["compile", MODEL, "--adapter", str(adapter), "--lora", lora, "-o", str(out)]) == 2
        one_line_error(capsys, f"--lora: {lora!r} disagrees with {adapter / 'adapter_config.json'}, which gives "
                               "'q,v:8:16'")
        assert not out.exists()


def test_rank_and_alpha_patterns_by_module_name(tmp_path, llama, capsys):
    adapter, other = tmp_path / "ad", tmp_path / "v4"
    write_adapter(adapter, llama, roles=(Role.Q,), rank=8)
    write_adapter(other, llama, roles=(Role.V,), rank=4)
    weights = adapter / "adapter_model.safetensors"
    save_file(load_file(str(weights)) | load_file(str(other / "adapter_model.safetensors")), str(weights))
    config = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"],
              "rank_pattern": {"v_proj": 4}, "alpha_pattern": {"v_proj": 2.5}}
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    model = load_model(MODEL, "q:8:16;v:4:2.5", str(adapter))
    assert [(lin.role, lin.lora.rank, lin.lora.alpha) for lin in model.layers[1].linears if lin.lora] == [
        (Role.Q, 8, 16.0), (Role.V, 4, 2.5)]
    config["rank_pattern"] = {"model.layers.0.self_attn.v_proj": 4}
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    assert main(["inspect", MODEL, "--adapter", str(adapter)]) == 2
    one_line_error(capsys, "adapter_config.json: rank_pattern key 'model.layers.0.self_attn.v_proj' is not one of "
                           "target_modules")


def test_inspect_describes_the_adapter(tmp_path, llama, capsys):
    def zero(layer, role, a, b):
        if (layer, role) == (0, Role.Q):
            a[:] = 0  # A of layer 0 q: its one 32x8 block

    adapter = tmp_path / "ad"
    write_adapter(adapter, llama, rank=8, alpha=16.0, zero=zero)
    assert main(["inspect", MODEL, "--adapter", str(adapter), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["lora_targets"] == ["q", "v"]
    got = info["adapter"]
    assert got["lora"] == "q,v:8:16" and got["config"] == str(adapter / "adapter_config.json")
    assert [(t["role"], t["modules"], t["rank"], t["alpha"], t["layers"], t["lora_A"], t["lora_B"], t["dtype"])
            for t in got["targets"]] == [("q", ["q_proj"], 8, 16.0, 2, [8, 32], [32, 8], "float32"),
                                         ("v", ["v_proj"], 8, 16.0, 2, [8, 32], [32, 8], "float32")]
    assert got["bytes"] == sum(t["bytes"] for t in got["targets"]) == 2 * 2 * 2 * 8 * 32 * 4
    assert got["blocks"] == 8 and got["zero_blocks"] == 1 and "32x32 blocks" in got["blocks_counted"]
    assert main(["inspect", MODEL, "--adapter", str(adapter)]) == 0
    text = capsys.readouterr().out
    assert f"adapter {adapter}: --lora q,v:8:16, 8,192 bytes of LoRA tensors" in text
    assert "  q (q_proj): rank 8, alpha 16, 2 layers, lora_A 8x32, lora_B 32x8 float32, 4,096 bytes" in text
    assert "  all-zero blocks: 1 of 8 (32x32 blocks" in text
    assert main(["inspect", MODEL, "--adapter", str(adapter)]) == 0
    assert capsys.readouterr().out == text  # the same input prints the same bytes


def _no_config(d: Path) -> None:
    (d / "adapter_config.json").unlink()


def _edit(**changes):
    def edit(d: Path) -> None:
        config = json.loads((d / "adapter_config.json").read_text())
        config.update(changes)
        (d / "adapter_config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    return edit


def _not_json(d: Path) -> None:
    (d / "adapter_config.json").write_text("{not json")


def _wider_model_tensors(d: Path) -> None:
    write_adapter(d, load_model("tiny-llama", "q,v:8"), rank=8, alpha=16.0)  # hidden 256, not 32


@pytest.mark.parametrize("command", ["inspect", "compile", "run"])
@pytest.mark.parametrize("spoil, file, problem", [
    (_no_config, "adapter_config.json", "missing: a PEFT adapter directory needs adapter_config.json"),
    (_not_json, "adapter_config.json", "not readable JSON"),
    (_edit(r=None), "adapter_config.json", "has no r (the LoRA rank)"),
    (_edit(target_modules=None), "adapter_config.json", "has no target_modules"),
    (_edit(target_modules=".*proj"), "adapter_config.json", "target_modules '.*proj' is a regular expression"),
    (_edit(target_modules=["q_proj", "v_proj", "fc1"]), "adapter_config.json",
     "target module fc1 (fc1) is not in model llama_dynamo, whose projections are down, gate, k, o, q, up, v"),
    (_edit(target_modules=["q_proj"]), "adapter_model.safetensors",
     "has LoRA tensors on q,v, but adapter_config.json's target_modules give q"),
    (_wider_model_tensors, "adapter_model.safetensors", "layer 0 q lora_A is 256x8, model expects 32x8"),
])
def test_bad_adapters_are_one_line_errors_naming_the_file(tmp_path, llama, capsys, command, spoil, file, problem):
    adapter = tmp_path / "ad"
    write_adapter(adapter, llama, rank=8, alpha=16.0)
    spoil(adapter)
    out = tmp_path / "out"
    extra = {"compile": ["-o", str(out)], "run": ["-o", str(out), "-p", FAST], "inspect": []}[command]
    assert main([command, MODEL, "--adapter", str(adapter)] + extra) == 2
    one_line_error(capsys, f"{adapter / file}: {problem}")
    assert not out.exists()


def test_a_compiled_program_takes_no_adapter_for_the_cost_replay(tmp_path, llama, capsys):
    adapter = tmp_path / "ad"
    write_adapter(adapter, llama, rank=8, alpha=16.0)
    out = tmp_path / "out"
    assert main(["compile", MODEL, "--adapter", str(adapter), "-p", FAST, "-o", str(out)]) == 0
    capsys.readouterr()
    assert main(["run", str(out), "--adapter", str(adapter)]) == 2
    one_line_error(capsys, "--adapter", "apply when compiling a model")


def test_a_missing_adapter_directory(tmp_path, capsys):
    assert main(["inspect", MODEL, "--adapter", str(tmp_path / "nope")]) == 2
    one_line_error(capsys, f"{tmp_path / 'nope'}: no such adapter directory")
    assert list(tmp_path.iterdir()) == []
