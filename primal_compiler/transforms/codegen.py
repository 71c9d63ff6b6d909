"""Pass ``codegen``: emit the IPCN instruction stream of the placed program."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from primal_compiler.codegen.emit import emit_stream
from primal_compiler.codegen.fit import fit
from primal_compiler.codegen.kvmap import keys_seen, overwriting_layer
from primal_compiler.executor.allocation import summary
from primal_compiler.errors import InputError
from primal_compiler.isa.opcodes import HIDDEN_SHARDS, Opcode
from primal_compiler.ir.facts import Fact, facts
from primal_compiler.mapping.traffic import shards
from primal_compiler.passmgr import CONTEXT_RANGE, MAX_GENERATE, Pass, option

if TYPE_CHECKING:
    from primal_compiler.ir.program import Program
    from primal_compiler.isa.stream import Stream
    from primal_compiler.target.spec import PrimalTarget


#: Requests one program may serve: each emits its own prefill (1.3 M records for Llama-2-13B), so 64 are
#: already a stream of several GiB. Adapter ids are labels compared for equality; 16 bits are plenty.
MAX_REQUESTS = 64
MAX_ADAPTER_ID = 0xFFFF


def parse_requests(text: str) -> tuple[tuple[int, ...], ...]:
    """Per request, the adapter id of each sequence of its batch, e.g. ``"0;1+1+2+3;0"`` (``+`` between a
    mixed batch's sequences; one id: every sequence); ``ValueError`` naming ``requests`` on anything else."""
    parts = text.split(";")
    if len(parts) > MAX_REQUESTS:
        raise ValueError(f"requests lists {len(parts)} requests; at most {MAX_REQUESTS}")
    try:
        ids = tuple(tuple(int(x) for x in part.split("+")) for part in parts)
    except ValueError:
        raise ValueError("requests must be ';'-separated requests, each an adapter id or '+'-separated ids (one "
                         f"per sequence), got {text[:60]!r}") from None
    flat = [a for request in ids for a in request]
    if not 0 <= min(flat) <= max(flat) <= MAX_ADAPTER_ID:
        raise ValueError(f"requests must be adapter ids in 0..{MAX_ADAPTER_ID}, got {text[:60]!r}")
    return ids


@dataclass(frozen=True)
class Codegen(Pass):
    """Emit, per request, the adapter load, the prefill of ``prompt`` tokens and ``steps`` decode steps.

    ``prompt`` = 0 means the KV map's context minus one minus ``history``, so
    the (first) decode step attends over the full context. Decode step s sits at position
    ``prompt + s`` and ends with the controller's ARGMAX; positions past the
    context wrap around the KV ring (the oldest token is overwritten, so a
    query attends to the last ``context`` tokens). ``requests`` lists each
    request's adapter id, or (``+``-separated) each of its sequences' (a
    mixed batch): the SRAM-DCIM macros hold as many adapters as their slots
    (codegen/residency.py) and an adapter no slot holds is written (CONFIG)
    before the pass that needs it. Batch and context come from
    ``kv-ring``. ``history`` (context save): each request continues a
    conversation whose first ``history`` tokens are already in its KV slots
    (saved from an earlier turn on its adapter), so its prompt is prefilled
    from that position over the saved keys and values, not recomputed.
    """

    name = "codegen"
    summary = "emit the IPCN instruction stream (adapter loads, prefill, decode steps)"
    requires = facts(Fact.PLACED, Fact.KV)
    provides = facts(Fact.STREAM)

    prompt: int = option(0, 0, CONTEXT_RANGE[1] - 1)  # 0 = context - 1 - history; one decoded token must fit after it
    requests: str = option("0")
    # Decode steps per request: 4096, a whole Llama-2 context of generated tokens (past the context the
    # KV ring wraps, so longer runs repeat the same work).
    steps: int = option(1, 1, 4096)
    # Tokens per sequence the program generates; 0 = steps. The stream holds the first `steps` decode steps and a
    # replay repeats its periodic last step for the rest (executor/steady.py), so a long generation costs a few
    # replayed steps: primal run generates 64 tokens from 3 replayed steps by default.
    generate: int = option(0, 0, MAX_GENERATE)
    # Batch > 1: one pass per sequence, so the layers work on different sequences at once (docs/executor.md).
    pipeline: bool = option(True)
    # Prompt tokens per prefill pass: chunks stream through the layer pipeline; 0 = the whole prompt in one pass,
    # or under memory=strict the compiler's choice: the whole prompt if it fits, else the largest chunk that does.
    prefill_chunk: int = option(0, 0, CONTEXT_RANGE[1])
    # "strict": the program must fit the scratchpads (codegen/fit.py): the prefill is chunked to fit, and a
    # program or forced chunk that overflows is refused naming the PE, its buffers and the bytes.
    memory: str = option("report", choices=("report", "strict"))
    # Tokens of each request's conversation already in the KV cache before its prompt (context save).
    history: int = option(0, 0, CONTEXT_RANGE[1] - 2)
    # Where LoRA weights live: "resident" in the SRAM-DCIM macros for the whole request (loaded once, again when
    # the adapter changes), or "per-token": rewritten from the controller at every pass, each layer's in the
    # background of the previous layer once srpg pipelines it (the seed's SRPG; codegen/emit.py).
    lora_residency: str = option("resident", choices=("resident", "per-token"))
    workload_options = {"prompt": "prompt", "steps": "steps", "generate": "generate", "prefill_chunk": "prefill_chunk",
                        "memory": "memory"}

    def workload_changes(self, workload) -> dict:
        """The workload's prompt and steps; with ``adapters`` adapter directories, the default of one request
        on adapter 0 becomes one request per adapter (0, 1, ...), and requests naming an adapter beyond them
        are an InputError naming ``--adapter``."""
        changes = super().workload_changes(workload)
        adapters = workload.adapters
        if adapters < 1:
            return changes
        requests = ";".join(str(k) for k in range(adapters)) if adapters > 1 and self.requests == "0" else self.requests
        top = max(a for request in parse_requests(requests) for a in request)
        if top >= adapters:
            given = f"{adapters} --adapter director{'ies were' if adapters > 1 else 'y was'} given"
            raise InputError("--adapter", f"codegen{{requests={self.requests}}} names adapter {top}, but {given}")
        return {**changes, "requests": requests} if requests != self.requests else changes

    def check(self) -> None:
        parse_requests(self.requests)
        if self.generate and self.generate < self.steps:
            raise ValueError(f"generate {self.generate} is below steps {self.steps}: a generation covers at least "
                             "the decode steps in the stream")
        if self.generate > self.steps < 2:
            raise ValueError(f"generate {self.generate} needs at least 2 decode steps in the stream (steps "
                             f"{self.steps}) to show the decode settled and repeat it (executor/steady.py)")

    def run(self, program: Program, target: PrimalTarget) -> Program:
        kv = program.need_kv()
        if self.history + 2 > kv.context:
            raise InputError(f"{self.name}.history", f"history {self.history} leaves no room for a prompt token "
                                                     f"and a decoded token in the KV context {kv.context} "
                                                     "allocated by kv-ring")
        prompt = self.prompt or kv.context - 1 - self.history
        if self.history + prompt + 1 > kv.context:
            saved = f"history {self.history} + " if self.history else ""
            raise InputError(f"{self.name}.prompt", f"{saved}prompt {prompt} + 1 decoded token exceeds the KV "
                                                    f"context {kv.context} allocated by kv-ring")
        hd = program.model.attention.head_dim
        if any(x.qk_norm for x in program.model.layers) and target.rram.cols % hd:
            raise InputError(f"pass {self.name}", f"model {program.model.name}: its q/k head norms need whole heads at "
                                                  f"each root, and head size {hd} does not divide the crossbar's "
                                                  f"{target.rram.cols} columns")
        if hd % 8:  # every router offset the ISA packs is in units of 8 elements (docs/isa.md)
            raise InputError(f"pass {self.name}", f"model {program.model.name}: head size {hd} is not a multiple of "
                                                  "8, the unit of the ISA's element offsets")
        h, rows = program.model.hidden_size, target.rram.rows
        if shards(h, rows) > HIDDEN_SHARDS:  # a HIDDEN tag names its shard in 8 bits (docs/isa.md)
            raise InputError(f"pass {self.name}", f"model {program.model.name}: hidden size {h} needs "
                                                  f"{shards(h, rows)} hub shards of rram.rows {rows}, more than the "
                                                  f"{HIDDEN_SHARDS} a buffer tag names")
        requests = parse_requests(self.requests)
        for r, request in enumerate(requests):
            if len(request) not in (1, kv.batch):
                raise InputError(f"{self.name}.requests", f"request {r} names {len(request)} adapters; a batch of "
                                                          f"{kv.batch} (kv-ring) takes one, or one per sequence")
            if len(set(request)) > 1 and not self.pipeline:
                raise InputError(f"{self.name}.requests", f"request {r} mixes adapters, which needs pipeline=true "
                                                          "(one pass per sequence: a pass reads one SRAM slot)")

        self._rings_hold(program, prompt, min(self.prefill_chunk or prompt, prompt))

        def emit(chunk: int) -> Stream:
            return emit_stream(program, target, prompt, requests, self.steps, self.pipeline, chunk, self.history,
                               self.lora_residency == "per-token")

        fitted, chunk = None, min(self.prefill_chunk or prompt, prompt)
        if self.memory == "strict":
            fitted = fit(program, target, emit, prompt, self.history, self.pipeline, self.prefill_chunk,
                         f"pass {self.name}")
            stream, chunk = fitted.stream, fitted.chunk
        else:
            stream = emit(self.prefill_chunk)
        ops = np.bincount(stream.records["op"], minlength=len(Opcode))
        details = {
            "records": len(stream), "groups": stream.num_groups, "bytes": stream.nbytes, "prompt": prompt,
            "steps": self.steps, "generate": self.generate or self.steps, "pipeline": self.pipeline,
            "prefill_chunk": chunk,
            "history": self.history, "lora_residency": self.lora_residency,
            "sections": {s.name: s.stop - s.start for s in stream.sections},
            "opcodes": {op.name: int(ops[op]) for op in Opcode if ops[op]},
        }
        if fitted:
            details["scratchpad"] = summary(fitted.allocation)
        return program.evolve(stream=stream, pending_details=details)

    def _rings_hold(self, program: Program, prompt: int, chunk: int) -> None:
        """InputError when a prefill pass of ``chunk`` tokens would append over a key its own queries read
        in a layer's ring (a sliding layer's ring holds its window and kv-ring's ``pass_tokens`` less one)."""
        kv, layers = program.need_kv(), program.model.layers
        starts = np.arange(self.history, self.history + prompt, chunk)
        n = overwriting_layer(kv, [x.window for x in layers], starts, np.minimum(starts + chunk, self.history + prompt))
        if n is not None:
            ring = kv.rings[n]
            seen = keys_seen(layers[n].window, ring)
            raise InputError(f"{self.name}.prefill_chunk",
                             f"a prefill pass of {chunk} tokens would overwrite keys it reads in layer {n}'s "
                             f"ring of {ring} tokens (its {layers[n].window}-token window and kv-ring's "
                             f"pass_tokens); prefill in chunks of at most {ring - seen + 1} tokens or give "
                             f"kv-ring pass_tokens={chunk}")
