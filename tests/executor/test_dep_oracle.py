"""The executor's dependency graph is complete: an independent oracle, the functional replay's value flow.

The functional replay (``producers=True``) logs, element by element, which record produced every value
each record consumed: buffer elements, KV token rows, SRAM slots, mask bits, the controller's token. Every
such producer must be an ancestor of its consumer in ``deps.predecessors`` (else a scheduler following the
graph may run the consumer first), and every prefill record must feed some ARGMAX of its request (else
the graph lost the path from it to an output, or the record is dead code). A dropped edge is caught.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import pytest

from primal_compiler.executor.ancestry import ancestors, argmax_records, dead_records, missing_producers
from primal_compiler.executor.deps import predecessors
from primal_compiler.frontend import load_model
from primal_compiler.functional import compile_for_replay, replay_functional
from primal_compiler.isa.opcodes import CONTROLLER, NONE16, ActFn, Opcode, buf_name, empty
from primal_compiler.isa.stream import Section, Stream
from tests.functional.conftest import PLACE, compiled, fixture, replay_target  # noqa: F401  (replay_target: a fixture)

MASKED = "+masked"  # a case name's suffix: lora-sparsity masks half the LoRA tiles (MASK, skipped SMAC_SRAM)
CHUNKED = "+chunked"  # a case name's suffix: the prompt streams through the layers in 4-token chunks
CASES = ["llama_dynamo", "llama_lora_qv_r4_torchscript", "mistral_dynamo", "mistral_lora_qv_r2_dynamo",
         "gpt2_dynamo", "gpt2_lora_cattn_r4_dynamo", "opt_dynamo", "opt_lora_qv_r4_optimum",
         "llama_lora_qv_r4_torchscript" + MASKED, "gpt2_lora_cattn_r4_dynamo" + MASKED,
         "llama_lora_qv_r4_torchscript" + CHUNKED, "gpt2_dynamo" + CHUNKED]
PROMPT = [3, 1, 4, 1, 5, 9]  # fills one 4-token KV chunk and half the next, which the decode steps complete
GENERATE = 3


@dataclass(frozen=True)
class Traced:
    stream: Stream
    ptr: np.ndarray
    pred: np.ndarray
    consumer: np.ndarray
    producer: np.ndarray


@pytest.fixture(scope="module")
def traced(replay_target):  # noqa: F811
    """``traced(case)``: the case compiled and replayed once, with its graph and value flow."""
    done: dict[str, Traced] = {}

    def get(case: str) -> Traced:
        if case not in done:
            name = case.removesuffix(MASKED).removesuffix(CHUNKED)
            if name == case:
                program = compiled(name, replay_target, len(PROMPT), GENERATE)
            elif case.endswith(CHUNKED):
                pipeline = PLACE.format(opts="", context=32).replace("codegen", "codegen{prefill_chunk=4}")
                program = compile_for_replay(load_model(fixture(name)), replay_target, len(PROMPT), GENERATE, pipeline)
            else:
                sparse = "lower-tiles,lora-sparsity{zero_fraction=0.5},"
                pipeline = PLACE.format(opts="", context=32).replace("lower-tiles,", sparse, 1)
                program = compile_for_replay(load_model(fixture(name)), replay_target, len(PROMPT), GENERATE, pipeline)
            result = replay_functional(program, replay_target, fixture(name), prompt=PROMPT, generate=GENERATE,
                                       producers=True)
            done[case] = Traced(program.stream, *predecessors(program.stream), *result.producers)
        return done[case]

    return get


def kind(stream: Stream, i: int) -> str:
    r = stream.records[i]
    return Opcode(r["op"]).name + (f".{ActFn(r['arg']).name}" if r["op"] == Opcode.ACT else "")


def describe(stream: Stream, i: int) -> str:
    r = stream.records[i]
    ct, dst_ct = ("ctl" if c == CONTROLLER else int(c) for c in (r["ct"], r["dst_ct"]))
    dst = "" if r["dst_ct"] == NONE16 else f" to ct={dst_ct} pe={r['dst_pe']}"
    section = next(s.name for s in stream.sections if s.start <= i < s.stop)
    return (f"record {i} {kind(stream, i)} ct={ct} pe={r['pe']}{dst} {buf_name(r['src_buf'])}->"
            f"{buf_name(r['dst_buf'])} ({section})")


def through(stream: Stream, producer: int) -> str:
    """What a producer's value reaches its consumer through: the buffer kind it writes, or the state."""
    r = stream.records[producer]
    if r["op"] == Opcode.ACT and r["arg"] == ActFn.ARGMAX:
        return "controller token"
    return "mask register" if r["op"] == Opcode.MASK else buf_name(r["dst_buf"]).partition(".")[0]


def missing_report(t: Traced, missing: np.ndarray) -> str:
    c, p = t.consumer[missing], t.producer[missing]
    counts = Counter((kind(t.stream, a), kind(t.stream, b), through(t.stream, b)) for a, b in zip(c, p))
    table = "\n".join(f"  {n:4d} x {a} <- {b} via {via}" for (a, b, via), n in counts.most_common())
    return (f"{len(missing)} of {len(t.consumer)} consumed values have a producer the graph does not order "
            f"first; first: consumer {describe(t.stream, c[0])} <- producer {describe(t.stream, p[0])}\n{table}")


@pytest.mark.parametrize("case", CASES)
def test_every_producer_is_an_ancestor_of_its_consumer(traced, case):
    t = traced(case)
    assert len(t.consumer) > len(t.stream.records)  # the replay logged its value flow
    masks = t.stream.records["op"][t.producer] == Opcode.MASK
    assert masks.any() == case.endswith(MASKED)  # masked blocks: the SMAC_SRAMs read the mask register
    missing = missing_producers(t.ptr, t.pred, t.consumer, t.producer)
    count = len(missing)
    assert count == 0, missing_report(t, missing)


@pytest.mark.parametrize("case", CASES)
def test_every_prefill_record_feeds_an_argmax_of_its_request(traced, case):
    t = traced(case)
    dead = dead_records(t.stream, t.ptr, t.pred)
    count, kinds = len(dead), Counter(kind(t.stream, i) for i in dead)
    assert count == 0, f"{count} prefill records feed no ARGMAX, first {describe(t.stream, dead[0])}: {dict(kinds)}"


def without_edge(ptr: np.ndarray, pred: np.ndarray, consumer: int, producer: int) -> tuple[np.ndarray, np.ndarray]:
    at = ptr[consumer] + np.flatnonzero(pred[ptr[consumer] : ptr[consumer + 1]] == producer)
    ptr = ptr.copy()
    ptr[consumer + 1 :] -= len(at)
    return ptr, np.delete(pred, at)


@pytest.mark.parametrize("across", [False, True], ids=["any", "across-steps"])
@pytest.mark.parametrize("case", CASES)
def test_a_dropped_edge_is_caught(traced, case, across):
    """Remove one edge the value flow needs and no other path replaces (the first such pair, or the first
    whose producer ran in an earlier step): the oracle names that pair, and only adds to what it named."""
    t = traced(case)
    before = set(missing_producers(t.ptr, t.pred, t.consumer, t.producer).tolist())
    step = np.cumsum(argmax_records(t.stream)) - argmax_records(t.stream)  # ARGMAXes before each record
    for j in np.flatnonzero(step[t.consumer] != step[t.producer]) if across else range(len(t.consumer)):
        c, p = int(t.consumer[j]), int(t.producer[j])
        if j in before or p not in t.pred[t.ptr[c] : t.ptr[c + 1]]:
            continue
        ptr, pred = without_edge(t.ptr, t.pred, c, p)
        if len(missing_producers(ptr, pred, [c], [p])):
            break
    else:
        pytest.fail("no edge of the graph is the only path from a producer to its consumer")
    after = set(missing_producers(ptr, pred, t.consumer, t.producer).tolist())
    assert j in after and before <= after
    assert not ancestors(ptr, pred, [c])[p] and ancestors(t.ptr, t.pred, [c])[p]


# --- ancestry.py on hand-made graphs ---------------------------------------------------------


def csr(preds: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    ptr = np.cumsum([0] + [len(p) for p in preds]).astype(np.int64)
    return ptr, np.array([q for p in preds for q in p], dtype=np.int64)


TINY = csr([[], [0], [0], [1], [2, 3], [], [5]])  # 0 -> 1 -> 3 -> 4 <- 2 <- 0; 5 -> 6


def test_ancestors_of_a_tiny_graph():
    ptr, pred = TINY
    assert np.flatnonzero(ancestors(ptr, pred, [4])).tolist() == [0, 1, 2, 3, 4]
    assert np.flatnonzero(ancestors(ptr, pred, [3, 6])).tolist() == [0, 1, 3, 5, 6]
    assert np.flatnonzero(ancestors(ptr, pred, [2])).tolist() == [0, 2]
    assert not ancestors(ptr, pred, np.zeros(0, np.int64)).any()


def test_missing_producers_of_a_tiny_graph():
    ptr, pred = TINY
    pairs = [(4, 0), (4, 5), (3, 2), (6, 5), (2, 2), (1, 3), (4, 1), (6, 0)]
    consumer, producer = (np.array(x) for x in zip(*pairs))
    assert missing_producers(ptr, pred, consumer, producer).tolist() == [1, 2, 4, 5, 7]
    assert missing_producers(ptr, pred, [], []).tolist() == []
    with pytest.raises(ValueError, match="record indices must be in 0..6"):
        missing_producers(ptr, pred, [7], [0])


def test_missing_producers_agrees_with_ancestors_on_random_graphs():
    """More than 64 consumers, so several bit batches; every answer checked against a per-pair sweep."""
    rng = np.random.default_rng(7)
    n = 300
    ptr, pred = csr([sorted(set(rng.integers(0, i, size=rng.integers(0, 3)).tolist())) if i else []
                     for i in range(n)])
    consumer = rng.integers(1, n, size=2000)
    producer = rng.integers(0, consumer)
    want = [j for j in range(len(consumer)) if not ancestors(ptr, pred, [consumer[j]])[producer[j]]]
    got = missing_producers(ptr, pred, consumer, producer)
    assert got.tolist() == want and 0 < len(want) < len(consumer)


def test_dead_records_of_a_tiny_stream():
    """Prefill 0..5, decode 6..8: 1 feeds only the decode (live), 2 nothing (dead), 3 is power gating."""
    rec = empty(9)
    rec["op"] = [Opcode.ACT, Opcode.KV_APPEND, Opcode.SMAC_RRAM, Opcode.PG_OFF, Opcode.UNICAST, Opcode.ACT,
                 Opcode.ACT, Opcode.DMAC, Opcode.ACT]
    rec["arg"] = [ActFn.EMBED, 0, 0, 0, 0, ActFn.ARGMAX, ActFn.EMBED, 0, ActFn.ARGMAX]
    rec["ct"] = [CONTROLLER, 0, 0, 0, 0, CONTROLLER, CONTROLLER, 0, CONTROLLER]
    stream = Stream(rec, np.zeros(1, np.int64), np.zeros(0, np.uint16), np.zeros(0, np.uint16),
                    (Section("prefill:0", 0, 6), Section("decode:0", 6, 9)))
    ptr, pred = csr([[], [0], [0], [], [0], [4], [5], [1, 6], [7]])
    assert dead_records(stream, ptr, pred).tolist() == [2]
    ptr, pred = csr([[], [0], [0], [], [0], [4], [5], [6], [7]])  # the decode's DMAC lost its KV edge
    assert dead_records(stream, ptr, pred).tolist() == [1, 2]
