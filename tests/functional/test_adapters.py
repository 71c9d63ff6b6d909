"""Several adapter directories: one program serves them, each request computing with the adapter it loads."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from primal_compiler.errors import InputError
from primal_compiler.frontend import load_model
from primal_compiler.functional import compile_for_replay, replay_functional
from primal_compiler.isa.opcodes import Opcode
from tests.frontend.test_weights import write_adapter
from tests.functional.conftest import PLACE, fixture

PROMPT = [1, 2, 3]
BASE = "llama_dynamo"


@pytest.fixture(scope="module")
def adapters(tmp_path_factory) -> list[Path]:
    """Two q,v r8 adapters that decode differently (the second's factors are -3 times the first's)."""
    root = tmp_path_factory.mktemp("adapters")
    model = load_model(fixture(BASE), "q,v:8")
    write_adapter(root / "a", model)
    write_adapter(root / "b", model)
    weights = root / "b" / "adapter_model.safetensors"
    save_file({k: v * np.float32(-3) for k, v in load_file(str(weights)).items()}, str(weights),
              metadata={"format": "pt"})
    write_adapter(root / "r16", model, rank=16)
    return [root / "a", root / "b", root / "r16"]


def _replay(target, dirs, requests: str | None = None, generate: int = 3):
    model = load_model(fixture(BASE), adapter=[str(d) for d in dirs])
    pipeline = PLACE.format(opts="", context=32)
    if requests:
        pipeline = pipeline.replace("codegen", f"codegen{{requests={requests}}}")
    program = compile_for_replay(model, target, len(PROMPT), generate, pipeline, adapters=len(dirs))
    return program, replay_functional(program, target, fixture(BASE), [str(d) for d in dirs], prompt=PROMPT,
                                      generate=generate)


def test_each_request_computes_with_its_own_adapter(replay_target, adapters):
    a, b = adapters[:2]
    _, alone_a = _replay(replay_target, [a])
    _, alone_b = _replay(replay_target, [b])
    assert alone_a.tokens != alone_b.tokens  # the adapters matter
    program, both = _replay(replay_target, [a, b])
    assert both.request_tokens == [alone_a.tokens, alone_b.tokens]
    np.testing.assert_array_equal(both.logits, alone_a.logits)
    names = [s.name for s in program.stream.sections]
    assert names == ["adapter:0", "prefill:0", "decode:0", "adapter:1", "prefill:1", "decode:1"]


def test_the_config_records_name_the_adapter_of_their_request(replay_target, adapters):
    program, result = _replay(replay_target, adapters[:2], requests="1;0;1")
    a_tokens = _replay(replay_target, adapters[:1])[1].tokens
    b_tokens = _replay(replay_target, adapters[1:2])[1].tokens
    assert result.request_tokens == [b_tokens, a_tokens, b_tokens]
    stream = program.stream
    for s, want in zip([s for s in stream.sections if s.name.startswith("adapter:")], (1, 0, 1)):
        part = stream.records[s.start : s.stop]
        config = part[part["op"] == Opcode.CONFIG]
        assert len(config) and (config["arg"] >> 16 == want).all() and (config["arg"] & 0xFFFF == 0).all()


def test_a_program_loading_more_adapters_than_given_is_refused(replay_target, adapters):
    model = load_model(fixture(BASE), adapter=[str(d) for d in adapters[:2]])
    program = compile_for_replay(model, replay_target, len(PROMPT), 1, PLACE.format(opts="", context=32), adapters=2)
    with pytest.raises(InputError, match=r"CONFIG .*loads adapter 1, but the replay was given 1 adapter \(one"):
        replay_functional(program, replay_target, fixture(BASE), [str(adapters[0])], prompt=PROMPT)


def test_adapters_of_other_ranks_and_targets_share_a_program_padded_with_zeros(tmp_path, replay_target, adapters):
    """q,v rank 8, q,v rank 16 and o alone at rank 4: the program places q,v,o at ranks 16, 16 and 4, each
    adapter is stored padded with zeros, and each request decodes as its adapter alone does."""
    from primal_compiler.ir.model import Role

    model = load_model(fixture(BASE), "o:4")
    write_adapter(tmp_path / "o4", model, roles=(Role.O,), rank=4, alpha=8.0, names={Role.O: "self_attn.o_proj"})
    dirs = [adapters[0], adapters[2], tmp_path / "o4"]
    both = load_model(fixture(BASE), adapter=[str(d) for d in dirs])
    assert {lin.role: lin.lora.rank for lin in both.layers[0].linears if lin.lora} == {Role.Q: 16, Role.V: 16,
                                                                                      Role.O: 4}
    _, together = _replay(replay_target, dirs)
    assert together.request_tokens == [_replay(replay_target, [d])[1].tokens for d in dirs]
    _, alone = _replay(replay_target, dirs[1:2])
    np.testing.assert_allclose(_replay(replay_target, [dirs[1], dirs[0]])[1].logits, alone.logits, atol=1e-6)


def test_the_command_line_compiles_and_inspects_several_adapters(tmp_path, adapters, capsys):
    from primal_compiler.cli import main

    a, b = (str(d) for d in adapters[:2])
    main(["compile", fixture(BASE), "--adapter", a, "--adapter", b, "-p", "fast", "-o", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert "adapter:0 10" in out and "adapter:1 " in out and "prefill:1" in out
    main(["inspect", fixture(BASE), "--adapter", a, "--adapter", b, "--json"])
    info = json.loads(capsys.readouterr().out)
    assert [x["directory"] for x in info["adapters"]] == [a, b] and info["adapter"]["directory"] == a
    pipeline = "lower-tiles,blocking,zcurve-order,kv-ring,codegen{requests=0;2}"
    assert main(["compile", fixture(BASE), "--adapter", a, "--adapter", b, "-p", pipeline, "-o",
                 str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert err.strip() == ("primal: --adapter: codegen{requests=0;2} names adapter 2, but 2 --adapter directories "
                           "were given")
    assert not (tmp_path / "bad").exists()


def test_lora_sparsity_masks_the_blocks_the_crossbars_hold_not_the_files(tmp_path, replay_target):
    """GPT-NeoX's fused qkv runs [q_h | k_h | v_h] in the file; its crossbars hold q | k | v. Zeroing B's
    file columns 16..31 (head 0's k) zeroes a whole 16-row LoRA block in the file's order but, stored, part
    of the k block: masking by the file's order would skip head 1's q and miss onnxruntime's logits."""
    import onnx
    from onnx import numpy_helper

    from primal_compiler.frontend.onnx_import import recognise_onnx
    from primal_compiler.ir.model import Role
    from tests.functional.reference import ort_greedy

    path = Path(__file__).parents[1] / "fixtures" / "onnx" / "families" / "gpt_neox.onnx"
    base = load_model(str(path))

    def zero(layer, role, a, b):
        b[:, 16:32] = 0.0

    factors = write_adapter(tmp_path / "ad", base, roles=(Role.QKV,), rank=4, alpha=8.0, zero=zero,
                            names={Role.QKV: "attention.query_key_value"}, prefix="base_model.model.gpt_neox.layers")
    merged = onnx.load(path)
    inits = {t.name: t for t in merged.graph.initializer}
    for (layer, _), (a, b) in factors.items():
        name = recognise_onnx(path).projections[(layer, Role.QKV)].weight
        w = numpy_helper.to_array(inits[name])
        inits[name].CopyFrom(numpy_helper.from_array((w + 2.0 * a @ b).astype(np.float32), name))
    onnx.save(merged, tmp_path / "merged.onnx")
    model = load_model(str(path), adapter=str(tmp_path / "ad"))
    sparsity = f",blocking,lora-sparsity{{adapter={tmp_path / 'ad'}}},"
    pipeline = PLACE.format(opts="", context=32).replace(",blocking,", sparsity)
    program = compile_for_replay(model, replay_target, 3, 2, pipeline)
    details = next(r.details for r in program.records if r.name == "lora-sparsity")
    assert details["masked_b_tiles"] > 0
    got = replay_functional(program, replay_target, str(path), str(tmp_path / "ad"), prompt=PROMPT, generate=2)
    want = ort_greedy(tmp_path / "merged.onnx", PROMPT, 2)
    assert np.abs(got.logits - want).max() / np.abs(want).max() < 1e-5


def test_masks_read_from_one_adapter_are_refused_for_another(tmp_path, replay_target, adapters):
    """lora-sparsity takes its zero blocks from one adapter; a program serving a second adapter that holds
    values there would drop that adapter's update, so the replay refuses it, naming the directory."""
    from primal_compiler.ir.model import Role

    model = load_model(fixture(BASE), "q,v:8")
    write_adapter(tmp_path / "zq", model, zero=lambda layer, role, a, b: b.fill(0.0) if role == Role.Q else None)
    dirs = [str(tmp_path / "zq"), str(adapters[0])]
    pipeline = PLACE.format(opts="", context=32).replace(",blocking,", f",blocking,lora-sparsity{{adapter={dirs[0]}}},")
    program = compile_for_replay(load_model(fixture(BASE), adapter=dirs), replay_target, len(PROMPT), 2, pipeline,
                                 adapters=2)
    assert (program.tiles.zero == 1).any()
    with pytest.raises(InputError, match=r"adapters0/a: the program masks \d+ LoRA block\(s\) that this adapter"):
        replay_functional(program, replay_target, fixture(BASE), dirs, prompt=PROMPT, generate=2)
    alone = compile_for_replay(load_model(fixture(BASE), adapter=dirs[0]), replay_target, len(PROMPT), 2, pipeline)
    replay_functional(alone, replay_target, fixture(BASE), dirs[0], prompt=PROMPT, generate=2)  # its own zeros
