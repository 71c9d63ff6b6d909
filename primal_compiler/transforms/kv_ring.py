"""Pass ``kv-ring``: allocate the KV-cache ring buffer in the CTs' router scratchpads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from primal_compiler.codegen.kvmap import build_kv_map, occupancy
from primal_compiler.codegen.kvnear import near_map
from primal_compiler.isa.meta import KV_INTERLEAVES
from primal_compiler.ir.facts import Fact, facts
from primal_compiler.passmgr import CONTEXT_RANGE, Pass, option
from primal_compiler.target.table import MAX_SCRATCHPAD_BYTES

if TYPE_CHECKING:
    from primal_compiler.ir.program import Program
    from primal_compiler.target.spec import PrimalTarget


@dataclass(frozen=True)
class KvRing(Pass):
    """Spread K/V of ``context`` tokens x ``batch`` sequences over each layer's scratchpads.

    Chunks of ``chunk_tokens`` tokens (the seed: 2048 tokens = 64 chunks of
    32); ``reserve_bytes`` of every scratchpad stay free for intermediates.
    ``bank_interleave``: ``"token"`` (the seed's: adjacent tokens in
    different banks, each token's vector in one bank) or ``"word"`` (a chunk
    stored contiguously, consecutive bank words in consecutive banks: the
    ablation of the seed's interleave). ``placement``: ``"near"`` puts each
    head's chunks, K and V of a chunk on neighbouring routers, where the
    on-CT hops to its query, append and merge roots are bounded as tightly as
    the layer's routers allow and, within that bound, the byte-hops are least
    (:mod:`primal_compiler.codegen.kvnear`); ``"spread"`` deals the units round
    the layer's routers in chunk-major order (:mod:`primal_compiler.codegen.kvmap`).
    A layer with a sliding window holds a ring of its window and one pass:
    ``window + pass_tokens - 1`` tokens in whole chunks, at most the context
    (``pass_tokens``: the most tokens one pass appends to a sequence, the
    prefill chunk or the prompt; 0 = the context); codegen refuses a longer
    pass. Asking for more than fits is an error naming the largest context and
    batch that do. See :mod:`primal_compiler.codegen.kvmap` for the layout.
    """

    name = "kv-ring"
    summary = "KV-cache ring buffer over the router scratchpads (chunks, ring pointers, bank interleave)"
    requires = facts(Fact.PLACED)
    provides = facts(Fact.KV)

    context: int = option(2048, *CONTEXT_RANGE)
    batch: int = option(1, 1, 1024)  # 128x the seed's batch 8; the KV capacity check bounds it further
    chunk_tokens: int = option(32, *CONTEXT_RANGE)
    reserve_bytes: int = option(2048, 0, MAX_SCRATCHPAD_BYTES)  # at most the largest scratchpad a target may have
    bank_interleave: str = option("token", choices=KV_INTERLEAVES)
    placement: str = option("near", choices=("near", "spread"))
    pass_tokens: int = option(0, 0, CONTEXT_RANGE[1])
    workload_options = {"batch": "batch", "context": "context"}

    def workload_changes(self, workload) -> dict:
        """The workload's batch and context, its prefill chunk (or its prompt: a one-pass prefill) as
        ``pass_tokens``; chunks no longer than a shorter context."""
        changes = super().workload_changes(workload)
        longest = workload.prefill_chunk or workload.prompt
        if longest:
            changes["pass_tokens"] = min(longest, workload.prompt or longest)
        if changes.get("context", self.chunk_tokens) < self.chunk_tokens:
            changes["chunk_tokens"] = changes["context"]
        return changes

    def check(self) -> None:
        if self.context % self.chunk_tokens:
            raise ValueError(f"context {self.context} is not a multiple of chunk_tokens {self.chunk_tokens}")

    def sequences(self, program: Program, target: PrimalTarget) -> int:
        """The most sequences of ``context`` tokens whose keys and values fit the placed program's scratchpads
        (what the largest ``batch`` would allocate); InputError as ``run`` when not even one fits."""
        kv, layer_cts, mesh = self._map(program, target, 1)
        return int(self._occupancy(program, target, kv, layer_cts, mesh)["max_batch_at_context"])

    def _occupancy(self, program: Program, target: PrimalTarget, kv, layer_cts, mesh) -> dict:
        return occupancy(kv, layer_cts, mesh, target.router.scratchpad_bytes,
                         [x.window for x in program.model.layers], self.pass_tokens)

    def _map(self, program: Program, target: PrimalTarget, batch: int):
        layout = program.need_layout()
        layer_cts = [np.flatnonzero(layout.ct_layer == n) for n in range(program.model.num_layers)]
        attn, mesh = program.model.layers[0].attention, (target.ct.mesh_rows, target.ct.mesh_cols)
        kv = build_kv_map(
            layer_cts, mesh, chunk_tokens=self.chunk_tokens, context=self.context, batch=batch,
            kv_heads=attn.num_kv_heads, head_dim=attn.head_dim, kv_bytes=program.model.precision.kv_bits // 8,
            scratchpad_bytes=target.router.scratchpad_bytes, reserve_bytes=self.reserve_bytes,
            banks=target.router.scratchpad_banks, interleave=self.bank_interleave,
            windows=[x.window for x in program.model.layers], pass_tokens=self.pass_tokens, where=self.name,
        )
        return kv, layer_cts, mesh

    def run(self, program: Program, target: PrimalTarget) -> Program:
        kv, layer_cts, mesh = self._map(program, target, self.batch)
        details = {"kv": self._occupancy(program, target, kv, layer_cts, mesh)}
        if self.placement == "near":
            kv, details["kv_placement"] = near_map(program, target, kv, self.name)
        return program.evolve(kv=kv, pending_details=details)
