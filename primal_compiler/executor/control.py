"""Who dispatches each record, how fast, and whether each CT's program fits its instruction buffer.

Under ``system.control = "distributed"`` (the default) every CT has a
sequencer that runs, in stream order, the records that CT issues (the
record's ``ct``), one every ``ct.sequencer_issue_cycles``, from a local
instruction buffer of ``ct.instruction_buffer_bytes``; the NMC's sequencer
runs the controller's records, one every ``system.nmc_issue_cycles``.
Cross-CT order comes from the data (:mod:`.deps`: a hand-off's reader waits
for the hand-off) and from ``SYNC`` barriers, not from a global issue order.
Under ``"central"`` the NMC dispatches every record, one every
``system.nmc_issue_cycles``: the machine the executor modelled before, kept
so a user can compare.

A CT's program is what it issues in one request's phases: adapter load,
prefill and one decode step (a prefill record covers all prompt tokens and
decode steps repeat one step's records, so it does not depend on the prompt
or generation length; a pipelined decode step has one pass per sequence; a
prefill cut into chunks by ``codegen{prefill_chunk}`` is one phase a chunk,
cut before each chunk's controller EMBED). When a
CT's three fit its buffer together, the NMC loads them once, before the
first request, through its die-to-die port at ``d2d.bandwidth_bytes_per_s``;
otherwise it reloads each phase's program when the CT has dispatched the
previous phase (:func:`plan`), and that load delays the phase's first
dispatch. A phase that does not fit alone is an error naming the CT, the
phase and the sizes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from primal_compiler.errors import InputError
from primal_compiler.isa.opcodes import CONTROLLER, RECORD, ActFn, Opcode, step_ends

if TYPE_CHECKING:
    from primal_compiler.isa.stream import Stream
    from primal_compiler.target.spec import PrimalTarget


@dataclass(frozen=True)
class Control:
    """The sequencer of every record and each sequencer's dispatch interval."""

    mode: str
    seq: np.ndarray  # int64 per record
    issue_cycles: np.ndarray  # int64 per sequencer
    reload: np.ndarray  # int64 per record: cycles to load its CT's program of the phase it opens (0 none)
    program_bytes: np.ndarray  # int64 per CT: its resident program (distributed), 0 under central control
    load_cycles: int  # NMC cycles to load every CT's program


def _argmax(r: np.ndarray) -> np.ndarray:
    return np.flatnonzero(step_ends(r))


def _step_records(stream: Stream, name: str, passes: int) -> np.ndarray:
    """Records of the first step of section ``name``: up to and including its ``passes``-th controller ARGMAX."""
    for s in stream.sections:
        if s.name == name:
            argmax = _argmax(stream.records[s.start : s.stop])
            stop = s.start + int(argmax[passes - 1]) + 1 if len(argmax) >= passes else s.stop
            return np.arange(s.start, stop)
    return np.zeros(0, dtype=np.int64)


def _passes(stream: Stream, req: str) -> int:
    """Passes per step of request ``req``: its prefill's ARGMAXes (one per sequence when pipelined)."""
    for s in stream.sections:
        if s.name == f"prefill:{req}":
            return max(1, len(_argmax(stream.records[s.start : s.stop])))
    return 1


def _requests(stream: Stream) -> list[str]:
    return sorted({s.name.split(":", 1)[1] for s in stream.sections if ":" in s.name})


def _phases(stream: Stream, req: str) -> list[tuple[str, np.ndarray]]:
    """(name, records) of each phase of request ``req`` that a CT must hold: the adapter load, each chunk of
    the prefill (one chunk unless ``codegen{prefill_chunk}`` cut it), one decode step."""
    n = _passes(stream, req)
    adapter, prefill, decode = (_step_records(stream, f"{kind}:{req}", n) for kind in ("adapter", "prefill", "decode"))
    chunks = _chunks(stream, prefill)
    named = [("prefill", chunks[0])] if len(chunks) == 1 else [(f"prefill chunk {i}", c) for i, c in enumerate(chunks)]
    return [("adapter", adapter), *named, ("decode step", decode)]


def _chunks(stream: Stream, prefill: np.ndarray) -> list[np.ndarray]:
    """The prefill's records cut before each chunk's controller EMBED but the first: a chunked prefill is
    held, and reloaded, chunk by chunk, as a decode step is."""
    r = stream.records[prefill]
    embeds = np.flatnonzero((r["ct"] == CONTROLLER) & (r["op"] == Opcode.ACT) & ((r["arg"] & 0xFF) == ActFn.EMBED))
    return np.split(prefill, embeds[1:]) if len(embeds) > 1 else [prefill]


def _bytes(ct: np.ndarray, rec: np.ndarray, num_cts: int) -> np.ndarray:
    mine = ct[rec]
    return np.bincount(mine[mine < num_cts], minlength=num_cts)[:num_cts] * RECORD.itemsize


def plan(stream: Stream, num_cts: int, cap: int, bw: float, where: str) -> tuple[np.ndarray, np.ndarray, int]:
    """(reload cycles per record, resident bytes per CT, deployment load cycles).

    Per request and CT: when its adapter, prefill and decode-step programs fit the buffer together,
    the NMC loads them once at deployment; otherwise each phase's program must fit alone, and the NMC
    reloads it when the CT has dispatched its previous phase (``reload`` on the CT's first record of
    the phase: that program's bytes over the die-to-die port). InputError naming the CT, the section
    and the sizes when one phase does not fit.
    """
    r = stream.records
    ct = r["ct"].astype(np.int64)
    reload = np.zeros(len(r), dtype=np.int64)
    resident = np.zeros(num_cts, dtype=np.int64)
    initial = np.zeros(num_cts, dtype=np.int64)
    reqs = _requests(stream) or ["-"]
    for req in reqs:
        named = _phases(stream, req) if req != "-" else [("stream", np.arange(len(r)))]
        phases = [p for _, p in named]
        sizes = np.stack([_bytes(ct, p, num_cts) for p in phases])
        worst = sizes.max(axis=0)
        if (worst > cap).any():
            c = int(np.argmax(worst))
            kind = named[int(np.argmax(sizes[:, c]))][0]
            raise InputError(where, f"CT {c}'s {kind} program of request {req} is {int(worst[c]):,} B, more than its "
                                    f"{cap:,} B instruction buffer (ct.instruction_buffer_bytes); "
                                    f"{int((worst > cap).sum())} CTs overflow")
        whole = sizes.sum(axis=0) <= cap
        resident = np.maximum(resident, np.where(whole, sizes.sum(axis=0), worst))
        initial = np.maximum(initial, np.where(whole, sizes.sum(axis=0), sizes[0]))
        for k in range(1, len(phases)):
            sec = phases[k]
            mine = sec[(ct[sec] < num_cts)]
            cts, first = np.unique(ct[mine], return_index=True)
            need = ~whole[cts]
            reload[mine[first[need]]] = np.ceil(sizes[k][cts[need]] / bw).astype(np.int64)
    return reload, resident, int(np.ceil(initial.sum() / bw))


def control(stream: Stream, target: PrimalTarget, num_cts: int, where: str = "program", mode: str | None = None) -> Control:
    """The dispatch plan of ``stream`` under ``mode`` (default: the target's ``system.control``).

    InputError naming ``where``, the CT, the request and the sizes when a CT's program overflows
    its instruction buffer (distributed control only).
    """
    mode = mode or target.system.control
    ct = stream.records["ct"].astype(np.int64)
    nmc = int(target.system.nmc_issue_cycles)
    bw = target.d2d.bandwidth_bytes_per_s / target.system.clock_hz
    if mode == "central":
        total = len(stream.records) * RECORD.itemsize
        zero = np.zeros(len(ct), dtype=np.int64)
        return Control(mode, zero, np.array([nmc], dtype=np.int64), zero,
                       np.zeros(num_cts, dtype=np.int64), int(np.ceil(total / bw)) if total else 0)
    if mode != "distributed":
        raise InputError(where, f"control must be distributed or central, not {mode!r}")
    reload, size, load = plan(stream, num_cts, int(target.ct.instruction_buffer_bytes), bw, where)
    seq = np.where(ct == CONTROLLER, num_cts, ct)
    issue = np.full(num_cts + 1, int(target.ct.sequencer_issue_cycles), dtype=np.int64)
    issue[num_cts] = nmc
    return Control(mode, seq, issue, reload, size, load)
