"""Request traces: what arrives when, on which adapter, how long its prompt and its generation are.

A trace is a JSONL file (one object a line) or a CSV file (a header line)
with four fields per request and an optional fifth, in arrival order
(docs/serving.md):

- ``arrival_s``: seconds from the start of the trace, finite, >= 0, never
  smaller than the request before;
- ``adapter``: the name of one of the adapters being served;
- ``prompt_tokens``: >= 1;
- ``generate_tokens``: >= 1;
- ``conversation`` (optional; absent, null or empty: a request of its own):
  a name (a string, or an integer: the same name as its decimal text)
  shared by the turns of one conversation. A turn's prompt is its
  new tokens; it follows every earlier turn's prompt and generation, its
  *history*, and keeps their adapter.

A request's history, prompt and generation together are at most the context
the KV space is compiled for. Any other field, a missing one, a malformed
line or a broken rule is an :class:`InputError` naming the file and line.
:func:`poisson_trace` makes a seeded trace: Poisson arrivals, adapters drawn
with Zipf popularity, prompt and generation lengths uniform over inclusive
ranges and, optionally, conversations of several turns.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from primal_compiler.errors import InputError, one_line
from primal_compiler.inputs import read_text

FIELDS = ("arrival_s", "adapter", "prompt_tokens", "generate_tokens")
OPTIONAL = ("conversation",)
MAX_REQUESTS = 10_000_000
#: A trace file's largest size: MAX_REQUESTS lines of 256 bytes, far above a request's 80-byte JSON line.
TRACE_LIMIT_BYTES = MAX_REQUESTS * 256
MAX_TURNS_DRAWN = 50_000_000  # poisson_trace holds about 100 bytes a drawn turn: at most about 5 GB


@dataclass(frozen=True, eq=False)
class Trace:
    """Requests as columns, in arrival order: ``adapter`` indexes ``adapters``, ``conversation`` numbers the
    conversations in order of first arrival (-1: a request of its own), ``history`` is the tokens of the
    conversation's earlier turns (prompts and generations)."""

    arrival_s: np.ndarray  # float64
    adapter: np.ndarray  # int64
    prompt: np.ndarray  # int64
    generate: np.ndarray  # int64
    adapters: tuple[str, ...]
    conversation: np.ndarray  # int64
    history: np.ndarray  # int64

    def __len__(self) -> int:
        return len(self.arrival_s)

    def rows(self) -> list[dict]:
        return [{"arrival_s": float(a), "adapter": self.adapters[int(k)], "prompt_tokens": int(p),
                 "generate_tokens": int(g), **({"conversation": f"c{c}"} if c >= 0 else {})}
                for a, k, p, g, c in zip(self.arrival_s, self.adapter, self.prompt, self.generate, self.conversation)]


def load_trace(path: str | Path, adapters: tuple[str, ...], context: int) -> Trace:
    """The trace in ``path`` (``.jsonl`` or ``.csv``) for ``adapters`` and a KV context of ``context`` tokens."""
    path = Path(path)
    where = str(path)
    if path.suffix not in (".jsonl", ".csv"):
        raise InputError(where, "a trace is a .jsonl or a .csv file")
    text = read_text(path, TRACE_LIMIT_BYTES, "trace file")  # a FIFO or a device is refused, never opened
    rows = _jsonl(text, where) if path.suffix == ".jsonl" else _csv(text, where)
    if not rows:
        raise InputError(where, "holds no request")
    if len(rows) > MAX_REQUESTS:
        raise InputError(where, f"holds {len(rows):,} requests; at most {MAX_REQUESTS:,}")
    index = {name: i for i, name in enumerate(adapters)}
    cols: tuple[list, ...] = ([], [], [], [], [], [])
    last = 0.0
    talks: dict[str, list[int]] = {}  # conversation -> [number, adapter, tokens so far]
    for line, row in rows:
        at = f"{where}:{line}"
        if not set(FIELDS) <= set(row) <= set(FIELDS + OPTIONAL):
            extra, missing = sorted(set(row) - set(FIELDS + OPTIONAL)), sorted(set(FIELDS) - set(row))
            raise InputError(at, f"expected the fields {', '.join(FIELDS)} (and optionally {', '.join(OPTIONAL)})"
                                 + (f"; unknown {', '.join(map(str, extra))}" if extra else "")
                                 + (f"; missing {', '.join(missing)}" if missing else ""))
        arrival = _number(row["arrival_s"], at, "arrival_s")
        if not math.isfinite(arrival) or arrival < 0:
            raise InputError(at, f"arrival_s must be a finite time >= 0, got {row['arrival_s']!r}")
        if arrival < last:
            raise InputError(at, f"arrival_s {arrival:g} is before the previous request's {last:g}: the trace "
                                 "must be in arrival order")
        name = str(row["adapter"])
        if name not in index:
            raise InputError(at, f"unknown adapter {name!r} (serving: {', '.join(adapters)})")
        prompt, generate = _count(row["prompt_tokens"], at, "prompt_tokens"), _count(row["generate_tokens"], at,
                                                                                      "generate_tokens")
        talk = row.get("conversation")
        number, history = -1, 0
        if talk not in (None, ""):
            if isinstance(talk, bool) or not isinstance(talk, (str, int)):
                raise InputError(at, f"conversation must be a name (a string or an integer), got {talk!r}")
            number, adapter, history = talks.setdefault(str(talk), [len(talks), index[name], 0])
            if adapter != index[name]:
                raise InputError(at, f"conversation {talk!s} runs on adapter {adapters[adapter]!r}, not {name!r}: "
                                     "its KV cache is bound to its adapter")
        if history + prompt + generate > context:
            earlier = f"{history} tokens of earlier turns + " if history else ""
            raise InputError(at, f"{earlier}prompt_tokens {prompt} + generate_tokens {generate} exceeds the context "
                                 f"of {context} tokens")
        if number >= 0:
            talks[str(talk)][2] = history + prompt + generate
        last = arrival
        for col, value in zip(cols, (arrival, index[name], prompt, generate, number, history)):
            col.append(value)
    adapter_col, prompt_col, generate_col, talk_col, history_col = (np.array(c, np.int64) for c in cols[1:])
    return Trace(np.array(cols[0], np.float64), adapter_col, prompt_col, generate_col, tuple(adapters), talk_col,
                 history_col)


def _jsonl(text: str, where: str) -> list[tuple[int, dict]]:
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{where}:{n}", f"not a JSON object ({exc.msg})") from None
        except RecursionError:
            raise InputError(f"{where}:{n}", "not a request: arrays or objects nested too deeply") from None
        except ValueError as exc:  # an integer of more digits than Python converts
            raise InputError(f"{where}:{n}", f"not a request: {one_line(exc, 120)}") from None
        if not isinstance(row, dict):
            raise InputError(f"{where}:{n}", "not a JSON object")
        out.append((n, row))
    return out


def _csv(text: str, where: str) -> list[tuple[int, dict]]:
    reader = csv.reader(io.StringIO(text))
    try:
        lines = [(reader.line_num, row) for row in reader]
    except csv.Error as exc:
        raise InputError(where, f"not a CSV file ({exc})") from None
    lines = [(n, row) for n, row in lines if row]
    if not lines:
        return []
    header = [h.strip() for h in lines[0][1]]
    out = []
    for n, row in lines[1:]:
        if len(row) != len(header):
            raise InputError(f"{where}:{n}", f"{len(row)} values for the header's {len(header)} fields")
        out.append((n, dict(zip(header, (v.strip() for v in row)))))
    return out


def _number(value, at: str, name: str) -> float:
    if isinstance(value, bool):
        raise InputError(at, f"{name} must be a number, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an integer past the largest float
        raise InputError(at, f"{name} must be a number, got {str(value)[:40]!r}") from None


def _count(value, at: str, name: str) -> int:
    number = _number(value, at, name)
    if not math.isfinite(number) or number != int(number) or number < 1 or number > 1 << 31:
        raise InputError(at, f"{name} must be a whole number >= 1, got {value!r}")
    return int(number)


def poisson_trace(requests: int, rate_per_s: float, adapters: tuple[str, ...], zipf: float,
                  prompt: tuple[int, int], generate: tuple[int, int], seed: int, turns: tuple[int, int] = (1, 1),
                  think_s: float = 30.0, context: int = 2048) -> Trace:
    """``requests`` arrivals of a Poisson process at ``rate_per_s``; adapter ``k`` (0-based, in the order given)
    drawn with probability proportional to ``1 / (k + 1) ** zipf`` (0: uniform); prompt and generation lengths
    uniform over the inclusive ranges; all from one generator seeded with ``seed``.

    With ``turns`` above one, the Poisson arrivals (at ``rate_per_s`` over the mean turn count) start
    conversations of a uniform number of turns on one adapter, each turn arriving an exponential think
    time of mean ``think_s`` after the one before *arrives* (an open-loop trace cannot know when an answer
    ends; the simulation runs a conversation's turns in order, so a turn arriving early waits). A
    conversation ends early at the turn that would take it past ``context`` tokens, and ``turns`` is first
    clipped to the most turns that can fit (``context`` over the shortest prompt plus generation). The
    trace is the first ``requests`` turns in arrival order. Every request fits ``context``: the longest
    prompt plus the longest generation exceeding it is an InputError, as is a draw of more than
    ``MAX_TURNS_DRAWN`` turns."""
    if prompt[1] + generate[1] > context:
        raise InputError("--context", f"a request of the longest prompt ({prompt[1]}) and generation ({generate[1]}) "
                                      f"would not fit the context of {context} tokens")
    rng = np.random.default_rng(seed)
    if turns[1] <= 1:
        arrival = np.cumsum(rng.exponential(1.0 / rate_per_s, requests))
        none = np.full(requests, -1, np.int64)
        return Trace(arrival, _adapters(rng, requests, len(adapters), zipf), *_lengths(rng, requests, prompt, generate),
                     tuple(adapters), none, np.zeros(requests, np.int64))
    n = requests  # conversations drawn; the first ``requests`` turns come from the earliest of them
    high = min(turns[1], context // (prompt[0] + generate[0]))  # no more turns than that can fit
    low = min(turns[0], high)
    begin = np.cumsum(rng.exponential((low + high) / 2 / rate_per_s, n))
    count = rng.integers(low, high + 1, n)
    if count.sum() > MAX_TURNS_DRAWN:
        raise InputError("--turns", f"{requests:,} conversations of {low} to {high} turns draw "
                                    f"{int(count.sum()):,} turns, more than {MAX_TURNS_DRAWN:,}")
    talk = np.repeat(np.arange(n), count)
    first = np.r_[True, talk[1:] != talk[:-1]]
    p, g = _lengths(rng, len(talk), prompt, generate)
    gap = np.where(first, 0.0, rng.exponential(think_s, len(talk)))
    arrival = begin[talk] + _within(talk, gap)
    end = _within(talk, p + g)
    keep = np.flatnonzero(end <= context)
    order = keep[np.argsort(arrival[keep], kind="stable")][:requests]
    adapter = _adapters(rng, n, len(adapters), zipf)[talk]
    ids = np.unique(talk[order], return_index=True)
    number = np.empty(n, np.int64)
    number[ids[0][np.argsort(ids[1])]] = np.arange(len(ids[0]))
    return Trace(arrival[order], adapter[order], p[order], g[order], tuple(adapters), number[talk[order]],
                 (end - p - g)[order])


def _adapters(rng: np.random.Generator, n: int, k: int, zipf: float) -> np.ndarray:
    weight = 1.0 / np.arange(1, k + 1) ** zipf
    return rng.choice(k, size=n, p=weight / weight.sum()).astype(np.int64)


def _lengths(rng: np.random.Generator, n: int, prompt: tuple[int, int],
             generate: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    p = rng.integers(prompt[0], prompt[1] + 1, n)
    g = rng.integers(generate[0], generate[1] + 1, n)
    return p.astype(np.int64), g.astype(np.int64)


def _within(group: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Running sum of ``x`` within each run of equal ``group`` values (``group`` sorted)."""
    total = np.cumsum(x)
    starts = np.r_[0, np.flatnonzero(group[1:] != group[:-1]) + 1]
    before = np.repeat(total[starts] - x[starts], np.diff(np.r_[starts, len(x)]))
    return total - before


def trace_jsonl(trace: Trace) -> str:
    """The JSONL text of ``trace`` (arrival times to the nanosecond)."""
    return "".join(json.dumps({**row, "arrival_s": round(row["arrival_s"], 9)}) + "\n" for row in trace.rows())
