"""Programs that fit the scratchpads (``codegen{memory=strict}``): the prefill chunk codegen chooses, or the
refusal of one that does not fit.

A prefill pass of ``c`` tokens holds every activation buffer for ``c``
vectors, so the compiler's allocation (:mod:`primal_compiler.executor.allocation`)
grows with ``c``. With no chunk forced (``prefill_chunk=0``) the whole
prompt stays one pass when the program fits; otherwise codegen takes the
largest chunk whose pass fits, found by bisection on *probes*: one prefill
pass of ``c`` tokens ending at the prompt's last token (the largest
attention of any chunk of ``c`` tokens), LM head and ARGMAX included (a
probe that would overwrite keys it reads in a sliding layer's ring does not
fit either). The
stream emitted with that chunk is allocated again and the chunk shrunk
until it fits (a probe bounds, it does not prove). A program that does not
fit with any chunk (even the decode step's buffers overflow), or a forced
chunk that does not, is refused, naming the PE, its bytes and buffers and,
when a smaller chunk fits, the largest that does; so is a program whose
chunk that fits would take more than :data:`STREAM_RECORDS_LIMIT` records.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from primal_compiler.codegen.emit import prefill_pass
from primal_compiler.codegen.kvmap import overwriting_layer
from primal_compiler.errors import InputError
from primal_compiler.executor.allocation import Allocation, of_program, overflow

if TYPE_CHECKING:
    from primal_compiler.ir.program import Program
    from primal_compiler.isa.stream import Stream
    from primal_compiler.target.spec import PrimalTarget


@dataclass(frozen=True)
class Fitted:
    """The stream codegen keeps, its chunk (tokens per prefill pass) and its allocation."""

    stream: Stream
    chunk: int
    allocation: Allocation


def decode_part(stream: Stream) -> np.ndarray:
    """Which records are in a decode section."""
    keep = np.zeros(len(stream.records), dtype=bool)
    for s in stream.sections:
        if s.name.startswith("decode:"):
            keep[s.start:s.stop] = True
    return keep


STREAM_RECORDS_LIMIT = 8_000_000
"""The most records codegen emits for a prefill chunk it chooses itself. A replay holds about 2.7 KB per
record (the README's main job: 3.6 GB resident for 1.33 M records), so 8 M records take about 22 GB, what
a 24 GiB machine holds; a program that fits only in more passes is refused (``codegen{prefill_chunk}`` with
``memory=report`` replays larger chunks, unfitted)."""


def probe(program: Program, target: PrimalTarget, prompt: int, tokens: int, history: int,
          pipeline: bool) -> tuple[Allocation, int]:
    """The allocation of one prefill pass of ``tokens`` tokens ending at the prompt's last token, and its
    records."""
    stream = prefill_pass(program, target, history + prompt - tokens, tokens, pipeline, history)
    return of_program(program, target, stream)[0], len(stream.records)


def largest_chunk(fits: Callable[[int], bool], prompt: int) -> int:
    """The largest ``c`` in 1..``prompt`` with ``fits(c)`` (``fits`` falls as ``c`` grows), 0 if none."""
    lo, hi = 0, prompt  # fits(lo) holds (0: nothing yet), the answer is at most hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def fit(program: Program, target: PrimalTarget, emit: Callable[[int], Stream], prompt: int, history: int,
        pipeline: bool, forced: int, where: str) -> Fitted:
    """The stream of the chunk ``forced`` (0: the compiler's choice, see the module docstring) and its
    allocation, which fits every scratchpad; else InputError naming ``where`` (module docstring)."""
    chunk = min(forced, prompt) if forced else prompt
    stream = emit(chunk)
    a, decode = of_program(program, target, stream, decode_part(stream))
    if a.fits:
        return Fitted(stream, chunk, a)
    limit, size = 0, {}
    if chunk > 1 and decode is not None and decode.fits:
        windows, end = [x.window for x in program.model.layers], np.array([history + prompt])

        def fits(c: int) -> bool:  # a probe that overwrites keys it reads in a window's ring does not fit either
            if overwriting_layer(program.need_kv(), windows, end - c, end) is not None:
                return False
            a, size[c] = probe(program, target, prompt, c, history, pipeline)
            return a.fits
        limit = largest_chunk(fits, chunk - 1)
    if not forced and limit:
        passes = -(-prompt // limit)
        prefill = sum(x.stop - x.start for x in stream.sections if x.name.startswith("prefill:"))
        records = len(stream.records) - prefill + passes * size.get(limit, 0)
        if records > STREAM_RECORDS_LIMIT:
            raise InputError(where, f"the program fits the scratchpads only in prefill passes of at most {limit} "
                                    f"token(s): {passes:,} passes, about {records:,} records, more than the "
                                    f"{STREAM_RECORDS_LIMIT:,} codegen emits for a chunk it chooses (about 22 GB to "
                                    f"replay); in one pass {overflow(a)} (--memory strict)")
    while not forced and limit:  # the compiler's chunk: the probes' limit, shrunk until the stream fits
        stream = emit(limit)
        a = of_program(program, target, stream)[0]
        if a.fits:
            return Fitted(stream, limit, a)
        limit = limit - max(1, limit // 8) if limit > 1 else 0
    hint = f"; at most {limit} tokens a prefill pass fit" if forced and limit else ""
    what = f"prefill chunk {forced}" if forced else "the program"
    raise InputError(where, f"{what} does not fit the scratchpads: {overflow(a)}{hint} (--memory strict)")
