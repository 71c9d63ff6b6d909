"""The served trace's Perfetto timeline: batches, adapter residency and every request's phases."""

from __future__ import annotations

import json

from primal_compiler.serve.perfetto import trace_json
from primal_compiler.serve.sim import simulate
from tests.serve.test_sim import Table, trace


def test_timeline_shows_each_batch_switch_and_request():
    t = trace([(0.0, 0, 10, 3), (1.0, 1, 10, 2), (100.0, 1, 10, 1), (200.0, 0, 10, 1)])
    run = simulate(t, Table())
    text = trace_json(t, run)
    assert text == trace_json(t, run)
    ev = json.loads(text)["traceEvents"]
    batches = [(e["name"], e["ts"], e["dur"]) for e in ev if e.get("pid") == 0 and e.get("tid") == 0 and e["ph"] == "X"]
    assert batches[:3] == [("switch cold -> A", 0.0, 5e6), ("prefill", 5e6, 5e6), ("decode", 10e6, 2e6)]
    assert ("switch warm -> B", 12e6, 3e6) in batches  # the warm switch's exposed 8 - 5 s
    residency = [(e["name"], e["ts"], e["dur"], e["args"]["batches"]) for e in ev if e.get("tid") == 1 and e["ph"] == "X"]
    assert residency == [("A", 0.0, 12e6, 1), ("B", 12e6, 105e6 - 12e6, 2), ("A", 200e6, 10e6, 1)]
    starts = [e for e in ev if e["ph"] == "b"]
    ends = [e for e in ev if e["ph"] == "e"]
    assert len(starts) == len(ends) and {e["id"] for e in starts} == {0, 1, 2, 3}
    r1 = {e["name"]: e["ts"] for e in starts if e["id"] == 1}
    assert r1 == {"queued": 1e6, "prefill": 12e6, "decode": 20e6}


def test_a_resumed_turns_prefill_is_labelled_so():
    t = trace([(0.0, 0, 10, 3), (100.0, 0, 5, 2)], talks=[0, 0])
    ev = json.loads(trace_json(t, simulate(t, Table())))["traceEvents"]
    phases = [(e["id"], e["name"]) for e in ev if e["ph"] == "b"]
    assert phases == [(0, "prefill"), (0, "decode"), (1, "prefill resumed"), (1, "decode")]  # neither waited
