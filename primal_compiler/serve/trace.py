"""Request traces: what arrives when, on which adapter, how long its prompt and its generation are.

A trace is a JSONL file (one object a line) or a CSV file (a header line)
with exactly four fields per request, in arrival order (docs/serving.md):

- ``arrival_s``: seconds from the start of the trace, finite, >= 0, never
  smaller than the request before;
- ``adapter``: the name of one of the adapters being served;
- ``prompt_tokens``: >= 1;
- ``generate_tokens``: >= 1, with ``prompt_tokens + generate_tokens`` at most
  the context the KV space is compiled for.

Any other field, a missing one, a malformed line or a broken rule is an
:class:`InputError` naming the file and line. :func:`poisson_trace` makes a
seeded trace: Poisson arrivals, adapters drawn with Zipf popularity, prompt
and generation lengths uniform over inclusive ranges.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from primal_compiler.errors import InputError

FIELDS = ("arrival_s", "adapter", "prompt_tokens", "generate_tokens")
MAX_REQUESTS = 10_000_000


@dataclass(frozen=True, eq=False)
class Trace:
    """Requests as columns, in arrival order: ``adapter`` indexes ``adapters``."""

    arrival_s: np.ndarray  # float64
    adapter: np.ndarray  # int64
    prompt: np.ndarray  # int64
    generate: np.ndarray  # int64
    adapters: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.arrival_s)

    def rows(self) -> list[dict]:
        return [{"arrival_s": float(a), "adapter": self.adapters[int(k)], "prompt_tokens": int(p),
                 "generate_tokens": int(g)}
                for a, k, p, g in zip(self.arrival_s, self.adapter, self.prompt, self.generate)]


def load_trace(path: str | Path, adapters: tuple[str, ...], context: int) -> Trace:
    """The trace in ``path`` (``.jsonl`` or ``.csv``) for ``adapters`` and a KV context of ``context`` tokens."""
    path = Path(path)
    where = str(path)
    if path.suffix not in (".jsonl", ".csv"):
        raise InputError(where, "a trace is a .jsonl or a .csv file")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(where, "no such trace file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(where, f"cannot read the trace ({type(exc).__name__})") from None
    rows = _jsonl(text, where) if path.suffix == ".jsonl" else _csv(text, where)
    if not rows:
        raise InputError(where, "holds no request")
    if len(rows) > MAX_REQUESTS:
        raise InputError(where, f"holds {len(rows):,} requests; at most {MAX_REQUESTS:,}")
    index = {name: i for i, name in enumerate(adapters)}
    cols: tuple[list, list, list, list] = ([], [], [], [])
    last = 0.0
    for line, row in rows:
        at = f"{where}:{line}"
        if set(row) != set(FIELDS):
            extra, missing = sorted(set(row) - set(FIELDS)), sorted(set(FIELDS) - set(row))
            raise InputError(at, f"expected the fields {', '.join(FIELDS)}"
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
        if prompt + generate > context:
            raise InputError(at, f"prompt_tokens {prompt} + generate_tokens {generate} exceeds the context of "
                                 f"{context} tokens")
        last = arrival
        for col, value in zip(cols, (arrival, index[name], prompt, generate)):
            col.append(value)
    return Trace(np.array(cols[0], np.float64), np.array(cols[1], np.int64), np.array(cols[2], np.int64),
                 np.array(cols[3], np.int64), tuple(adapters))


def _jsonl(text: str, where: str) -> list[tuple[int, dict]]:
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{where}:{n}", f"not a JSON object ({exc.msg})") from None
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
    except (TypeError, ValueError):
        raise InputError(at, f"{name} must be a number, got {value!r}") from None


def _count(value, at: str, name: str) -> int:
    number = _number(value, at, name)
    if not math.isfinite(number) or number != int(number) or number < 1 or number > 1 << 31:
        raise InputError(at, f"{name} must be a whole number >= 1, got {value!r}")
    return int(number)


def poisson_trace(requests: int, rate_per_s: float, adapters: tuple[str, ...], zipf: float,
                  prompt: tuple[int, int], generate: tuple[int, int], seed: int) -> Trace:
    """``requests`` arrivals of a Poisson process at ``rate_per_s``; adapter ``k`` (0-based, in the order given)
    drawn with probability proportional to ``1 / (k + 1) ** zipf`` (0: uniform); prompt and generation lengths
    uniform over the inclusive ranges; all from one generator seeded with ``seed``."""
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1.0 / rate_per_s, requests))
    weight = 1.0 / np.arange(1, len(adapters) + 1) ** zipf
    adapter = rng.choice(len(adapters), size=requests, p=weight / weight.sum())
    p = rng.integers(prompt[0], prompt[1] + 1, requests)
    g = rng.integers(generate[0], generate[1] + 1, requests)
    return Trace(arrival, adapter.astype(np.int64), p.astype(np.int64), g.astype(np.int64), tuple(adapters))


def trace_jsonl(trace: Trace) -> str:
    """The JSONL text of ``trace`` (arrival times to the nanosecond)."""
    return "".join(json.dumps({**row, "arrival_s": round(row["arrival_s"], 9)}) + "\n" for row in trace.rows())
