"""Replayed shapes: the four starts, the policies' effects, and the simulation of a shape's own three requests
against the replay of its whole stream."""

from __future__ import annotations

import numpy as np
import pytest

from primal_compiler import compiled
from primal_compiler.executor.metrics import metrics
from primal_compiler.executor.replay import replay
from primal_compiler.frontend import load_model
from primal_compiler.ir.program import Program
from primal_compiler.isa.opcodes import step_ends
from primal_compiler.passmgr import PassManager, parse_pipeline, print_pipeline
from primal_compiler.serve.costs import CostTable, Policy, tail
from primal_compiler.serve.sim import simulate
from primal_compiler.serve.trace import Trace

CONTEXT = 64


@pytest.fixture(scope="module")
def placed(small_target):
    return PassManager(parse_pipeline("lower-tiles,blocking,zcurve-order")).run(
        Program(model=load_model("tiny-llama", "q,v:8")), small_target)


@pytest.fixture(scope="module")
def tables(placed, small_target):
    return {name: CostTable(placed, small_target, CONTEXT, policy) for name, policy in (
        ("default", Policy()), ("no-prefetch", Policy(prefetch=False)), ("no-sparse", Policy(sparse=False)))}


def test_a_switch_never_starts_sooner_than_the_same_start_without_one(tables):
    for table in tables.values():
        s = table.shape(1, 16)
        assert s.start_s["idle_switch"] >= s.start_s["idle_same"] > 0
        assert s.start_s["b2b_switch"] >= s.start_s["b2b_same"] > 0
        assert s.start_j["idle_switch"] > s.start_j["idle_same"] > 0
        assert s.step_s > 0 and s.step_j > 0
    assert tables["default"].idle_w > 0


def test_block_sparse_encoding_writes_only_the_non_zero_blocks(tables):
    sparse, dense = tables["default"].shape(1, 16), tables["no-sparse"].shape(1, 16)
    assert sparse.config_bytes < dense.config_bytes and 0 < sparse.config_s < dense.config_s
    assert sparse.config_bytes / dense.config_bytes == pytest.approx(1 - 0.245, abs=0.05)
    assert (sparse.start_j["idle_switch"] - sparse.start_j["idle_same"]
            < dense.start_j["idle_switch"] - dense.start_j["idle_same"])  # fewer bytes written, fewer joules


def test_the_shape_is_the_replay_of_its_tail(tables, placed, small_target):
    table = tables["default"]
    s = table.shape(1, 16)
    assert s.tail == print_pipeline(tail(table.policy, CONTEXT, 1, 16))
    program = PassManager(parse_pipeline(s.tail)).run(placed, small_target)
    meta, arrays = compiled.program_file(program, small_target)
    m = metrics(replay(meta, arrays, program.need_stream(), small_target), 0)
    assert s.start_s["idle_switch"] == pytest.approx(m["ttft_s"], rel=1e-12)  # request 0: the run report's TTFT


def test_simulating_a_shapes_own_requests_reproduces_its_replay(tables, placed, small_target):
    """Three requests arriving together, as the shape program serves them (adapter 0, then 1, then 1 again,
    16-token prompts, 3 tokens each): the simulation composes them from the shape's figures, the replay of
    the whole stream times them directly; first tokens agree within 2%."""
    table = tables["default"]
    s = table.shape(1, 16)
    program = PassManager(parse_pipeline(s.tail)).run(placed, small_target)
    meta, arrays = compiled.program_file(program, small_target)
    rp = replay(meta, arrays, program.need_stream(), small_target)
    r = rp.stream.records
    firsts = []
    for k in range(3):
        sec = rp.section(f"prefill:{k}")
        firsts.append(rp.seconds(int(rp.finish[sec[step_ends(r[sec])]].max())))
    t0 = rp.seconds(int(rp.start[rp.section("adapter:0")].min()))
    trace = Trace(np.zeros(3), np.array([0, 1, 1]), np.full(3, 16), np.full(3, 3), ("A", "B"), np.full(3, -1),
                  np.zeros(3, np.int64))
    table.shapes.setdefault((1, 32, 0, ""), s)  # price the decode steps (positions 16-17, bucket 32) as replayed: at 16
    run = simulate(trace, table)
    np.testing.assert_allclose(run["first_token_s"], np.array(firsts) - t0, rtol=0.02)
