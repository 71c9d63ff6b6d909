"""``primal reproduce --solve``: what it would take to reproduce each seed number we miss.

For every row more than 25% from the seed, the constants tried are the
target's stated ranges (``<key>_range``, docs/targets.md): what the target
itself declares uncertain. A row is evaluated with one constant moved at a
time (an energy constant by repricing the kept replays, any other by
replaying the kept programs that the row reads). Where the seed's number
lies between two evaluated points, false position (Illinois; the row taken
as monotonic in the constant) finds the value to 0.5%, an integer key to
its nearest integer (whose row may then miss the seed's number by one step of
the key: such a hit ranks after every one within the tolerance). An energy constant, which moves energy affinely, is
also followed beyond its range (doubling or halving, up to 2**10, within
the key's own rules), so an implausible requirement is still reported; any
other constant only within its range. Per row, ``solve`` is the constant
that reaches the seed's number with the least move (in widths of its
range), a plausible one (inside its range) first::

    {"constant", "value", "range": [low, high], "plausible", "reached", "evaluations"}

or ``{"constant": None, "why": ...}``. The search stops at a wall-time
budget; rows it did not finish say so.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from primal_compiler.errors import InputError
from primal_compiler.executor.replay import energy_only
from primal_compiler.target.spec import PrimalTarget

OFF = 0.25  # a row further than this (as a fraction) from the seed is solved for
TOLERANCE = 0.005  # a solved value reproduces the seed's number to this fraction
EXTEND = 10  # an energy constant is followed out to 2**EXTEND times its range ends


@dataclass
class _Search:
    """Evaluations of rows, cached by (key, value, row), within a wall-time budget."""

    evaluate: Callable[[str, float, int], float]
    deadline: float
    count: int = 0
    cache: dict[tuple[str, float, int], float | None] = field(default_factory=dict)

    def row(self, key: str, value: float, row: int) -> float | None:
        """Row ``row``'s value with ``key`` at ``value``; None where the key's rules refuse the value."""
        if (key, value, row) not in self.cache:
            if time.monotonic() > self.deadline:
                raise TimeoutError
            self.count += 1
            try:
                self.cache[key, value, row] = self.evaluate(key, value, row)
            except InputError:
                self.cache[key, value, row] = None
        return self.cache[key, value, row]


def solve_rows(rows: list[dict], target: PrimalTarget, evaluate: Callable[[str, float, int], float],
               budget_s: float, say: Callable[[str], None] = lambda s: None) -> None:
    """Add ``solve`` to every row of ``rows`` more than :data:`OFF` from its seed (module docstring).
    ``evaluate(key, value, i)``: row ``i``'s value with target key ``key`` at ``value``."""
    if budget_s <= 0:
        raise InputError("--solve", f"the time budget must be positive, got {budget_s:g} s")
    todo = [i for i, r in enumerate(rows) if r["seed"] and abs(r["ours"] / r["seed"] - 1) > OFF]
    found: dict[int, list[dict[str, Any]]] = {i: [] for i in todo}
    moved: set[int] = set()
    search = _Search(evaluate, time.monotonic() + budget_s)
    keys = sorted(target.ranges, key=lambda k: (not energy_only(k), k))  # the cheap repricing first
    done = 0
    try:
        for key in keys:
            say(f"solving: {key}")
            for i in todo:
                hit = _solve_one(search, key, _value(target, key), target.ranges[key], i, rows[i]["seed"],
                                 rows[i]["ours"])
                if hit is not None:
                    moved.add(i)
                    if hit.get("value") is not None:
                        found[i].append(hit)
            done += 1
    except TimeoutError:
        pass
    for i in todo:
        rows[i]["solve"] = _choose(found[i], i in moved, done, len(keys), search.count)


def _value(target: PrimalTarget, key: str) -> float:
    obj: Any = target
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj


def _solve_one(search: _Search, key: str, v0: float, rng: tuple[float, float], row: int, seed: float,
               ours: float) -> dict[str, Any] | None:
    """The value of ``key`` giving row ``row`` (``ours`` at the target's ``v0``) its ``seed``
    (``{"value": None}`` when the key moves the row but cannot reach it); None when it does not move it."""
    integer = isinstance(v0, int)
    lo, hi = (int(x) for x in rng) if integer else rng
    points = {v0: ours}
    for v in sorted({lo, hi} - {v0}):
        got = search.row(key, v, row)
        if got is not None:
            points[v] = got
    if len(set(points.values())) <= 1:
        return None
    pairs = sorted(points.items())
    if energy_only(key):  # affine in the key: follow it beyond the range
        pairs = _extend(search, key, row, seed, pairs)
    for (a, fa), (b, fb) in zip(pairs, pairs[1:]):
        if min(fa, fb) <= seed <= max(fa, fb):
            value, reached = _root(search, key, row, seed, a, fa, b, fb, integer)
            return {"constant": key, "value": value, "range": [rng[0], rng[1]], "plausible": rng[0] <= value <= rng[1],
                    "reached": reached, "exact": abs(reached - seed) <= TOLERANCE * abs(seed),
                    "move": abs(value - v0) / (rng[1] - rng[0]), "evaluations": search.count}
    return {"value": None}


def _extend(search: _Search, key: str, row: int, seed: float, pairs: list[tuple[float, float]]):
    """``pairs`` with points beyond the range ends, out to where the row passes ``seed`` (or 2**EXTEND)."""
    (a, fa), (b, fb) = pairs[0], pairs[-1]
    up = (fb > fa) == (seed > max(fa, fb))  # the row moves towards the seed as the key grows
    if min(fa, fb) <= seed <= max(fa, fb):
        return pairs
    for k in range(1, EXTEND + 1):
        v = b * 2 ** k if up else a / 2 ** k
        got = search.row(key, v, row)
        if got is None:
            break
        pairs = [*pairs, (v, got)] if up else [(v, got), *pairs]
        if min(pairs[0][1], pairs[-1][1]) <= seed <= max(pairs[0][1], pairs[-1][1]):
            break
    return pairs


def _root(search: _Search, key: str, row: int, seed: float, a: float, fa: float, b: float, fb: float,
          integer: bool) -> tuple[float, float]:
    """(value, the row's value there) between ``a`` < ``b`` where the row meets ``seed``: false position with
    the Illinois rule (an end kept twice has its residual's weight halved)."""
    wa = wb = 1.0
    kept = 0
    for _ in range(40):
        for v, f in ((a, fa), (b, fb)):
            if abs(f - seed) <= TOLERANCE * abs(seed):
                return v, f
        ga, gb = (fa - seed) * wa, (fb - seed) * wb
        m = (a * gb - b * ga) / (gb - ga)
        if integer:
            if b - a <= 1:
                break
            m = min(max(round(m), a + 1), b - 1)
        elif not a < m < b:
            m = (a + b) / 2
        fm = search.row(key, m, row)
        if fm is None:
            break
        if (fm < seed) == (fa < seed):  # the root lies between m and b
            a, fa, wa = m, fm, 1.0
            wb, kept = (wb / 2 if kept == 1 else wb), 1
        else:
            b, fb, wb = m, fm, 1.0
            wa, kept = (wa / 2 if kept == -1 else wa), -1
    return (a, fa) if abs(fa - seed) <= abs(fb - seed) else (b, fb)


def _choose(hits: list[dict[str, Any]], moved: bool, done: int, keys: int, evaluations: int) -> dict[str, Any]:
    if hits:  # a constant reaching the seed's number to TOLERANCE before one whose integer steps straddle it
        best = min(hits, key=lambda h: (not h["plausible"], not h["exact"], h["move"]))
        return {k: v for k, v in best.items() if k not in ("move", "exact")}
    if done < keys:
        why = (f"the search stopped at its time budget after {done} of {keys} constants ({evaluations} evaluations), "
               f"none of them reaching the seed's number")
    elif moved:
        why = "no stated-range constant reaches the seed's number (those that move the row stop short)"
    else:
        why = "no stated-range constant moves this row"
    return {"constant": None, "why": why}
