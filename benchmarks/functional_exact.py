"""Exact-mode error of the functional replay against ONNX Runtime, per fixture, and replay speed.

Every fixture of tests/fixtures/onnx is compiled on primal-7nm cut to 16x16
crossbars (8 rows per read), 16-row LoRA tiles and 4x4-PE CTs, so each
tiny matrix spans several tiles, CTs and die-to-die proxies; the stream is
replayed in float32 on a 5-token prompt generating 4 tokens (TorchScript and
static exports run only at their traced 8 tokens: prefill only) and
compared with ONNX Runtime decoding greedily on the same file. The error is
max |replay - ONNX Runtime| over all logits of all steps, relative to the
largest ONNX Runtime logit.

Run: python benchmarks/functional_exact.py
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from primal_compiler.frontend import load_model
from primal_compiler.functional import compile_for_replay, replay_functional
from primal_compiler.target import load_target, with_overrides

FIXTURES = Path(__file__).parents[1] / "tests" / "fixtures" / "onnx"
PIPELINE = "lower-tiles,blocking,zcurve-order,kv-ring{context=32,chunk_tokens=4,reserve_bytes=0},codegen,srpg"
TARGET = {"ct.mesh_rows": 4, "ct.mesh_cols": 4, "rram.rows": 16, "rram.cols": 16, "rram.rows_active_per_read": 8,
          "rram.adcs_per_macro": 4, "sram.rows": 16, "router.scratchpad_bytes": 2048}


def ort_greedy(path: Path, prompt: list[int], generate: int) -> np.ndarray:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    ids, rows = list(prompt), []
    for _ in range(generate):
        n, feeds = len(ids), {}
        for i in session.get_inputs():
            if i.name == "input_ids":
                feeds[i.name] = np.array([ids], np.int64)
            elif i.name == "attention_mask":
                feeds[i.name] = np.ones((1, n), np.int64)
            elif i.name == "position_ids":
                feeds[i.name] = np.arange(n, dtype=np.int64)[None]
            elif i.name.startswith("past_key_values"):
                feeds[i.name] = np.zeros([1] + [d if isinstance(d, int) else 0 for d in i.shape[1:]], np.float32)
            else:  # TorchScript: index of the position whose logits come out
                feeds[i.name] = np.array(n - 1, np.int64)
        out = session.run(None, feeds)[0]
        rows.append(out[0, -1] if out.ndim == 3 else out[0])
        ids.append(int(np.argmax(rows[-1])))
    return np.stack(rows)


def main() -> None:
    target = with_overrides(load_target("primal-7nm"), TARGET)
    print("| fixture | prompt | tokens | max error / logit scale | records | replay s |")
    print("|---|---|---|---|---|---|")
    for path in sorted(FIXTURES.glob("*.onnx")):
        fixed = "torchscript" in path.stem or "static" in path.stem
        prompt, generate = ([7, 2, 9, 4, 1, 8, 3, 6], 1) if fixed else ([3, 1, 4, 1, 5], 4)
        program = compile_for_replay(load_model(str(path)), target, len(prompt), generate, PIPELINE)
        clock = time.perf_counter()
        result = replay_functional(program, target, path, prompt=prompt, generate=generate)
        seconds = time.perf_counter() - clock
        want = ort_greedy(path, prompt, generate)
        error = np.abs(result.logits - want).max() / np.abs(want).max()
        print(f"| {path.stem} | {len(prompt)} | {generate} | {error:.1e} | {result.records:,} | {seconds:.2f} |")


if __name__ == "__main__":
    main()
