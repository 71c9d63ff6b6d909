"""Distributed control (a sequencer per CT) against central control (the NMC alone), by hand."""

from __future__ import annotations

import numpy as np
import pytest

from primal_compiler.api import compile_model
from primal_compiler.errors import InputError
from primal_compiler.executor.control import control
from primal_compiler.executor.replay import replay
from primal_compiler.frontend import load_model
from primal_compiler.isa.opcodes import ActFn, BufKind, Opcode, buf
from primal_compiler.isa.stream import StreamBuilder
from primal_compiler.target import load_target, with_overrides

META = {"num_cts": 2, "mesh_rows": 4, "mesh_cols": 4, "num_layers": 1, "package_cols": 2}


def _target(seq: int, nmc: int):
    return with_overrides(load_target("primal-7nm"), {"ct.mesh_rows": 4, "ct.mesh_cols": 4,
                                                       "ct.sequencer_issue_cycles": seq, "system.nmc_issue_cycles": nmc})


def _two_cts(n: int):
    """``n`` independent one-element ACTs on each of CT 0 and CT 1, interleaved, each on its own PE."""
    b = StreamBuilder()
    for i in range(n):
        for ct in (0, 1):
            b.records(1, op=Opcode.ACT, ct=ct, pe=i, dst_buf=buf(BufKind.ROOT, 0), arg=ActFn.EMBED, count=1)
    return b.build()


def test_distributed_sequencers_dispatch_in_parallel_and_central_in_one_line():
    stream, n = _two_cts(8), 8
    t = _target(seq=5, nmc=3)
    dist = replay(META, {}, stream, t)
    cent = replay(META, {}, stream, t, mode="central")
    k = np.arange(2 * n) // 2  # position of each record in its CT's own program
    assert dist.dispatch.tolist() == (k * 5).tolist()
    assert cent.dispatch.tolist() == (np.arange(2 * n) * 3).tolist()
    busy = dist.busy
    assert dist.finish.tolist() == (k * 5 + busy).tolist()  # independent records start at dispatch
    assert dist.end == (n - 1) * 5 + busy.max() and cent.end == (2 * n - 1) * 3 + busy.max()


def test_an_unknown_control_mode_is_refused():
    with pytest.raises(InputError, match="control must be distributed or central"):
        control(_two_cts(1), _target(1, 1), 2, mode="round-robin")


def _phase_bytes(program, n: int) -> dict[str, np.ndarray]:
    """Bytes per CT of request 0's adapter, prefill and first decode step (one ARGMAX per pass)."""
    r = program.stream.records
    argmax = (r["op"] == Opcode.ACT) & (r["arg"] == ActFn.ARGMAX) & (r["ct"] == 0xFFFE)
    sec = {s.name: s for s in program.stream.sections}
    passes = int(argmax[sec["prefill:0"].start : sec["prefill:0"].stop].sum())
    d = sec["decode:0"]
    step_end = d.start + int(np.flatnonzero(argmax[d.start : d.stop])[passes - 1]) + 1
    out = {}
    for name, (a, b) in (("adapter", (sec["adapter:0"].start, sec["adapter:0"].stop)),
                         ("prefill", (sec["prefill:0"].start, sec["prefill:0"].stop)), ("decode step", (d.start, step_end))):
        ct = r["ct"][a:b]
        out[name] = np.bincount(ct[ct < n], minlength=n)[:n] * 32
    return out


def test_a_phase_larger_than_its_instruction_buffer_is_named(compiled, small_target):
    program, meta, arrays = compiled
    n = int(meta["num_cts"])
    phases = _phase_bytes(program, n)
    kind = max(phases, key=lambda k: phases[k].max())
    worst = phases[kind]
    tight = with_overrides(small_target, {"ct.instruction_buffer_bytes": int(worst.max()) - 32})
    with pytest.raises(InputError, match=rf"CT {int(np.argmax(worst))}'s {kind} program of request 0 is "
                                         rf"{int(worst.max()):,} B, more than its {int(worst.max()) - 32:,} B"):
        replay(meta, arrays, program.stream, tight)
    assert replay(meta, arrays, program.stream, small_target, mode="central").end > 0  # central: no CT buffer


def test_phases_that_fit_only_one_at_a_time_are_reloaded_and_cost_time(compiled, small_target):
    """Buffer = the largest phase: each CT reloads its prefill and decode programs, on the NMC's one port."""
    program, meta, arrays = compiled
    whole = control(program.stream, small_target, int(meta["num_cts"]))
    assert not whole.reload.any()  # the default buffer holds every CT's whole program
    r, n = program.stream.records, int(meta["num_cts"])
    biggest = max(int(v.max()) for v in _phase_bytes(program, n).values())
    tight = with_overrides(small_target, {"ct.instruction_buffer_bytes": biggest})
    c = control(program.stream, tight, n)
    bw = tight.d2d.bandwidth_bytes_per_s / tight.system.clock_hz
    opened = np.flatnonzero(c.reload)
    assert len(opened) and (r["ct"][opened] < n).all()
    assert (c.reload[opened] <= np.ceil(biggest / bw)).all()
    slow, fast = replay(meta, arrays, program.stream, tight), replay(meta, arrays, program.stream, small_target)
    for i in opened:  # a phase's first record waits for its load, which starts once the CT is done with the last
        before = np.flatnonzero(r["ct"][:i] == r["ct"][i])
        assert slow.dispatch[i] >= slow.dispatch[before[-1]] + 1 + c.reload[i]
    assert slow.end >= fast.end  # the loads may hide behind other CTs' work, never make it faster


def test_the_program_is_adapter_prefill_and_one_decode_step_per_ct(compiled, small_target):
    program, meta, _ = compiled
    n = int(meta["num_cts"])
    c = control(program.stream, small_target, n)
    whole = sum(_phase_bytes(program, n).values())
    assert (c.program_bytes >= whole).all()  # request 1 may be larger; never smaller than request 0
    bw = small_target.d2d.bandwidth_bytes_per_s / small_target.system.clock_hz
    assert c.load_cycles == int(np.ceil(c.program_bytes.sum() / bw))  # everything fits: loaded once


def test_a_chunked_prefill_is_held_chunk_by_chunk(small_target):
    """codegen{prefill_chunk}: each chunk's program is a phase of its own, cut before the chunk's controller EMBED,
    so a buffer too small for the whole prefill holds it chunk by chunk, reloading each (issue 48)."""
    from primal_compiler.compiled import program_file

    chunked = "lower-tiles,blocking,zcurve-order,kv-ring{context=64},codegen{prefill_chunk=16,steps=1},srpg"
    program = compile_model(load_model("tiny-llama", "q,v:8"), small_target, chunked)
    meta, arrays = program_file(program, small_target)
    n, r = int(meta["num_cts"]), program.stream.records
    sec = next(s for s in program.stream.sections if s.name == "prefill:0")
    embeds = sec.start + np.flatnonzero((r["ct"][sec.start:sec.stop] == 0xFFFE)
                                        & (r["op"][sec.start:sec.stop] == Opcode.ACT)
                                        & (r["arg"][sec.start:sec.stop] & 0xFF == ActFn.EMBED))
    assert len(embeds) == 4  # a 63-token prompt in chunks of 16
    bounds = [sec.start, *embeds[1:], sec.stop]
    per_chunk = [np.bincount(r["ct"][a:b][r["ct"][a:b] < n], minlength=n)[:n] * 32 for a, b in zip(bounds, bounds[1:])]
    others = _phase_bytes(program, n)  # the adapter and the decode step must fit too
    whole = int(sum(per_chunk).max())
    cap = max(*(int(c.max()) for c in per_chunk), int(others["adapter"].max()), int(others["decode step"].max()))
    assert cap < whole  # the prefill in one piece would not fit
    tight = with_overrides(small_target, {"ct.instruction_buffer_bytes": cap})
    c = control(program.stream, tight, n)
    for start in embeds[1:]:  # every CT of a later chunk reloads its program before the chunk's first record
        first = [int(i) for i in np.flatnonzero(r["ct"][start:sec.stop] < n) + start]
        cts = {int(r["ct"][i]) for i in first}
        opened = {int(r["ct"][i]) for i in first if c.reload[i] > 0}
        assert opened and opened <= cts
    assert replay(meta, arrays, program.stream, tight).end > 0
