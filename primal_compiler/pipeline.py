"""A pipeline and the workload it is compiled for, as values.

:class:`Pipeline` is a tuple of passes that parses and prints its own text
form (``a,b{opt=1},c``, a bundled name or a TOML file in, text out). A
:class:`Workload` says what the program serves: the KV space (``batch``
sequences of ``context`` tokens), the ``prompt`` length, the decode
``steps`` in the stream, the tokens it generates (``generate``), the
number of ``adapters``, the prompt tokens of a prefill pass (``prefill_chunk``) and whether a program
that overflows a scratchpad is refused (``memory``). Each pass declares which of its options a workload
sets (``Pass.workload_options``, and
:meth:`~primal_compiler.passmgr.Pass.for_workload` where it needs more), so
the command line, the functional replay and the sweep set them the same way
and no caller patches a pass by name.
"""

from __future__ import annotations

from dataclasses import dataclass

import primal_compiler.transforms  # noqa: F401  (registers every pass, so any pipeline text parses)
from primal_compiler.passmgr import Pass, print_pipeline, resolve_pipeline


@dataclass(frozen=True)
class Workload:
    """What a compiled program serves; None (0 for ``adapters``) leaves the pipeline's own value."""

    batch: int | None = None
    context: int | None = None
    prompt: int | None = None
    steps: int | None = None
    generate: int | None = None
    adapters: int = 0
    prefill_chunk: int | None = None  # prompt tokens per prefill pass (codegen{prefill_chunk})
    memory: str | None = None  # "strict": refuse a program that overflows a scratchpad (codegen{memory})


@dataclass(frozen=True)
class Pipeline:
    """Passes in order; ``str()`` is pipeline text that :meth:`parse` reads back to an equal Pipeline."""

    passes: tuple[Pass, ...]

    @classmethod
    def parse(cls, spec: str) -> Pipeline:
        """A bundled pipeline name (``default``), a TOML path, or pipeline text."""
        return cls(resolve_pipeline(spec))

    def __str__(self) -> str:
        return print_pipeline(self.passes)

    def for_workload(self, workload: Workload) -> Pipeline:
        """Every pass with the options ``workload`` sets (see the module docstring)."""
        return Pipeline(tuple(p.for_workload(workload) for p in self.passes))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.passes)
