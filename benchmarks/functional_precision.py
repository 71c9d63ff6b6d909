"""Accuracy of PRIMAL's hardware precision, measured by replaying compiled programs against ONNX Runtime.

For each model (the tiny LoRA fixtures of tests/fixtures/onnx) and each
precision setting, compile the model for the default primal-7nm macros
(256x256 RRAM, 64 rows per read, bit-serial 8-bit inputs, 6-bit ADC; the
mesh cut to 8x8 PEs, which only moves placement), replay it in ``hardware``
mode teacher-forced along ONNX Runtime's greedy continuation of a fixed
prompt set, and compare every next-token distribution with ONNX Runtime's:
top-1 agreement, mean KL(ONNX Runtime || replay) and the logit error (RMS
difference over the RMS spread of the reference logits). The ADC moves
from the SEED.md section 6 default (4-bit base, 8-bit LoRA, 6-bit ADC,
8-bit inputs, FP16 embeddings and 16-bit LM head); the other knobs move one
at a time with a 16-bit ADC, so their own effect shows. ``exact`` is the
float32 replay (equal to ONNX Runtime within 4e-7 of the logit scale). Per
model the table shows top-1 agreement.

Run: python benchmarks/functional_precision.py [--prompts 8] [--length 6] [--generate 6] [model ...]
"""

from __future__ import annotations

import argparse
import time
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' ONNX Runtime reference
from tests.functional.reference import ort_greedy  # noqa: E402

from primal_compiler.frontend import load_model
from primal_compiler.functional import compile_for_replay, replay_functional
from primal_compiler.functional.metrics import logit_error, mean_kl, top1_agreement
from primal_compiler.target import load_target, require_primal, with_overrides
from primal_compiler.target.spec import PrimalTarget

FIXTURES = Path(__file__).parents[1] / "tests" / "fixtures" / "onnx"
MODELS = ["llama_lora_mlp_r4_optimum_past", "mistral_lora_qv_r2_dynamo", "gpt2_lora_cattn_r4_dynamo",
          "opt_lora_qv_r4_optimum"]
PIPELINE = "lower-tiles{{base_bits={base},lora_bits={lora}}},blocking,zcurve-order,kv-ring{{context=32,chunk_tokens=8}},codegen"
# (label, precision, base bits, LoRA bits, target overrides)
IDEAL_ADC = {"rram.adc_bits": 16}  # enough levels for every sum of these tiles: no conversion error
# (label, precision, base bits, LoRA bits, target overrides)
SETTINGS = [
    ("exact (float32)", "exact", 4, 8, {}),
    ("hardware default: base 4, LoRA 8, ADC 6, input 8", "hardware", 4, 8, {}),
    ("ADC 4", "hardware", 4, 8, {"rram.adc_bits": 4}),
    ("ADC 5", "hardware", 4, 8, {"rram.adc_bits": 5}),
    ("ADC 8", "hardware", 4, 8, {"rram.adc_bits": 8}),
    ("ADC 10", "hardware", 4, 8, {"rram.adc_bits": 10}),
    ("ADC 16 (no conversion error)", "hardware", 4, 8, IDEAL_ADC),
    ("base 2, ADC 16", "hardware", 2, 8, IDEAL_ADC),
    ("base 3, ADC 16", "hardware", 3, 8, IDEAL_ADC),
    ("base 6, ADC 16", "hardware", 6, 8, IDEAL_ADC),
    ("base 8, ADC 16", "hardware", 8, 8, IDEAL_ADC),
    ("LoRA 2, ADC 16", "hardware", 4, 2, IDEAL_ADC),
    ("LoRA 4, ADC 16", "hardware", 4, 4, IDEAL_ADC),
    ("LoRA 6, ADC 16", "hardware", 4, 6, IDEAL_ADC),
    ("LoRA 16, ADC 16", "hardware", 4, 16, IDEAL_ADC),
    ("input 6, ADC 16", "hardware", 4, 8, {**IDEAL_ADC, "rram.input_bits": 6, "sram.input_bits": 6}),
    ("base 8, LoRA 16, input 12, ADC 16", "hardware", 8, 16,
     {**IDEAL_ADC, "rram.input_bits": 12, "sram.input_bits": 12,
      "sram.mac_latency_cycles": 14}),
]


def study(description: str) -> tuple[argparse.Namespace, PrimalTarget]:
    """The fixture study's arguments (models, prompts, their length, steps) and its target: primal-7nm's
    macros, the mesh cut to 8x8 PEs (benchmarks/functional_temperature.py shares both)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("models", nargs="*", default=MODELS)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--length", type=int, default=6)
    parser.add_argument("--generate", type=int, default=6)
    return parser.parse_args(), require_primal(with_overrides(load_target("primal-7nm"), {"ct.mesh_rows": 8,
                                                                                        "ct.mesh_cols": 8}), "primal-7nm")


def main() -> None:
    args, base_target = study(__doc__.splitlines()[0])
    rng = np.random.default_rng(0)
    results: dict[str, list[tuple[float, float, float]]] = {label: [] for label, *_ in SETTINGS}
    clock = time.perf_counter()
    for name in args.models:
        path = FIXTURES / f"{name}.onnx"
        model = load_model(str(path))
        prompts = [rng.integers(0, model.vocab_size, args.length).tolist() for _ in range(args.prompts)]
        refs = [ort_greedy(path, p, args.generate) for p in prompts]
        for label, precision, base, lora, overrides in SETTINGS:
            target = with_overrides(base_target, overrides)
            program = compile_for_replay(model, target, args.length, args.generate,
                                         PIPELINE.format(base=base, lora=lora))
            got = [replay_functional(program, target, path, prompt=p, generate=args.generate, precision=precision,
                                     force=[int(t) for t in ref.argmax(axis=1)]).logits
                   for p, ref in zip(prompts, refs)]
            logits, ref = np.concatenate(got), np.concatenate(refs)
            results[label].append((top1_agreement(logits, ref), mean_kl(logits, ref), logit_error(logits, ref)))
    steps = args.prompts * args.generate
    print(f"{len(args.models)} models x {args.prompts} prompts of {args.length} tokens x {args.generate} "
          f"teacher-forced steps ({steps} distributions per model), {time.perf_counter() - clock:.0f} s\n")
    print("| setting | top-1 agreement | mean KL (nats) | logit error | " + " | ".join(args.models) + " |")
    print("|---|---|---|---|" + "---|" * len(args.models))
    for label, *_ in SETTINGS:
        top1, kl, err = (np.mean([r[k] for r in results[label]]) for k in range(3))
        cells = " | ".join(f"{100 * r[0]:.0f}%" for r in results[label])
        kl_text = f"{kl:.1e}" if kl > 1e-12 else "0"
        print(f"| {label} | {100 * top1:.1f}% | {kl_text} | {err:.3f} | {cells} |")


if __name__ == "__main__":
    main()
