"""Functional replay: execute a compiled program's instruction stream numerically.

``replay_functional(program, target, weights.onnx, adapter_dir, prompt=[...], generate=N,
precision="exact"|"hardware")`` prefills the prompt and decodes ``N`` tokens greedily by running
every record of the stream against the weights placed on each PE; ``compile_for_replay`` compiles
a program whose stream fits that run (a program file replays as
:meth:`primal_compiler.compiled.Compiled.program`). See docs/functional.md.
"""

from primal_compiler.functional.compile import compile_for_replay
from primal_compiler.functional.precision import PRECISIONS
from primal_compiler.functional.replay import FunctionalResult, replay_functional

__all__ = ["PRECISIONS", "FunctionalResult", "compile_for_replay", "replay_functional"]
