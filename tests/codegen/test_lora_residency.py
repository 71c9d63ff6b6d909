"""LoRA residency (codegen{lora_residency}): resident adapters load once per request; per-token ones are
rewritten at every pass, each layer's writes pipelined behind the previous layer by srpg, zero blocks never
written. The effects on time and energy are measured by the replay, and absent when the adapters stay."""

from __future__ import annotations

import numpy as np
import pytest

from primal_compiler.api import compile_model
from primal_compiler.codegen.check import check_configs, check_power
from primal_compiler.compiled import program_file
from primal_compiler.executor.metrics import metrics
from primal_compiler.executor.replay import replay
from primal_compiler.frontend import load_model
from primal_compiler.ir.tiles import Macro
from primal_compiler.isa.opcodes import REPROGRAM, Opcode, step_ends
from primal_compiler.passmgr import PassManager, parse_pipeline
from tests.functional.conftest import replay_target  # noqa: F401  (a fixture)

PLACE = "lower-tiles,blocking,zcurve-order"


@pytest.fixture(scope="module")
def placed(small_target):
    return compile_model(load_model("tiny-llama", "q,v:8"), small_target, PLACE)


def _program(placed, target, codegen: str, srpg: str = "srpg", sparsity: str = ""):
    tail = f"{sparsity}kv-ring{{context=64}},codegen{{steps=3{codegen}}}" + (f",{srpg}" if srpg else "")
    return PassManager(parse_pipeline(tail)).run(placed, target)


def _range(stream, name: str) -> np.ndarray:
    s = next(x for x in stream.sections if x.name == name)
    return np.arange(s.start, s.stop)


def _metrics(program, target) -> dict:
    meta, arrays = program_file(program, target)
    return metrics(replay(meta, arrays, program.need_stream(), target))


def test_per_token_rewrites_every_non_zero_tile_at_every_pass(placed, small_target):
    p = _program(placed, small_target, ",lora_residency=per-token", srpg="")
    rec, t = p.stream.records, p.need_tiles()
    lora = int(((t.macro == Macro.SRAM) & (t.zero != 1)).sum())
    passes = int(step_ends(rec).sum())  # one prefill pass and 3 decode steps
    config = rec["op"] == Opcode.CONFIG
    assert config.sum() == lora * passes and not config[_range(p.stream, "adapter:0")].any()
    barrier = (rec["op"] == Opcode.SYNC) & (rec["arg"] == REPROGRAM)
    assert barrier.sum() == passes
    check_configs(p.stream)


def test_srpg_pipelines_each_pass_behind_the_previous_layer_and_drops_its_barrier(placed, small_target):
    p = _program(placed, small_target, ",lora_residency=per-token")
    rec = p.stream.records
    assert not ((rec["op"] == Opcode.SYNC) & (rec["arg"] == REPROGRAM)).any()
    check_power(p.stream)
    check_configs(p.stream)
    dec = _range(p.stream, "decode:0")
    step = dec[: int(np.flatnonzero(step_ends(rec[dec]))[0]) + 1]  # the first decode step
    for n in range(1, p.model.num_layers):
        configs = step[(rec["op"][step] == Opcode.CONFIG) & (rec["layer"][step] == n)]
        previous = step[(rec["layer"][step] == n - 1) & (rec["op"][step] != Opcode.CONFIG)]
        assert len(configs) and configs.min() > previous.min()  # after layer n-1 of the same pass starts


def test_reprogramming_costs_time_and_energy_the_pipelining_hides_part_of_it(placed, small_target):
    resident = _metrics(_program(placed, small_target, ""), small_target)
    pipelined = _metrics(_program(placed, small_target, ",lora_residency=per-token"), small_target)
    serial = _metrics(_program(placed, small_target, ",lora_residency=per-token", "srpg{pipeline_config=false}"),
                      small_target)
    assert resident["itl_s"] < pipelined["itl_s"] < serial["itl_s"]
    by = "energy_per_token_by_component_j"
    assert pipelined[by]["sram_dcim"] > 2 * resident[by]["sram_dcim"]  # the writes, at every token


def test_zero_blocks_skip_the_rewrite_only_when_weights_are_rewritten(placed, small_target):
    sparse = "lora-sparsity{zero_fraction=0.5},"
    gain = {}
    for mode in ("", ",lora_residency=per-token"):
        dense = _metrics(_program(placed, small_target, mode), small_target)
        skipped = _metrics(_program(placed, small_target, mode, sparsity=sparse), small_target)
        gain[mode] = skipped["tokens_per_s"] / dense["tokens_per_s"] - 1
    assert gain[",lora_residency=per-token"] > 0.01
    assert abs(gain[""]) < 0.005


@pytest.mark.parametrize("srpg", ["srpg", "srpg{pipeline_config=false}"])
def test_a_per_token_program_computes_what_onnxruntime_does(replay_target, srpg):  # noqa: F811
    """The functional replay follows the stream's data flow: a layer that computed before its pass's writes
    landed, or with another layer's weights, would not match."""
    from primal_compiler.functional import compile_for_replay, replay_functional
    from tests.functional.conftest import fixture
    from tests.functional.reference import ort_greedy

    name, prompt = "llama_lora_qkvo_r8_dynamo", [3, 1, 4, 1, 5]
    pipeline = ("lower-tiles,blocking,zcurve-order,kv-ring{context=32,chunk_tokens=4,reserve_bytes=0},"
                f"codegen{{lora_residency=per-token}},{srpg}")
    program = compile_for_replay(load_model(fixture(name)), replay_target, len(prompt), 3, pipeline)
    assert (program.stream.records["op"] == Opcode.CONFIG).sum() > 0
    result = replay_functional(program, replay_target, fixture(name), prompt=prompt, generate=3)
    want = ort_greedy(fixture(name), prompt, 3)
    assert np.abs(result.logits - want).max() / np.abs(want).max() < 1e-5  # as tests/functional/test_exact.py
    assert result.tokens == [int(t) for t in want.argmax(axis=1)]


def test_resident_weights_on_a_target_that_drops_sram_when_gated_are_refused(placed, small_target):
    from primal_compiler.errors import InputError
    from primal_compiler.target import with_overrides

    forgetful = with_overrides(small_target, {"power_gating.retain_sram": False})
    with pytest.raises(InputError, match=r"pass srpg: LoRA weights kept resident .* lost when a CT is gated"):
        _program(placed, forgetful, "")
    assert _program(placed, forgetful, ",lora_residency=per-token").stream  # rewritten before every use
    assert _program(placed, forgetful, "", "srpg{gating=false}").stream
