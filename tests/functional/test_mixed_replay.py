"""A batch that mixes adapters, replayed numerically: each sequence's tokens are those its adapter gives alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from primal_compiler.errors import InputError
from primal_compiler.frontend import load_model
from primal_compiler.functional import compile_for_replay, replay_functional
from primal_compiler.isa.opcodes import Opcode
from primal_compiler.isa.stream import Stream
from tests.frontend.test_weights import write_adapter
from tests.functional.conftest import fixture

PROMPT = [1, 2, 3]
BASE = "llama_dynamo"
GENERATE = 4


@pytest.fixture(scope="module")
def adapters(tmp_path_factory) -> list[Path]:
    """Three q,v r8 adapters that decode differently (the second's and third's factors are -3 and 5 times the
    first's)."""
    root = tmp_path_factory.mktemp("mixed")
    model = load_model(fixture(BASE), "q,v:8")
    dirs = [root / name for name in "abc"]
    for d, scale in zip(dirs, (1, -3, 5), strict=True):
        write_adapter(d, model)
        weights = d / "adapter_model.safetensors"
        save_file({k: v * np.float32(scale) for k, v in load_file(str(weights)).items()}, str(weights),
                  metadata={"format": "pt"})
    return dirs


def _compile(target, dirs, requests: str, batch: int, pipeline: bool = True):
    model = load_model(fixture(BASE), adapter=[str(d) for d in dirs])
    spec = (f"lower-tiles,blocking,zcurve-order,kv-ring{{context=32,chunk_tokens=4,reserve_bytes=0,batch={batch}}},"
            f"codegen{{requests={requests},pipeline={'true' if pipeline else 'false'}}},srpg")
    return compile_for_replay(model, target, len(PROMPT), GENERATE, spec, adapters=len(dirs))


def _run(program, target, dirs):
    return replay_functional(program, target, fixture(BASE), [str(d) for d in dirs], prompt=PROMPT,
                             generate=GENERATE)


@pytest.fixture(scope="module")
def alone(replay_target, adapters) -> list[list[int]]:
    """Each adapter's tokens on its own: batch 1, one request."""
    return [_run(_compile(replay_target, adapters, str(k), 1), replay_target, adapters).tokens for k in range(3)]


def test_each_sequence_of_a_mixed_batch_decodes_as_its_adapter_alone(replay_target, adapters, alone):
    assert len({tuple(t) for t in alone}) == 3  # the adapters matter
    program = _compile(replay_target, adapters, "2+0+1", 3)
    result = _run(program, replay_target, adapters)
    assert result.sequence_tokens == [[alone[2], alone[0], alone[1]]]
    rec = program.stream.records
    assert sorted(set((rec["arg"][rec["op"] == Opcode.CONFIG] >> 16).tolist())) == [0, 1, 2]  # rewritten per pass


def test_a_config_naming_the_wrong_adapter_changes_that_sequence_only(replay_target, adapters, alone):
    """The check fails when a slot holds another adapter: the CONFIGs before sequence 1's first decode pass
    load adapter 2 instead of 0, and its tokens follow."""
    program = _compile(replay_target, adapters, "2+0+1", 3)
    stream = program.stream
    rec = stream.records.copy()
    dec = next(s for s in stream.sections if s.name == "decode:0")
    cfg = dec.start + np.flatnonzero(rec["op"][dec.start : dec.stop] == Opcode.CONFIG)
    first_of_0 = cfg[(rec["arg"][cfg] >> 16) == 0]
    rec["arg"][first_of_0] = (2 << 16) | (rec["arg"][first_of_0] & 0xFFFF)  # every rewrite to adapter 0 loads 2
    swapped = program.evolve(stream=Stream(rec, stream.group_ptr, stream.group_ct, stream.group_pe, stream.sections))
    result = _run(swapped, replay_target, adapters)
    tokens = result.sequence_tokens[0]
    assert tokens[0] == alone[2] and tokens[2] == alone[1]
    assert tokens[1] != alone[0]


def test_a_pass_of_several_sequences_is_refused_in_one_line(replay_target, adapters):
    program = _compile(replay_target, adapters[:1], "0", 2, pipeline=False)
    with pytest.raises(InputError, match="carrying several sequences in one pass; the functional replay runs a "
                                         "batch whose every pass carries one sequence"):
        _run(program, replay_target, adapters[:1])
