"""KV bank conflicts: the DMAC cost rule against a cycle-stepped model of lanes reading scratchpad banks.

The simulator is independent of ``costs.dmac_cycles``: lock-step lanes each read bank words of their own
token through a two-word buffer (asking for the next word while consuming the current one, an element a
cycle); every bank serves one request a cycle, oldest first. The closed form must match it (within the
first word round, which nothing overlaps), and the replayed DMAC time and KV storage utilisation must follow the kv-ring's
recorded layout.
"""

from __future__ import annotations

import numpy as np
import pytest

from primal_compiler.api import compile_model
from primal_compiler.compiled import program_file
from primal_compiler.executor import costs
from primal_compiler.executor.replay import replay
from primal_compiler.frontend import load_model
from primal_compiler.isa.opcodes import RECORD, Opcode
from primal_compiler.target import load_target, with_overrides


def simulate(lanes: int, banks: int, words_per_token: int, elements: int, layout: str, words: int,
             buffer: int) -> int:
    """Cycles until every lane has consumed ``words`` words (``elements`` elements each) of its token.

    The lanes are in lock-step (QK broadcasts one query element to every lane each cycle; PV adds the
    lanes' products of one value element in one tree): a cycle consumes an element only when every lane
    holds its word. Each lane asks for its next words while it consumes (at most ``buffer`` words held,
    being consumed or on the way); each bank serves one request a cycle, oldest first; a word served is usable the next cycle.
    """
    bank_of = (lambda u, w: u % banks) if layout == "token" else (lambda u, w: (u * words_per_token + w) % banks)
    asked = [0] * lanes  # words requested
    held = [0] * lanes  # words delivered and not yet started
    queue: list[list[tuple[int, int]]] = [[] for _ in range(banks)]  # (asked at cycle, lane)
    done, left, cycle = 0, 0, 0  # words every lane has consumed; elements left of the current word
    while done < words:
        for u in range(lanes):
            if asked[u] < words and asked[u] - done < buffer:
                queue[bank_of(u, asked[u])].append((cycle, u))
                asked[u] += 1
        served = []
        for q in queue:
            if q:
                q.sort()
                served.append(q.pop(0)[1])
        if left == 0 and all(held):  # every lane starts its next word together
            held = [h - 1 for h in held]
            left = elements
        if left:
            left -= 1
            done += left == 0
        for u in served:
            held[u] += 1
        cycle += 1
    return cycle


@pytest.mark.parametrize("banks, width, units, head_bytes", [(8, 64, 16, 256), (8, 64, 8, 256), (4, 64, 16, 256),
                                                               (8, 128, 16, 256), (8, 64, 16, 96), (16, 32, 16, 256)])
@pytest.mark.parametrize("layout", ["token", "word"])
@pytest.mark.parametrize("buffer", [1, 2, 3])
def test_dmac_scratchpad_cycles_match_the_cycle_stepped_banks(banks, width, units, head_bytes, layout, buffer):
    target = with_overrides(load_target("primal-7nm"), {
        "router.scratchpad_banks": banks, "router.scratchpad_bank_width_bits": width, "router.dmac_units": units,
        "router.dmac_lane_buffer_words": buffer})
    kv = {"interleave": layout, "head_dim": head_bytes // 2, "kv_bytes": 2}
    elements, words_per_token = width // target.router.dmac_bits, head_bytes * 8 // width
    ctx = costs.Ctx(target, None, np.zeros(2, RECORD), None, None, *[np.zeros(0, np.int64)] * 4,
                    costs.bank_lanes(target, kv))
    for words in (48, 96):
        ctx.records["count"] = units * words * elements  # every lane reads `words` words of its token
        _, storage = costs.dmac_cycles(ctx, np.arange(1))
        sim = simulate(units, banks, words_per_token, elements, layout, words, buffer)
        compute = words * elements
        assert max(compute, int(storage[0])) <= sim <= max(compute, int(storage[0])) + units + elements, (words, sim)
    steady = (simulate(units, banks, words_per_token, elements, layout, 96, buffer)
              - simulate(units, banks, words_per_token, elements, layout, 48, buffer)) / 48
    _, s96 = costs.dmac_cycles(ctx, np.arange(1))
    ctx.records["count"] = units * 48 * elements
    _, s48 = costs.dmac_cycles(ctx, np.arange(1))
    assert max(elements, (int(s96[0]) - int(s48[0])) / 48) == pytest.approx(steady, abs=1 / 48)


def test_the_seeds_interleave_is_conflict_free_and_contiguous_chunks_are_not():
    target = load_target("primal-7nm")
    llama = {"head_dim": 128, "kv_bytes": 2}
    assert costs.bank_lanes(target, {"interleave": "token", **llama}) == 2  # 16 lanes over 8 banks
    assert costs.bank_lanes(target, {"interleave": "word", **llama}) == 16  # a 256-byte head is 32 words: one bank
    assert target.router.dmac_lane_buffer_words == 2


@pytest.fixture(scope="module")
def both(small_target):
    out = {}
    for layout in ("token", "word"):
        pipeline = f"lower-tiles,blocking,zcurve-order,kv-ring{{context=64,bank_interleave={layout}}},codegen,srpg"
        program = compile_model(load_model("tiny-llama", "q,v:8"), small_target, pipeline)
        meta, arrays = program_file(program, small_target)
        assert meta["kv"]["interleave"] == layout
        out[layout] = replay(meta, arrays, program.stream, small_target)
    return out


def test_replayed_dmacs_follow_the_recorded_layout(both):
    token, word = both["token"], both["word"]
    dmac = token.stream.records["op"] == Opcode.DMAC
    assert (token.stream.records == word.stream.records).all()
    # token: 2 lanes a bank, no stall; word: 16 lanes on one bank, a word round (4 + 16) / 2 = 10 cycles, not 4,
    # against the MACs alone (a PV record's softmax of its scores adds DMAC cycles but reads no KV)
    macs = -(-token.stream.records["count"][dmac].astype(np.int64) // token.target.router.dmac_macs_per_cycle)
    assert (word.busy[dmac] == np.maximum(token.busy[dmac], -(-macs * 5 // 2))).all()
    assert (word.busy[~dmac] == token.busy[~dmac]).all()
    rec = token.section("decode:0")
    used = {k: costs.kv_storage(v.ctx, rec) for k, v in both.items()}
    assert used["token"][0] == used["word"][0]
    assert used["token"][0] / used["token"][1] == pytest.approx(0.5, abs=0.01)  # DMAC-bound: half the banks' rate
    assert used["word"][0] / used["word"][1] == pytest.approx(0.2, abs=0.01)  # 2.5x the cycles for the same bytes
