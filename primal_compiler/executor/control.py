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

The NMC loads every CT's program once, before the first request (the
program does not depend on the prompt, batch or generation length: a prefill
record covers all prompt tokens and decode steps repeat one step's
records), through its die-to-die port at ``d2d.bandwidth_bytes_per_s``, one
CT after another. A CT's program is what it issues in one request's
sections: adapter load, prefill and one decode step. A program that does not
fit its CT's buffer is an error naming the CT, the section and the sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from primal_compiler.errors import InputError
from primal_compiler.isa.opcodes import CONTROLLER, RECORD, ActFn, Opcode


@dataclass(frozen=True)
class Control:
    """The sequencer of every record and each sequencer's dispatch interval."""

    mode: str
    seq: np.ndarray  # int64 per record
    issue_cycles: np.ndarray  # int64 per sequencer
    program_bytes: np.ndarray  # int64 per CT: its resident program (distributed), 0 under central control
    load_cycles: int  # NMC cycles to load every CT's program

    @property
    def controller(self) -> int:
        """Sequencer index of the NMC."""
        return len(self.issue_cycles) - 1


def _step_records(stream, name: str) -> np.ndarray:
    """Records of the first step of section ``name`` (up to and including its first controller ARGMAX)."""
    for s in stream.sections:
        if s.name == name:
            r = stream.records[s.start : s.stop]
            argmax = np.flatnonzero((r["op"] == Opcode.ACT) & (r["arg"] == ActFn.ARGMAX) & (r["ct"] == CONTROLLER))
            stop = s.start + int(argmax[0]) + 1 if len(argmax) else s.stop
            return np.arange(s.start, stop)
    return np.zeros(0, dtype=np.int64)


def _requests(stream) -> list[str]:
    return sorted({s.name.split(":", 1)[1] for s in stream.sections if ":" in s.name})


def resident_program(stream, num_cts: int) -> tuple[np.ndarray, np.ndarray]:
    """(bytes per CT, the request whose program is largest per CT): records issued in one request's
    adapter, prefill and first decode step, times the record size."""
    ct = stream.records["ct"].astype(np.int64)
    best = np.zeros(num_cts, dtype=np.int64)
    which = np.zeros(num_cts, dtype=np.int64)
    for i, req in enumerate(_requests(stream)):
        rec = np.concatenate([_step_records(stream, f"{kind}:{req}") for kind in ("adapter", "prefill", "decode")])
        mine = ct[rec]
        size = np.bincount(mine[mine < num_cts], minlength=num_cts)[:num_cts] * RECORD.itemsize
        more = size > best
        best[more], which[more] = size[more], i
    if not _requests(stream):  # a stream without request sections: the whole stream is the program
        mine = ct[ct < num_cts]
        best = np.bincount(mine, minlength=num_cts)[:num_cts] * RECORD.itemsize
    return best, which


def control(stream, target, num_cts: int, where: str = "program", mode: str | None = None) -> Control:
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
        return Control(mode, np.zeros(len(ct), dtype=np.int64), np.array([nmc], dtype=np.int64),
                       np.zeros(num_cts, dtype=np.int64), int(np.ceil(total / bw)) if total else 0)
    if mode != "distributed":
        raise InputError(where, f"control must be distributed or central, not {mode!r}")
    size, which = resident_program(stream, num_cts)
    cap = int(target.ct.instruction_buffer_bytes)
    over = np.flatnonzero(size > cap)
    if len(over):
        c = int(over[np.argmax(size[over])])
        req = _requests(stream)[int(which[c])] if _requests(stream) else "-"
        raise InputError(where, f"CT {c}'s program for request {req} (adapter, prefill, one decode step) is "
                                f"{int(size[c]):,} B, more than its {cap:,} B instruction buffer "
                                f"(ct.instruction_buffer_bytes); {len(over)} CTs overflow")
    seq = np.where(ct == CONTROLLER, num_cts, ct)
    issue = np.full(num_cts + 1, int(target.ct.sequencer_issue_cycles), dtype=np.int64)
    issue[num_cts] = nmc
    return Control(mode, seq, issue, size, int(np.ceil(size.sum() / bw)))
