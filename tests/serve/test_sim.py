"""The request simulation against a schedule computed by hand from a made-up cost table."""

from __future__ import annotations

import math

import numpy as np
import pytest

from primal_compiler.serve.costs import Policy, Shape
from primal_compiler.serve.sim import batch_size, bucket, simulate
from primal_compiler.serve.trace import Trace


class Table:
    """A stand-in cost table: the same starts for every shape, decode steps slower in larger batches."""

    def __init__(self, max_batch: int = 1, idle_w: float = 0.5, slots: int = 8, save: bool = True,
                 batching: str = "same-adapter", sram_slots: int = 1) -> None:
        self.policy = Policy(max_batch=max_batch, context_save=save, batching=batching)
        self.context, self.idle_w = 64, idle_w
        self.shapes: dict[tuple[int, ...], Shape] = {}
        self.slots, self.sram_slots = slots, sram_slots

    def shape(self, batch: int, bucket_: int, adapter: int = 0, history: int = 0, adapters: int = 1,
              sample: bool = False) -> Shape:
        """Each adapter past the first adds 2 s to a decode step (its rewrite between passes)."""
        s = Shape(batch, bucket_, history, adapters,
                  {"idle_switch": 10.0, "b2b_switch": 8.0, "b2b_same": 5.0, "idle_same": 5.0},
                  {"idle_switch": 100.0, "b2b_switch": 80.0, "b2b_same": 50.0, "idle_same": 50.0},
                  1.0 + 0.5 * (batch - 1) + 2.0 * (adapters - 1), 2.0 * batch, 0, 4.0, "")
        self.shapes[(batch, bucket_) + ((history,) if history else ()) + ((adapters,) if adapters > 1 else ())] = s
        return s


def trace(rows, talks=None) -> Trace:
    """Requests (arrival, adapter, prompt, generate); ``talks``: each one's conversation (-1: none)."""
    a, k, p, g = zip(*rows)
    c = np.array(talks if talks is not None else [-1] * len(rows), np.int64)
    history = np.zeros(len(rows), np.int64)
    for i in range(len(rows)):
        earlier = [j for j in range(i) if c[j] == c[i] >= 0]
        history[i] = sum(p[j] + g[j] for j in earlier)
    return Trace(np.array(a, float), np.array(k), np.array(p), np.array(g), ("A", "B"), c, history)


def test_buckets_and_batch_sizes():
    assert [bucket(t, 64) for t in (1, 2, 10, 16, 17, 63, 64)] == [1, 2, 16, 16, 32, 63, 63]
    assert [batch_size(n, 8) for n in (1, 2, 3, 5, 8)] == [1, 2, 4, 8, 8]
    assert batch_size(3, 3) == 3 and batch_size(5, 6) == 6


def test_cold_warm_and_same_adapter_starts_by_hand():
    t = trace([(0.0, 0, 10, 3), (1.0, 1, 10, 2), (100.0, 1, 10, 1), (200.0, 0, 10, 1)])
    run = simulate(t, Table())
    # r0 cold switch: first token at 10, then 2 steps of 1 s; r1 waited: warm switch at 12, first at 20, ends 21;
    # r2 arrives on an idle machine with B loaded: first at 105; r3 switches back to A cold: first at 210
    np.testing.assert_allclose(run["first_token_s"], [10, 20, 105, 210])
    np.testing.assert_allclose(run["finish_s"], [12, 21, 105, 210])
    np.testing.assert_allclose(run["start_s"], [0, 12, 100, 200])
    assert list(run["switched"]) == [1, 2, 0, 1]
    assert run["itl_s"][0] == 1.0 and math.isnan(run["itl_s"][2])
    e = run["energy_j"]
    assert e["reconfiguration"] == pytest.approx(50 + 30 + 50)  # each switch's start less the same start
    assert e["prefill"] == pytest.approx(4 * 50)
    assert e["decode"] == pytest.approx(2 * 2.0 + 1 * 2.0)
    assert e["idle"] == pytest.approx(0.5 * ((100 - 21) + (200 - 105)))
    assert run["reconfig_s"] == pytest.approx(5 + 3 + 5) and run["config_s"] == pytest.approx(3 * 4.0)


def test_batching_takes_waiting_requests_of_one_adapter_oldest_first():
    t = trace([(0.0, 0, 10, 2), (0.1, 0, 20, 3), (0.2, 1, 10, 2), (0.3, 0, 40, 2), (0.4, 0, 10, 2)])
    table = Table(max_batch=2)
    run = simulate(t, table)
    # batch 0: r0 alone; at 11 s r1..r4 wait: batch 1 = r1, r3 (A, oldest first), then r2 (B), then r4 (A)
    assert list(run["batch"]) == [0, 1, 2, 1, 3]
    assert (2, bucket(40, 64)) in table.shapes  # the pair's prefill shape: its longest prompt
    assert (2, bucket(40 + 2 - 1, 64)) in table.shapes  # its decode: the largest prompt + generation - 1
    first = run["first_token_s"]
    assert first[1] == first[3] == pytest.approx(11 + 5)  # back to back, A still loaded
    step = 1.5  # the batch of 2's decode step
    assert run["finish_s"][1] == pytest.approx(16 + 2 * step) and run["finish_s"][3] == pytest.approx(16 + step)
    assert first[2] == pytest.approx(16 + 2 * step + 8)  # then B, waiting: a warm switch


def test_a_returning_turn_resumes_its_saved_context_by_hand():
    """c0's second turn (history 13: 10 prompt + 3 generated) finds 12 tokens saved (the last generated one
    was never embedded): it prefills 1 + 5 = 6 tokens (bucket 8) after 12 saved (history bucket 16)."""
    t = trace([(0.0, 0, 10, 3), (100.0, 0, 5, 2)], talks=[0, 0])
    table = Table()
    run = simulate(t, table)
    assert list(run["saved_tokens"]) == [0, 12]
    assert [k for k in table.shapes if len(k) == 3] == [(1, 8, 16)]
    assert sorted(table.shapes) == [(1, 8, 16), (1, 16), (1, 32)]  # decode at 13 + 5 + 2 - 1 = 19: bucket 32
    off = Table(save=False)
    run_off = simulate(t, off)
    assert list(run_off["saved_tokens"]) == [0, 0]
    assert sorted(off.shapes) == [(1, 16), (1, 32)]  # the whole history and prompt again: 18 tokens, bucket 32


def test_the_least_recently_used_saved_context_gives_its_slot_up():
    rows = [(0.0, 0, 10, 2), (50.0, 0, 10, 2), (100.0, 0, 4, 2), (150.0, 0, 4, 2)]
    t = trace(rows, talks=[0, 1, 0, 1])
    one = simulate(t, Table(slots=1))
    assert list(one["saved_tokens"]) == [0, 0, 0, 0] and one["evictions"] == 3
    two = simulate(t, Table(slots=2))
    assert list(two["saved_tokens"]) == [0, 0, 11, 11] and two["evictions"] == 0


def test_eviction_takes_the_least_recently_used_not_the_first_saved():
    """c0, c1, then c0 again (c1 is now least recently used); c2 needs a slot of two: c1's goes, c0 resumes.
    Evicting the first saved (c0) or the most recent would give c0's third turn nothing."""
    rows = [(0.0, 0, 10, 2), (50.0, 0, 10, 2), (100.0, 0, 4, 2), (150.0, 0, 10, 2), (200.0, 0, 4, 2),
            (250.0, 0, 4, 2)]
    run = simulate(trace(rows, talks=[0, 1, 0, 2, 0, 1]), Table(slots=2))
    assert list(run["saved_tokens"]) == [0, 0, 11, 0, 17, 0]
    assert run["evictions"] == 2  # c1 for c2, then c2 (least recent of c0, c2) for c1


def test_a_padded_lane_takes_a_slot_too():
    """Three new conversations run as the batch-4 program, whose fourth lane writes a slot: with 4 slots,
    c9's saved cache is given up and its next turn prefills everything."""
    rows = [(0.0, 0, 10, 2), (1.0, 0, 4, 2), (2.0, 0, 4, 2), (3.0, 0, 4, 2), (100.0, 0, 4, 2)]
    run = simulate(trace(rows, talks=[9, 0, 1, 2, 9]), Table(max_batch=4, slots=4))
    assert list(run["batch"]) == [0, 1, 1, 1, 2]
    assert list(run["saved_tokens"]) == [0, 0, 0, 0, 0] and run["evictions"] == 1
    five = simulate(trace(rows, talks=[9, 0, 1, 2, 9]), Table(max_batch=4, slots=5))
    assert list(five["saved_tokens"]) == [0, 0, 0, 0, 11] and five["evictions"] == 0


def test_a_batch_holds_one_turn_per_conversation_and_resumes_all_or_none():
    # r0 (c0) runs alone; meanwhile r1 (c0's next turn, resumable), r2 (c1, new) and r3 (c0 again) wait
    rows = [(0.0, 0, 10, 2), (1.0, 0, 4, 2), (2.0, 0, 4, 2), (3.0, 0, 4, 2)]
    run = simulate(trace(rows, talks=[0, 0, 1, 0]), Table(max_batch=4))
    assert list(run["batch"]) == [0, 1, 2, 3]  # r2 is not resuming, r3 is c0's next turn after r1
    assert list(run["saved_tokens"]) == [0, 11, 0, 17]  # after r1, c0 holds 12 + 4 + 2 - 1 tokens


def test_a_passed_over_turn_keeps_its_conversations_later_turns_out():
    """At 11 s r1 (c1, new) heads the queue; r2 (c0, resumable) is passed over, so r3 (c0's next turn, not
    yet resumable) must not run before it."""
    rows = [(0.0, 0, 10, 2), (1.0, 0, 4, 2), (2.0, 0, 4, 2), (3.0, 0, 4, 2)]
    run = simulate(trace(rows, talks=[0, 1, 0, 0]), Table(max_batch=4))
    assert list(run["batch"]) == [0, 1, 2, 3]
    assert list(run["saved_tokens"]) == [0, 0, 11, 17]
    assert run["start_s"][2] < run["start_s"][3]


def test_a_batch_is_drawn_from_the_oldest_waiting_requests_only():
    """32 conversations' first turns run; while a long request holds the machine, a new request X, their 32
    resumable second turns and a new request Y arrive. X leads; Y would join it, but it is the 34th waiting
    and a batch of at most 2 looks at the 16 x 2 oldest."""
    firsts = [(float(i), 0, 4, 1) for i in range(32)]
    rows = firsts + [(999.0, 0, 4, 50), (1000.0, 0, 4, 1)] + [(1000.1 + i / 100, 0, 4, 1) for i in range(32)] + \
        [(1001.0, 0, 4, 1)]
    talks = list(range(32)) + [-1, 100] + list(range(32)) + [101]
    run = simulate(trace(rows, talks=talks), Table(max_batch=2, slots=40))
    x, y = 33, len(rows) - 1
    assert run["saved_tokens"][34:y].min() == 4  # every second turn resumes
    assert run["batch"][y] != run["batch"][x] and list(run["batch"]).count(run["batch"][x]) == 1


def test_mixed_batching_takes_the_oldest_whatever_their_adapters_by_hand():
    t = trace([(0.0, 0, 10, 2), (0.1, 0, 20, 3), (0.2, 1, 10, 2), (0.3, 0, 40, 2), (0.4, 1, 10, 2)])
    table = Table(max_batch=2, batching="mixed")
    run = simulate(t, table)
    # batch 0: r0 alone (A); at 11 s: r1 (A) and r2 (B) together, then r3 (A) and r4 (B)
    assert list(run["batch"]) == [0, 1, 1, 2, 2]
    step = 1.5 + 2.0  # a batch of 2 on 2 adapters
    first = run["first_token_s"]
    assert first[1] == first[2] == pytest.approx(11 + 8)  # {A, B} differs from {A}: a warm switch
    assert run["finish_s"][1] == pytest.approx(19 + 2 * step)  # r1's 3 tokens: two steps after its first
    assert first[3] == pytest.approx(19 + 2 * step + 5)  # {A, B} again: no switch
    assert run["max_adapters_per_batch"] == 2
    assert run["decode_exposed_s"] == pytest.approx(2 * 2.0 + 1 * 2.0)  # steps x what the second adapter adds
    assert run["batch_log"]["adapter"] == [(0,), (0, 1), (0, 1)]


def test_resident_batching_never_takes_more_adapters_than_slots_and_prefers_those_held():
    rows = [(0.0, 0, 10, 2), (0.1, 1, 10, 2), (0.2, 2, 10, 2), (0.3, 0, 10, 2), (0.4, 2, 10, 2), (0.5, 1, 10, 2)]
    t = trace(rows)
    t = Trace(t.arrival_s, t.adapter, t.prompt, t.generate, ("A", "B", "C"), t.conversation, t.history)
    run = simulate(t, Table(max_batch=4, batching="resident", sram_slots=2))
    # batch 0: r0 alone on A. Then all wait; r1 leads on B. First scan (adapters taken or held: B, A): r3 (A) and
    # r5 (B) join, r2 and r4 (C) do not; second scan (any, at most 2 adapters): C would be a third. Then r2, r4.
    assert list(run["batch"]) == [0, 1, 2, 1, 2, 1]
    assert run["max_adapters_per_batch"] == 2 and run["decode_exposed_s"] == pytest.approx(2.0 * 1)
    one = simulate(t, Table(max_batch=4, batching="resident", sram_slots=1))
    assert one["max_adapters_per_batch"] == 1 and one["decode_exposed_s"] == 0.0


def test_a_batching_policy_is_one_of_three():
    with pytest.raises(ValueError, match="batching must be one of mixed, same-adapter, resident, got 'fifo'"):
        Policy(batching="fifo")


def test_an_adapter_still_in_a_slot_needs_no_switch():
    """Two slots: A, then B (A stays in its slot), then A again starts without a switch; then C evicts the
    least recently used (B), so A after it starts without a switch too; with one slot every change switches."""
    t = trace([(0.0, 0, 10, 1), (100.0, 1, 10, 1), (200.0, 0, 10, 1), (300.0, 2, 10, 1), (400.0, 0, 10, 1)])
    t = Trace(t.arrival_s, np.array([0, 1, 0, 2, 0]), t.prompt, t.generate, ("A", "B", "C"), t.conversation, t.history)
    run = simulate(t, Table(batching="resident", sram_slots=2))
    assert list(run["switched"]) == [1, 1, 0, 1, 0]
    one = simulate(t, Table(batching="resident", sram_slots=1))
    assert list(one["switched"]) == [1, 1, 1, 1, 1]
