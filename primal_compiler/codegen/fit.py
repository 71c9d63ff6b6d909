"""Programs that fit the scratchpads (``codegen{memory=strict}``): the prefill chunk codegen chooses, or the
refusal of one that does not fit.

A prefill pass of ``c`` tokens holds every activation buffer for ``c``
vectors, so the compiler's allocation (:mod:`primal_compiler.executor.allocation`)
grows with ``c``. With no chunk forced (``prefill_chunk=0``) the whole
prompt stays one pass when the program fits; otherwise codegen takes the
largest chunk whose pass fits, found by bisection on *probes*: one prefill
pass of ``c`` tokens ending at the prompt's last token (the largest
attention of any chunk of ``c`` tokens), LM head and ARGMAX included. The
stream emitted with that chunk is allocated again and the chunk shrunk
until it fits (a probe bounds, it does not prove). A program that does not
fit with any chunk (even the decode step's buffers overflow), or a forced
chunk that does not, is refused, naming the PE, its bytes and buffers and,
when a smaller chunk fits, the largest that does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from primal_compiler.codegen.emit import prefill_pass
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


def probe(program: Program, target: PrimalTarget, prompt: int, tokens: int, history: int,
          pipeline: bool) -> Allocation:
    """The allocation of one prefill pass of ``tokens`` tokens ending at the prompt's last token."""
    return of_program(program, target, prefill_pass(program, target, history + prompt - tokens, tokens, pipeline,
                                                    history))[0]


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
    limit = 0
    if chunk > 1 and decode is not None and decode.fits:
        limit = largest_chunk(lambda c: probe(program, target, prompt, c, history, pipeline).fits, chunk - 1)
    while not forced and limit:  # the compiler's chunk: the probes' limit, shrunk until the stream fits
        stream = emit(limit)
        a = of_program(program, target, stream)[0]
        if a.fits:
            return Fitted(stream, limit, a)
        limit = limit - max(1, limit // 8) if limit > 1 else 0
    hint = f"; at most {limit} tokens a prefill pass fit" if forced and limit else ""
    what = f"prefill chunk {forced}" if forced else "the program"
    raise InputError(where, f"{what} does not fit the scratchpads: {overflow(a)}{hint} (--memory strict)")
