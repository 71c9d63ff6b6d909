"""Accuracy against die temperature: hardware-precision replays with the ADCs' offset drift against the exact replay.

For each model (the tiny LoRA fixtures of tests/fixtures/onnx) compile it for
the default primal-7nm macros (256x256 RRAM, 64 rows per read, bit-serial
8-bit inputs, 6-bit ADC; the mesh cut to 8x8 PEs, which only moves
placement), decode a fixed prompt set greedily in exact (float32)
precision, and replay it in hardware precision teacher-forced along that
continuation with every die at each temperature (the ADC offset grows 0.3 LSB
per +10 degC from its 25 degC calibration, SEED.md section 6; docs/thermal.md).
Prints top-1 agreement, mean KL(exact || hardware) and the logit error per
temperature, and top-1 agreement per model.

Run: python benchmarks/functional_temperature.py [--prompts 8] [--length 6] [--generate 6] [model ...]
"""

from __future__ import annotations

import time

import numpy as np
from functional_precision import FIXTURES, study  # this directory's precision study: its fixtures and arguments

from primal_compiler.frontend import load_model
from primal_compiler.functional import compile_for_replay
from primal_compiler.functional.temperature import temperature_sweep

PIPELINE = "lower-tiles,blocking,zcurve-order,kv-ring{context=32,chunk_tokens=8},codegen"
TEMPERATURES = [25.0, 45.0, 55.0, 85.0, 125.0]


def main() -> None:
    args, target = study(__doc__.splitlines()[0])
    rng = np.random.default_rng(0)
    rows: dict[float, list[list[dict]]] = {t: [] for t in TEMPERATURES}
    clock = time.perf_counter()
    for name in args.models:
        path = FIXTURES / f"{name}.onnx"
        model = load_model(str(path))
        program = compile_for_replay(model, target, args.length, args.generate, PIPELINE)
        prompts = [rng.integers(0, model.vocab_size, args.length).tolist() for _ in range(args.prompts)]
        per_prompt = [temperature_sweep(program, target, path, p, args.generate, TEMPERATURES) for p in prompts]
        for i, t in enumerate(TEMPERATURES):
            rows[t].append([sweep[i] for sweep in per_prompt])
    steps = args.prompts * args.generate
    print(f"{len(args.models)} models x {args.prompts} prompts of {args.length} tokens x {args.generate} "
          f"teacher-forced steps ({steps} distributions per model), {time.perf_counter() - clock:.0f} s\n")
    print("| die temperature | ADC offset | top-1 agreement | mean KL (nats) | logit error | "
          + " | ".join(args.models) + " |")
    print("|---|---|---|---|---|" + "---|" * len(args.models))
    for t in TEMPERATURES:
        per_model = rows[t]
        flat = [r for model_rows in per_model for r in model_rows]
        top1 = [np.mean([r["top1"] for r in model_rows]) for model_rows in per_model]
        cells = " | ".join(f"{100 * v:.0f}%" for v in top1)
        print(f"| {t:g} degC | {flat[0]['adc_offset_lsb']:.1f} LSB | {100 * np.mean(top1):.1f}% | "
              f"{np.mean([r['kl'] for r in flat]):.1e} | {np.mean([r['logit_error'] for r in flat]):.3f} | {cells} |")


if __name__ == "__main__":
    main()
