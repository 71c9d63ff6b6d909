"""Steady-state decode: figures for a generation longer than the decode steps replayed record by record.

Every decode step of a compiled stream is the same program: the same records
in the same order, except for the fields that follow the token's position
(where ``KV_APPEND`` puts the new token's K/V: its destination CT and PE,
slot and flags; and the multicast group ids, which are labels). Once the KV
ring is full (the default prompt fills it, so every step attends over the
whole context) consecutive steps do the same work.

The replay replays ``K`` steps. Step ``K`` is **periodic** when it does the
same work as step ``K - 1`` (every other record field equal) and every one of
its records starts and finishes exactly ``P`` cycles after the same record of
step ``K - 1``, for one ``P > 0``: the machine then runs step ``K`` as it ran
step ``K - 1``, shifted by ``P``, so it reached a fixed point. A generation of
``N > K`` tokens repeats that step ``N - K`` times: each repeat adds ``P``
cycles to every sequence's token gaps and the energy of step ``K - 1`` (its
records' dynamic energy plus every CT's static energy over the ``P`` cycles
ending at its last token). Step ``K - 1``, not ``K``: the stream's last step
wakes no CT for a step after it, so its leakage is not a middle step's.

What this takes as given: that where a later step appends its K/V does not
change its time or energy. It does a little: once the ring position passes a
chunk boundary the append goes to another PE, its route crosses other links,
and the step's time moves by up to 0.4% on the fixtures (never in the
prefill or the first step). ``tests/executor/test_steady.py`` compares every
fixture family's extension with its full replay of 24 tokens (six append
chunks): mean ITL, tokens/s and energy agree within 1%, and
``docs/executor.md`` gives the same comparison on Llama-2-13B. A generation
whose last replayed steps are not periodic (the KV cache still growing, a
batch pipeline not yet settled) is refused with the reason when it was asked
for; a program's planned default covers the replayed steps alone and says
why. Replaying more steps (``primal run --replay-steps``) settles it, and
replaying all of them is exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from primal_compiler.errors import InputError

SAME_WORK = ("op", "ct", "pe", "layer", "src_buf", "dst_buf", "count", "nbytes")
"""Record fields two steps doing the same work share; the others follow the token's position."""


@dataclass(frozen=True)
class Steady:
    """How a generation of ``generated`` tokens per sequence is covered: ``replayed`` decode steps record by record,
    then ``generated - replayed`` repeats of a middle step, each ``period_cycles`` long (0 when nothing repeats)."""

    replayed: int
    generated: int
    period_cycles: int
    step_records: np.ndarray  # int64 records of the step a repeat costs: the last but one replayed
    planned: int = 0  # the generation the program planned when it could not be covered (0: it was)
    unsettled: str = ""  # why not: the last replayed step is not periodic

    @property
    def repeated(self) -> int:
        return self.generated - self.replayed

    def repeat_window(self, end: int) -> tuple[int, int]:
        """The cycles whose static energy one repeat costs, given the replayed decode's last cycle ``end``: the period
        ending at step ``K - 1``'s last token (the module docstring says why not step ``K``'s)."""
        return end - 2 * self.period_cycles, end - self.period_cycles


def periodic(records: np.ndarray, start: np.ndarray, finish: np.ndarray, decode: np.ndarray, steps: int) -> tuple[int, str]:
    """(P, "") when the last of ``steps`` decode steps (records ``decode``, step after step) is periodic (see
    the module docstring), else (0, why not)."""
    if steps < 2:
        return 0, "one decode step was replayed; periodicity needs two"
    if len(decode) % steps:
        return 0, f"the {len(decode):,} decode records do not split into {steps} equal steps"
    n = len(decode) // steps
    prev, last = decode[-2 * n : -n], decode[-n:]
    for field in SAME_WORK:
        differ = np.flatnonzero(records[field][prev] != records[field][last])
        if len(differ):
            return 0, (f"step {steps} does other work than step {steps - 1} (record {int(last[differ[0]])}: "
                       f"{field} differs, e.g. a KV cache still growing)")
    shift = np.concatenate([start[last] - start[prev], finish[last] - finish[prev]])
    if shift.min() != shift.max() or shift[0] <= 0:
        return 0, (f"step {steps} is not step {steps - 1} shifted in time (its records move by {int(shift.min()):,} "
                   f"to {int(shift.max()):,} cycles): the machine has not settled")
    return int(shift[0]), ""


def steady(records: np.ndarray, start: np.ndarray, finish: np.ndarray, decode: np.ndarray, steps: int,
           generate: int, where: str, required: bool = True) -> Steady:
    """How ``generate`` tokens per sequence are covered by ``steps`` replayed decode steps.

    InputError naming ``where`` if ``generate`` is below ``steps``, or above it while the last replayed step is
    not periodic (the reason and the remedy in the message); when the generation was only planned, not
    ``required`` (a program's default), the latter covers the replayed steps alone and says why.
    """
    n = len(decode) // steps if steps else 0
    middle = decode[len(decode) - 2 * n : len(decode) - n] if steps >= 2 else decode[:0]
    if generate == steps:
        return Steady(steps, generate, 0, middle)
    if generate < steps:
        raise InputError(where, f"generates {generate} tokens but replays {steps} decode steps; a generation "
                                "covers at least the replayed steps")
    period, why = periodic(records, start, finish, decode, steps)
    if not period and not required:
        return Steady(steps, steps, 0, middle, generate, why)
    if not period:
        raise InputError(where, f"cannot extend {steps} replayed decode steps to {generate} generated tokens: {why}; "
                                f"replay more steps (primal run --replay-steps) or generate {steps}")
    return Steady(steps, generate, period, middle)
