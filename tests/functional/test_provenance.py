"""The producer log (``producers=True``): it mirrors every buffer and changes nothing the replay computes."""

from __future__ import annotations

import numpy as np

from primal_compiler.functional import replay_functional
from primal_compiler.functional.machine import Machine
from primal_compiler.functional.provenance import Provenance
from tests.functional.conftest import compiled, fixture

PROMPT = [3, 1, 4, 1, 5]


def test_the_log_mirrors_every_buffer_and_changes_no_logit(replay_target, monkeypatch):
    name = "llama_lora_qv_r4_torchscript"
    program = compiled(name, replay_target, len(PROMPT), 3)
    plain = replay_functional(program, replay_target, fixture(name), prompt=PROMPT, generate=3)
    steps = []
    end_step = Machine.end_step

    def check(m: Machine) -> None:  # before each ARGMAX drops the step's buffers
        for key, value in m.buffers.items():
            assert np.array_equal(m.log.buffers[key] < 0, np.isnan(value)), key
        steps.append(len(m.buffers))
        end_step(m)

    monkeypatch.setattr(Machine, "end_step", check)
    logged = replay_functional(program, replay_target, fixture(name), prompt=PROMPT, generate=3, producers=True)
    assert plain.producers is None and len(steps) == 3 and min(steps) > 0
    np.testing.assert_array_equal(logged.logits, plain.logits)
    assert logged.tokens == plain.tokens
    consumer, producer = logged.producers
    assert consumer.dtype == producer.dtype == np.int64 and (producer < consumer).all()
    key = consumer * len(program.stream.records) + producer
    assert (np.diff(key) > 0).all()  # distinct pairs, by consumer then producer


def test_a_replaced_or_widened_buffer_keeps_the_producers_of_what_it_keeps():
    log, key = Provenance(100), (0, 3, 0x1000)
    log.wrote(key, (2, 4), False, 0, 4, 7)
    log.wrote(key, (2, 8), True, 6, 8, 9)  # widened: elements 4 and 5 unwritten
    assert log.buffers[key].tolist() == [[7, 7, 7, 7, -1, -1, 9, 9]] * 2
    log.wrote(key, (1, 3), False, 1, 3, 12)  # another number of vectors: replaced
    assert log.buffers[key].tolist() == [[-1, 12, 12]]
    log.consumed(20, log.buffers[key])
    log.consumed(20, np.array([12, 7]))
    log.consumed(21, log.latest(("mask", 0, 3), ("mask", 0, 3, 1)))  # nothing wrote it: no pair
    log.state[("mask", 0, 3)], log.state[("mask", 0, 3, 1)] = 5, 8
    log.consumed(22, log.latest(("mask", 0, 3), ("mask", 0, 3, 1)))
    assert [a.tolist() for a in log.pairs()] == [[20, 20, 22], [7, 12, 8]]
