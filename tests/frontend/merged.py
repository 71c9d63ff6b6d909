"""The check that an unmerged adapter replays as PEFT would merge it: onnxruntime on a copy of the model whose
projection weights carry the merged delta is the reference the functional replay must equal."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

PROMPT, GENERATE = [1, 2, 3, 4], 3


def replay_and_merged(model_path: Path, adapter: Path, factors: dict, delta: Callable[[np.ndarray, np.ndarray],
                      np.ndarray], tmp_path: Path, merge: Callable[[tuple, np.ndarray, np.ndarray], np.ndarray] | None = None,
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(replayed logits with the unmerged adapter, onnxruntime's on the merged copy, onnxruntime's without it).

    ``factors`` are :func:`tests.frontend.test_weights.write_adapter`'s IR-layout ``(a, b)`` per (layer, role);
    ``delta(a, b)`` is what the merge adds to each projection's weight as the file stores it (``in x out``),
    and ``merge(key, w, w + delta)``, when given, the merged weight itself (DoRA rescales the sum's columns).
    """
    import onnx
    from onnx import numpy_helper

    from primal_compiler.frontend import load_model
    from primal_compiler.frontend.onnx_import import recognise_onnx
    from primal_compiler.functional import compile_for_replay, replay_functional
    from primal_compiler.report.check import ort_greedy
    from primal_compiler.target import load_primal_target

    merged = onnx.load(model_path)
    inits = {t.name: t for t in merged.graph.initializer}
    found = recognise_onnx(model_path)
    for key, (a, b) in factors.items():
        name = found.projections[key].weight
        w = numpy_helper.to_array(inits[name])
        summed = w + delta(a, b)
        inits[name].CopyFrom(numpy_helper.from_array((summed if merge is None else merge(key, w, summed)).astype(np.float32),
                                                     name))
    onnx.save(merged, tmp_path / "merged.onnx")
    target = load_primal_target("primal-7nm")
    program = compile_for_replay(load_model(str(model_path), adapter=str(adapter)), target, len(PROMPT), GENERATE,
                                 "fast")
    got = replay_functional(program, target, str(model_path), str(adapter), prompt=PROMPT, generate=GENERATE)
    return got.logits, ort_greedy(tmp_path / "merged.onnx", PROMPT, GENERATE), ort_greedy(model_path, PROMPT, GENERATE)
