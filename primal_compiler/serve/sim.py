"""Requests on one machine, batch after batch, timed and priced by replayed shapes (:mod:`.costs`).

The machine runs one batch at a time (static batching: a batch runs until
its longest generation ends). When it is free it takes the oldest waiting
request and, with batching, up to ``max_batch - 1`` more of the ``SCAN x
max_batch`` oldest waiting requests, oldest first, that the policy's
``batching`` admits (``same-adapter``: on the oldest's adapter; ``mixed``:
any; ``resident``: first those on an adapter the batch already takes or the
last batch left in the SRAM-DCIM slots, then any, never more adapters than
the slots, so no pass rewrites them) and that, like the oldest, resume a
saved context or do not (:mod:`.context`) and whose conversation has no
older turn still waiting (a conversation's turns run in order, one a
batch); with nothing waiting it idles until the next arrival. A batch of ``n`` runs as the program of the
smallest compiled batch size holding it (a power of two, or
``max_batch``); its prefill as the shape of the most tokens a member
prefills rounded up to a *bucket* (a power of two, at most the context
minus one) and, when it resumes, after the most saved tokens rounded up
the same way (at most what the context leaves after the bucket, so the
last prefilled position is at or past every member's); its decode steps as
the shape at the bucket of its longest history plus prompt plus generation
minus one (so every step is priced at a position at or past its own: more
attention work, never less).

A batch starts back to back (*warm*) when it was already waiting as the
previous batch ended, else on an idle machine (*cold*), and switches
adapters when its set of adapters differs from the last batch's and the
SRAM-DCIM slots do not hold them all (priced as loading all of them: an
upper bound when some are held); a batch on
``k`` adapters is priced by the shapes replayed on ``k`` (:mod:`.costs`), and
what its decode steps take beyond the same steps on one adapter is the
reprogramming they expose. Each of the four
cases has its own replayed time to the first tokens and energy
(:mod:`.costs`). A switch's exposed time and energy (the report's
reconfiguration) are its case's less the same start without a switch; the
rest is the prefill's. Each request's first token comes when the batch's
prefill ends; each later token one decode step after the one before.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np

from primal_compiler.errors import InputError
from primal_compiler.serve.context import SavedContexts, prefill_tokens
from primal_compiler.serve.costs import CostTable, Policy, Shape
from primal_compiler.serve.trace import Trace


SCAN = 16  # a batch is drawn from the 16 x max_batch oldest waiting requests it may take


def bucket(tokens: int, context: int) -> int:
    """The smallest power of two holding ``tokens``, at most ``context - 1``."""
    return min(1 << max(0, int(tokens - 1).bit_length()), context - 1)


def batch_size(n: int, max_batch: int) -> int:
    """The smallest compiled batch size holding ``n`` requests: a power of two, or ``max_batch``."""
    return min(1 << max(0, int(n - 1).bit_length()), max_batch)


def _members(queue: deque[int], trace: Trace, kv: SavedContexts, max_batch: int,
             fits: Callable[[list[int], int], bool] = lambda members, k: True,
             members: list[int] | None = None) -> list[int]:
    """The batch the head of ``queue`` leads (module docstring), added to ``members``; the rest stay in ``queue``,
    in order. ``fits(members, k)``: whether request ``k`` may join (the batching policy's rule).

    A conversation's turn passed over, or already a member, keeps every later turn of that conversation out of
    the batch, so turns run in their order, one a batch; the scan stops once the batch is full or
    ``SCAN x max_batch`` requests were looked at (so an overloaded queue costs no more per batch than a short
    one)."""
    members = [] if members is None else members
    blocked = {c for c in trace.conversation[members].tolist() if c >= 0}
    resumes = kv.saved(trace, members[0] if members else queue[0]) > 0
    rest: list[int] = []
    while queue and len(members) < max_batch and len(members) + len(rest) < SCAN * max_batch:
        k = queue.popleft()
        c = int(trace.conversation[k])
        if c not in blocked and (kv.saved(trace, k) > 0) == resumes and (not members or fits(members, k)):
            members.append(k)
        else:
            rest.append(k)
        if c >= 0:
            blocked.add(c)
    queue.extendleft(reversed(rest))
    return members


def _batch(policy: Policy, waiting: deque[int], by_adapter: dict[int, deque[int]], trace: Trace, kv: SavedContexts,
           held: frozenset[int], slots: int) -> list[int]:
    """The next batch under ``policy.batching`` (module docstring); ``held``: the adapters the last batch left in
    the SRAM-DCIM slots, ``slots`` of them at most."""
    if policy.batching == "same-adapter":
        return _members(by_adapter[int(trace.adapter[waiting[0]])], trace, kv, policy.max_batch)
    if policy.batching == "mixed":
        return _members(waiting, trace, kv, policy.max_batch)
    adapter = trace.adapter
    known = lambda members: {int(adapter[m]) for m in members}  # noqa: E731
    members = _members(waiting, trace, kv, policy.max_batch,  # first the adapters it holds or already takes
                       lambda ms, k: int(adapter[k]) in known(ms) | held and len(known(ms) | {int(adapter[k])}) <= slots)
    return _members(waiting, trace, kv, policy.max_batch, lambda ms, k: len(known(ms) | {int(adapter[k])}) <= slots,
                    members)


def _held(group: frozenset[int], held: tuple[int, ...], slots: int) -> tuple[int, ...]:
    """What the slots hold after a batch on ``group``: with room, its adapters and, after them, those held
    before, ``slots`` in all; on more adapters than slots, the last ``slots`` its last step used (runs in
    adapter order, codegen{requests})."""
    ordered = sorted(group)
    if len(ordered) > slots:
        return tuple(reversed(ordered[-slots:])) if slots else ()
    return tuple(dict.fromkeys([*ordered, *held]))[:slots]


def simulate(trace: Trace, table: CostTable) -> dict:
    """Per-request columns and per-batch totals of serving ``trace`` (module docstring): JSON-ready lists."""
    n = len(trace)
    policy, context = table.policy, table.context
    long = np.flatnonzero(trace.history + trace.prompt + trace.generate > context)
    if len(long):
        k = int(long[0])
        raise InputError("trace", f"request {k} needs {int(trace.history[k] + trace.prompt[k] + trace.generate[k])} "
                                  f"tokens of context; the KV space holds {context}")
    kv = SavedContexts(table.slots, policy.context_save)
    saved_tokens = np.zeros(n, np.int64)
    start, first, finish, itl = (np.zeros(n) for _ in range(4))
    batch_of = np.zeros(n, np.int64)
    switched = np.zeros(n, np.int8)  # 0 none, 1 cold, 2 warm (on the batch's head request)
    waiting: deque[int] = deque()
    by_adapter: dict[int, deque[int]] = {}
    taken = np.zeros(n, bool)
    energy = {"reconfiguration": 0.0, "prefill": 0.0, "decode": 0.0, "idle": 0.0}
    reconfig_s = config_s = 0.0
    log: dict[str, list] = {"start_s": [], "exposed_s": [], "first_token_s": [], "end_s": [], "adapter": [],
                            "switch": []}  # per batch, in order
    loaded: frozenset[int] = frozenset()  # the last batch's adapters
    held: tuple[int, ...] = ()  # the adapters the SRAM-DCIM slots hold, most recently used first
    t, prev_end, nxt, decode_exposed, widest = float(trace.arrival_s[0]), None, 0, 0.0, 0
    while True:
        while waiting and taken[waiting[0]]:  # batched with an earlier head
            waiting.popleft()
        if not waiting:
            if nxt == n:
                break
            t = max(t, float(trace.arrival_s[nxt]))  # idle until the next arrival
        while nxt < n and trace.arrival_s[nxt] <= t:
            waiting.append(nxt)
            if policy.batching == "same-adapter":
                by_adapter.setdefault(int(trace.adapter[nxt]), deque()).append(nxt)
            nxt += 1
        members = _batch(policy, waiting, by_adapter, trace, kv, frozenset(held), table.sram_slots)
        taken[members] = True
        adapter, group = int(trace.adapter[members[0]]), frozenset(trace.adapter[members].tolist())
        widest = max(widest, len(group))
        size = batch_size(len(members), policy.max_batch)
        saved = [kv.saved(trace, k) for k in members]
        saved_tokens[members] = saved
        kv.admit(trace, members, size)
        fresh = bucket(int(prefill_tokens(trace, members, saved).max()), context)
        history = min(bucket(max(saved), context), context - 1 - fresh) if max(saved) else 0
        pre = table.shape(size, fresh, adapter, history, len(group))
        steps = int(trace.generate[members].max()) - 1
        end_pos = trace.history[members] + trace.prompt[members] + trace.generate[members]
        dec = table.shape(size, bucket(int(end_pos.max()) - 1, context), adapter, 0, len(group))
        if len(group) > 1:  # what rewriting adapters between passes adds to each step
            one = table.shape(size, bucket(int(end_pos.max()) - 1, context), adapter, sample=True)  # same zeros
            decode_exposed += steps * max(0.0, dec.step_s - one.step_s)
        if prev_end is not None and t > prev_end:
            energy["idle"] += (t - prev_end) * (table.idle_w or 0.0)
        b2b = prev_end is not None and t == prev_end
        switch = group != loaded and not group <= set(held)
        case = ("b2b_" if b2b else "idle_") + ("switch" if switch else "same")
        exposed = 0.0
        if switch:
            switched[members[0]] = 2 if b2b else 1
            same = case.replace("switch", "same")
            exposed = pre.start_s[case] - pre.start_s[same]
            reconfig_s += exposed
            config_s += pre.config_s
            energy["reconfiguration"] += pre.start_j[case] - pre.start_j[same]
        energy["prefill"] += pre.start_j[case.replace("switch", "same")]
        ready = t + pre.start_s[case]
        start[members], first[members] = t, ready
        finish[members] = ready + (trace.generate[members] - 1) * dec.step_s
        itl[members] = np.where(trace.generate[members] > 1, dec.step_s, np.nan)
        batch_of[members] = len(log["start_s"])
        energy["decode"] += steps * dec.step_j
        end = ready + steps * dec.step_s
        for key, value in zip(log, (t, exposed, ready, end, tuple(sorted(group)), (2 if b2b else 1) if switch else 0)):
            log[key].append(value)
        kv.keep(trace, members)
        t = end
        prev_end, loaded = t, group
        held = _held(group, held, table.sram_slots)
    return {"start_s": start, "first_token_s": first, "finish_s": finish, "itl_s": itl, "batch": batch_of,
            "switched": switched, "energy_j": energy, "reconfig_s": reconfig_s, "config_s": config_s,
            "decode_exposed_s": decode_exposed, "max_adapters_per_batch": widest,
            "batches": len(log["start_s"]), "saved_tokens": saved_tokens, "evictions": kv.evictions,
            "kv_slots": table.slots,
            "batch_log": log,
            "shapes": [s.to_dict() for s in _used(table)], "idle_w": table.idle_w or 0.0}


def _used(table: CostTable) -> list[Shape]:
    return [table.shapes[k] for k in sorted(table.shapes)]
