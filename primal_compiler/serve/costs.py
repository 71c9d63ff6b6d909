"""What each phase of serving costs, read from replays of compiled instruction streams.

The model is placed once (the pipeline's placement passes). A *shape* is a
batch size, a prompt bucket, a history bucket (context save: the tokens of
each sequence's conversation already in the KV cache; 0 for a prompt
prefilled whole) and, with block-sparse encoding, the adapter directory
whose zero blocks are masked; each shape the simulation needs is compiled
(the pipeline's tail on the placed program: ``lora-sparsity`` when
block-sparse encoding is on, ``kv-ring{context,batch}``,
``codegen{prompt=bucket,history=history,steps=2,requests=0;1;1}``,
``srpg{pipeline_config=prefetch}``) and replayed once. Its three requests
load adapter 0 on an idle machine, switch to adapter 1 right after request
0's last token, and run request 2 on adapter 1 with no switch, so one
replay gives the four ways a batch can start, each as the time from the
batch's start to its first tokens and the joules of that interval (the
batch's own records plus every CT's static power over the interval):

- ``idle_switch``: request 0, from its first record (loading on an idle machine);
- ``b2b_switch``: request 1, from request 0's last token (with ``prefetch``
  the loads of a layer's CTs follow that layer's last use of the old
  weights, during request 0's decode, and the next layer's loads overlap
  the prefill of the one before: srpg);
- ``b2b_same``: request 2, from request 1's last token;
- ``idle_same``: the same figures. No request of a stream starts on an idle
  machine with its adapter loaded (request 0 loads its own; a request's
  prefill without its loads still waits for them). From the moment the
  machine is free a batch on the loaded adapter has nothing else to wait
  for, whether it waited or not; the one difference, that request 2's first
  records may be dispatched before request 1's last token and do some work
  early, makes this figure, if anything, short by that head start.

A batch on several adapters (``adapters`` > 1) is the same three requests,
each on that many adapters in runs as even as they go (request 0 on adapters
0..k-1, requests 1 and 2 on k..2k-1: ``codegen{requests=0+0+1+1;2+2+3+3;...}``),
its zero blocks the ``zero_fraction`` sample (zeros every adapter shares).
A switch's exposed cost is its start's time less the same start without a
switch. A decode step is request 2's ITL and energy per token x batch (the
run report's definitions, docs/executor.md) at position ``bucket``. Idle
power is every CT gated, keeping what the replay's power schedule keeps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from primal_compiler import compiled
from primal_compiler.executor import leakage, power
from primal_compiler.executor.cache import ReplayCache
from primal_compiler.executor.metrics import metrics, window_energy_j
from primal_compiler.executor.replay import Replay, replay
from primal_compiler.ir.program import Program
from primal_compiler.isa.opcodes import Opcode, step_ends
from primal_compiler.codegen.residency import sram_slots
from primal_compiler.passmgr import Pass, PassManager, parse_pipeline, print_pipeline
from primal_compiler.serve import BATCHING, SEED_ZERO_FRACTION
from primal_compiler.target.spec import PrimalTarget
from primal_compiler.transforms.kv_ring import KvRing
from primal_compiler.transforms.lora_sparsity import LoraSparsity


@dataclass(frozen=True)
class Policy:
    """The serving optimisations of SEED.md section 6, each switchable (docs/serving.md)."""

    prefetch: bool = True  # SRPG's pipelined reconfiguration, across requests too: srpg{pipeline_config}
    sparse: bool = True  # block-sparse LoRA encoding: CONFIG sends only non-zero blocks (lora-sparsity)
    max_batch: int = 1  # batch up to this many waiting requests (1: no batching)
    # Which waiting requests share a batch (serve/sim.py): "mixed" (the oldest, whatever their adapters, as GPU
    # servers batch; the default), "same-adapter" (the oldest's adapter only), "resident" (the adapters the SRAM-DCIM
    # slots hold first, then any, never more adapters than slots).
    batching: str = "mixed"

    def __post_init__(self) -> None:
        if self.batching not in BATCHING:
            raise ValueError(f"batching must be one of {', '.join(BATCHING)}, got {self.batching!r}")
    zero_fraction: float = SEED_ZERO_FRACTION  # LoRA blocks all zero in every adapter, when sparse
    context_save: bool = True  # a conversation's KV cache stays in the scratchpads for its next turn


@dataclass(frozen=True)
class Shape:
    """Replayed costs of one (batch, prompt bucket) program: per start (module docstring) seconds to the first
    tokens and joules, a decode step's seconds and joules, the LoRA bytes one adapter load writes and the time
    its CONFIG records span on an idle machine (first start to last finish, hidden or not)."""

    batch: int
    bucket: int
    history: int
    adapters: int
    start_s: dict[str, float]
    start_j: dict[str, float]
    step_s: float
    step_j: float
    config_bytes: int
    config_s: float
    tail: str

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def mixed(batch: int, adapters: int, first: int) -> str:
    """A request of ``batch`` sequences on ``adapters`` adapters from id ``first``, in runs as even as they go."""
    return "+".join(str(first + s * adapters // batch) for s in range(batch)) if adapters > 1 else str(first)


def tail(policy: Policy, context: int, batch: int, bucket: int, source: str = "", history: int = 0,
         adapters: int = 1) -> tuple[Pass, ...]:
    """The pipeline tail a shape is compiled with; ``source``: the PEFT directory whose zero blocks the
    block-sparse encoding masks ("": a ``zero_fraction`` sample); ``adapters``: distinct adapters in the batch
    (its three requests: adapters 0.., then ``adapters``.. twice)."""
    saved = f"history={history}," if history else ""
    a, b = mixed(batch, adapters, 0), mixed(batch, adapters, adapters)
    rest = parse_pipeline(f"kv-ring{{context={context},batch={batch}}},codegen{{prompt={bucket},{saved}steps=2,"
                          f"requests={a};{b};{b}}},srpg{{pipeline_config={'true' if policy.prefetch else 'false'}}}")
    if not policy.sparse:
        return rest
    mask = LoraSparsity(adapter=source) if source else LoraSparsity(zero_fraction=policy.zero_fraction)
    return (mask, *rest)


def shape_costs(rp: Replay, batch: int, bucket: int, spec: str, history: int = 0, adapters: int = 1) -> Shape:
    """The figures of one shape's replay (module docstring)."""
    r = rp.stream.records
    sec = {s.name: np.arange(s.start, s.stop) for s in rp.stream.sections}

    def last(name: str) -> int:
        return int(rp.finish[sec[name][step_ends(r[sec[name]])]].max())

    def req(k: int) -> np.ndarray:
        return np.concatenate([sec.get(f"adapter:{k}", np.zeros(0, np.int64)), sec[f"prefill:{k}"]])

    begin = {"idle_switch": (0, int(rp.start[req(0)].min())), "b2b_switch": (1, last("decode:0")),
             "b2b_same": (2, last("decode:1"))}
    start_s, start_j = {}, {}
    for name, (k, t) in begin.items():
        first = last(f"prefill:{k}")
        start_s[name] = rp.seconds(first - t)
        start_j[name] = window_energy_j(rp, req(k), t, first)
    start_s["idle_same"], start_j["idle_same"] = start_s["b2b_same"], start_j["b2b_same"]
    m = metrics(rp, 2)
    load = req(0)[r["op"][req(0)] == Opcode.CONFIG]
    return Shape(batch, bucket, history, adapters, start_s, start_j, m["itl_s"], m["energy_per_token_j"] * batch,
                 int(r["nbytes"][load].astype(np.int64).sum()),
                 rp.seconds(int(rp.finish[load].max()) - int(rp.start[load].min())) if len(load) else 0.0, spec)


def idle_watts(rp: Replay) -> float:
    """Static watts with every CT gated, keeping the SRAM-DCIM macros and scratchpads the replay's power
    schedule keeps (``executor.power``), their leakage at the dies' steady temperature under that power alone
    (``executor.leakage``; an RRAM periphery left powered draws its bias unscaled)."""
    tl = rp.timeline
    n = len(tl.sram_on)
    stated = np.ones(n)
    idle = power.Timeline(np.arange(n), np.full(n, power.GATED, np.int8), np.zeros(n, np.int64),
                          np.ones(n, np.int64), tl.sram_on, tl.scratch_kept, stated,
                          np.full(n, rp.target.thermal.leakage_reference_c))
    bias = power.interval_bias_watts(idle, rp.target, rp.topo.pes)  # one interval per CT; a bias is not scaled
    leak = power.interval_watts(idle, rp.target, rp.topo.pes) - bias  # at the stated leakage
    scale, _ = leakage.steady(bias, leak, rp.topo, rp.target)
    return float((bias + leak * scale).sum())


class CostTable:
    """The shapes of one placed program under one policy, each replayed when first asked for; ``sources``: per
    adapter, the PEFT directory its zero blocks come from ("": the policy's ``zero_fraction`` sample). Each
    shape's replay reads and keeps its schedule in ``cache`` (:mod:`~primal_compiler.executor.cache`)."""

    def __init__(self, placed: Program, target: PrimalTarget, context: int, policy: Policy,
                 say: Callable[[str], None] = lambda line: None, sources: tuple[str, ...] = (),
                 cache: ReplayCache | None = None) -> None:
        self.placed, self.target, self.context, self.policy, self.say = placed, target, context, policy, say
        self.sources, self.cache = sources, cache
        self.shapes: dict[tuple[int, int, int, str, int], Shape] = {}
        self.idle_w: float | None = None
        self.slots = KvRing(context=context).sequences(placed, target)
        self.sram_slots = sram_slots(placed.need_tiles(), target, placed.model.precision.lora_weight_bits)

    def shape(self, batch: int, bucket: int, adapter: int = 0, history: int = 0, adapters: int = 1,
              sample: bool = False) -> Shape:
        """The shape of a batch of ``batch`` on ``bucket`` tokens after ``history`` saved ones switching to
        adapter ``adapter`` (``adapters`` > 1: as many distinct adapters, masked by the ``zero_fraction`` sample,
        zeros every adapter shares; ``sample``: one adapter masked so too); adapters without a directory, and
        every adapter without block-sparse encoding, share one."""
        one = self.policy.sparse and adapters == 1 and not sample and adapter < len(self.sources)
        source = self.sources[adapter] if one else ""
        key = (batch, bucket, history, source, adapters)
        if key not in self.shapes:
            passes = tail(self.policy, self.context, batch, bucket, source, history, adapters)
            spec = print_pipeline(passes)
            saved = f" after {history} saved" if history else ""
            mix = f" on {adapters} adapters" if adapters > 1 else ""
            self.say(f"serve: replaying batch {batch}{mix}, prompt {bucket}{saved}: {spec}")
            program = PassManager(passes).run(self.placed, self.target)
            meta, arrays = compiled.program_file(program, self.target)
            rp = replay(meta, arrays, program.need_stream(), self.target, cache=self.cache, rows=False)
            self.shapes[key] = shape_costs(rp, batch, bucket, spec, history, adapters)
            if self.idle_w is None:
                self.idle_w = idle_watts(rp)
        return self.shapes[key]
