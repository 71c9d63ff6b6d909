"""Pass ``codegen``: emit the IPCN instruction stream of the placed program."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from primal_compiler.codegen.emit import emit_stream
from primal_compiler.errors import InputError
from primal_compiler.isa.opcodes import Opcode
from primal_compiler.passmgr import Pass


def parse_requests(text: str, where: str) -> tuple[int, ...]:
    """Adapter id of each request, e.g. ``"0;1;0"``; InputError on anything else."""
    try:
        ids = tuple(int(x) for x in text.split(";"))
    except ValueError:
        raise InputError(where, f"requests must be ';'-separated adapter ids, got {text!r}") from None
    if not ids or min(ids) < 0:
        raise InputError(where, f"requests must be non-negative adapter ids, got {text!r}")
    return ids


@dataclass(frozen=True)
class Codegen(Pass):
    """Emit, per request, the adapter load, the prefill of ``prompt`` tokens and ``steps`` decode steps.

    ``prompt`` = 0 means the KV map's context minus one, so the (first)
    decode step attends over the full context. Decode step s sits at position
    ``prompt + s`` and ends with the controller's ARGMAX; positions past the
    context wrap around the KV ring (the oldest token is overwritten, so a
    query attends to the last ``context`` tokens). ``requests`` lists each
    request's adapter id; a request whose adapter differs from the previous
    one reloads the LoRA weights (CONFIG). Batch and context come from
    ``kv-ring``.
    """

    name = "codegen"
    summary = "emit the IPCN instruction stream (adapter loads, prefill, decode steps)"
    requires = frozenset({"placed", "kv"})
    provides = frozenset({"stream"})

    prompt: int = 0
    requests: str = "0"
    steps: int = 1

    def __post_init__(self) -> None:
        if self.prompt < 0:
            raise ValueError("prompt must be >= 0")
        if self.steps < 1:
            raise ValueError("steps must be >= 1")
        parse_requests(self.requests, f"{self.name}.requests")

    def run(self, program, target):
        kv = program.kv
        prompt = self.prompt or kv.context - 1
        if prompt + 1 > kv.context:
            raise InputError(f"{self.name}.prompt", f"prompt {prompt} + 1 decoded token exceeds the KV context "
                                                    f"{kv.context} allocated by kv-ring")
        requests = parse_requests(self.requests, f"{self.name}.requests")
        stream = emit_stream(program, target, prompt, requests, self.steps)
        ops = np.bincount(stream.records["op"], minlength=len(Opcode))
        details = {
            "records": len(stream), "groups": stream.num_groups, "bytes": stream.nbytes, "prompt": prompt,
            "steps": self.steps,
            "sections": {s.name: s.stop - s.start for s in stream.sections},
            "opcodes": {op.name: int(ops[op]) for op in Opcode if ops[op]},
        }
        return program.evolve(stream=stream, pending_details=details)
