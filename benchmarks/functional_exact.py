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
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' ONNX Runtime reference
from tests.functional.reference import ort_greedy  # noqa: E402

from primal_compiler.frontend import load_model
from primal_compiler.functional import compile_for_replay, replay_functional
from primal_compiler.target import load_target, with_overrides

FIXTURES = Path(__file__).parents[1] / "tests" / "fixtures" / "onnx"
PIPELINE = "lower-tiles,blocking,zcurve-order,kv-ring{context=32,chunk_tokens=4,reserve_bytes=0},codegen,srpg"
TARGET = {"ct.mesh_rows": 4, "ct.mesh_cols": 4, "rram.rows": 16, "rram.cols": 16, "rram.rows_active_per_read": 8,
          "rram.adcs_per_macro": 4, "sram.rows": 16, "router.scratchpad_bytes": 2048}


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
