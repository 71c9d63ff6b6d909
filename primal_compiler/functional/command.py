"""``primal run --functional``: the functional replay's command (docs/functional.md)."""

from __future__ import annotations

import json
from pathlib import Path

from primal_compiler.argtypes import token_ids
from primal_compiler.errors import InputError
from primal_compiler.outdir import check_destination, existing, output_file


def _save_logits(path: str, logits, force: bool, inputs: tuple[str, ...]) -> None:
    import numpy as np

    with output_file(path, force, inputs=inputs) as f:
        np.save(f, logits)


def run_functional(args) -> None:
    """``primal run --functional``: execute the stream numerically with real weights."""
    from primal_compiler.functional import compile_for_replay, replay_functional
    from primal_compiler.report import collect

    if not args.weights or args.prompt is None:
        raise InputError("--functional", "needs --weights MODEL.onnx and --prompt TOKEN,IDS")
    prompt = token_ids(args.prompt)
    inputs = existing(args.model, args.weights, args.target, args.pipeline, *(args.adapter or ()))
    if args.save_logits:
        check_destination(args.save_logits, args.force, directory=False, inputs=inputs)
    if collect.is_program(args.model):
        c = collect.load_compiled(Path(args.model), args.target)
        program, target, where = c.program(), c.target, c.where
    else:
        from primal_compiler.frontend import load_model
        from primal_compiler.target import load_primal_target

        target, where = load_primal_target(args.target or "primal-7nm"), args.model
        model = load_model(args.model, args.lora, args.adapter)
        program = compile_for_replay(model, target, len(prompt), args.generate or 1, args.pipeline or "default",
                                     args.context, adapters=len(args.adapter or ()))
    result = replay_functional(program, target, args.weights, args.adapter, prompt=prompt, generate=args.generate or 1,
                               precision=args.precision, where=where, temperature_c=args.temperature_c)
    if args.save_logits:
        _save_logits(args.save_logits, result.logits, args.force, inputs)
    if args.json:
        print(json.dumps(result.summary(), indent=2, sort_keys=True))
    else:
        stored = (f"; {result.crossbars_stored} of {result.crossbars} crossbars hold the file's own quantized codes"
                  if result.crossbars_stored else "")
        generated = (" ".join(f"request {r} {t}" for r, t in enumerate(result.request_tokens))
                     if len(result.request_tokens) > 1 else str(result.tokens))
        print(f"prompt {prompt} -> generated {generated} ({args.precision} precision, "
              f"{result.records:,} records executed in {result.seconds:.2f} s{stored})")
