"""Whole default compile and replay, pass by pass: Llama-2-13B and Llama-2-70B (LoRA r=8 on Q,V).

Runs the bundled ``default`` pipeline one pass at a time (codegen's own
default: one decode step in the stream), then builds the program file and
replays it as ``primal run`` does (hop validation, H100 point and GPU
baseline family included). ``primal run`` itself compiles three decode
steps for its 64-token generation (docs/executor.md, Steady-state decode),
which adds two steps' replay to these figures; ``--primal-run`` measures that
instead (the pipeline with ``primal run``'s workload: codegen{steps=3,generate=64},
the steady-state extension in the replay). For every stage it prints wall
seconds and the peak resident memory seen while the stage ran: this
process's RSS, and the sum of its live child processes' RSS (the GA's
worker pool), sampled every 20 ms from ``/proc`` (Linux; elsewhere only the
final ``ru_maxrss`` is printed), and the CPU seconds of the process and its
reaped workers, which depend less on what else the machine runs. Goals (issue 17): 13B compile + replay at
most 30 s and 4 GiB on 2 cores, 70B at most 60 s and 8 GiB; ``primal --help`` first (issue 54: under 0.5 s).
The replay keeps its schedule in a temporary replay cache (hashing and writing it are in its time), and a last
line replays again from that cache, as a second ``primal run``, ``viz`` or ``thermal`` of the program would.
Run: python benchmarks/compile.py [--primal-run] [model ...]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from primal_compiler.compiled import Compiled
from primal_compiler.executor.cache import ReplayCache
from primal_compiler.report.collect import replay_report
from primal_compiler.frontend import load_model
from primal_compiler.ir.program import Program
from primal_compiler.passmgr import PassManager
from primal_compiler.pipeline import Pipeline, Workload
from primal_compiler.target import load_target

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _rss(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


class Sampler:
    """Peak RSS of this process and of the sum of its children since the last :meth:`reset`."""

    def __init__(self, every_s: float = 0.02) -> None:
        self.every_s, self.own, self.kids = every_s, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        me = os.getpid()
        self.own = max(self.own, _rss(me))
        self.kids = max(self.kids, sum(_rss(c) for c in _children(me)))

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self._sample()

    def reset(self) -> tuple[int, int]:
        """Peaks since the last reset (sampled once more now, so a stage shorter than a period counts)."""
        self._sample()
        peak = (self.own, self.kids)
        self.own = self.kids = 0
        return peak

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def _cpu() -> float:
    """CPU seconds (user + system) of this process and of its reaped children (the GA's pool, once shut down)."""
    return sum(r.ru_utime + r.ru_stime for r in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))


def _line(name: str, seconds: float, cpu: float, peak: tuple[int, int]) -> str:
    own, kids = peak
    return (f"    {name:<16} {seconds:7.2f} s   CPU {cpu:7.2f} s   RSS {own / 2**30:5.2f} GiB   "
            f"workers {kids / 2**30:5.2f} GiB")


def help_seconds(repeats: int = 3, args: tuple[str, ...] = ("--help",)) -> float:
    """Fastest wall time of ``primal ARGS`` (``--help``) in a fresh interpreter (issue 54's goal: under 0.5 s)."""
    code = f"from primal_compiler.cli import main; main({list(args)!r})"
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], capture_output=True, check=False)
        times.append(time.perf_counter() - t0)
    return min(times)


def main(models: list[str], primal_run: bool) -> None:
    from primal_compiler.passmgr import DEFAULT_GENERATE, DEFAULT_REPLAYED

    print(f"primal --help: {help_seconds():.2f} s (fastest of 3, a fresh interpreter each)", flush=True)
    error = help_seconds(args=("run", "tiny-llama", "--context", "0"))
    print(f"primal run tiny-llama --context 0 (an option's range error): {error:.2f} s", flush=True)
    target = load_target("primal-7nm")
    pipeline = Pipeline.parse("default")
    if primal_run:
        pipeline = pipeline.for_workload(Workload(steps=DEFAULT_REPLAYED, generate=DEFAULT_GENERATE))
    sampler = Sampler()
    try:
        for name in models:
            sampler.reset()
            start, cpu0 = time.perf_counter(), _cpu()
            program = Program(model=load_model(name, "q,v:8"))
            lines = [_line("load", time.perf_counter() - start, _cpu() - cpu0, sampler.reset())]
            for p in pipeline.passes:
                t0, c0 = time.perf_counter(), _cpu()
                program = PassManager((p,)).run(program, target)
                lines.append(_line(p.name, time.perf_counter() - t0, _cpu() - c0, sampler.reset()))
            t0, c0 = time.perf_counter(), _cpu()
            compiled = Compiled.of(program, target, f"<{name}>")
            lines.append(_line("program-file", time.perf_counter() - t0, _cpu() - c0, sampler.reset()))
            compile_s = time.perf_counter() - start
            with tempfile.TemporaryDirectory() as tmp:  # a replay cache of this run's own, empty at first
                cache = ReplayCache(Path(tmp))
                t0, c0 = time.perf_counter(), _cpu()
                replay_report(compiled, cache=cache)
                lines.append(_line("replay", time.perf_counter() - t0, _cpu() - c0, sampler.reset()))
                total = time.perf_counter() - start
                t0, c0 = time.perf_counter(), _cpu()
                replay_report(compiled, cache=cache)
                lines.append(_line("replay (cached)", time.perf_counter() - t0, _cpu() - c0,
                                   sampler.reset()))
            peak_kib = max(resource.getrusage(w).ru_maxrss for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
            print(f"{name}{' (primal run)' if primal_run else ''}: compile {compile_s:.1f} s + replay {total - compile_s:.1f} s = {total:.1f} s "
                  f"({_cpu() - cpu0:.1f} CPU s), "
                  f"ru_maxrss (largest of process, children) {peak_kib / 2**20:.2f} GiB, {os.cpu_count()} CPUs, "
                  f"load {os.getloadavg()[0]:.2f}")
            print("\n".join(lines), flush=True)
    finally:
        sampler.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--primal-run", action="store_true",
                    help="primal run's own default: three decode steps compiled for a 64-token generation")
    ap.add_argument("models", nargs="*", default=["llama2-13b", "llama2-70b"])
    args = ap.parse_args()
    main(args.models, args.primal_run)
