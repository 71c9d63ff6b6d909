"""``primal baseline MODEL --gpu G --precision P --batch B --prompt P --generate N``: one GPU configuration's costs.

Prints TTFT, ITL (mean and at the end of the generation), tokens/s,
tokens/J, energy per token, power, memory used and whether it fits, under the
key names ``primal run --json`` uses (docs/baselines.md defines each). A
configuration that does not fit the GPU's memory, an unknown GPU, engine or
precision, a precision without kernels on the GPU or engine, and a count
below 1 are one-line :class:`~primal_compiler.errors.InputError` s (exit 2).

:func:`add_parser` also gives ``primal run`` and ``primal reproduce`` their
``--baseline-gpu`` and ``--baselines`` options: the chosen family is set
(:func:`~primal_compiler.baselines.family.select`) while the command runs.
"""

from __future__ import annotations

import json

from primal_compiler.errors import InputError

GPUS = ("a100", "a100-40gb", "h100", "h200")


def baseline(args) -> dict:
    """The JSON report of one configuration (``format`` = ``primal-baseline``)."""
    from primal_compiler.argtypes import unused
    from primal_compiler.baselines.engine import serve
    from primal_compiler.baselines.profile import load_engine
    from primal_compiler.frontend import load_model
    from primal_compiler.target import load_gpu_target

    if args.gpu not in GPUS:
        raise InputError("--gpu", f"unknown GPU {args.gpu!r}; known: {', '.join(GPUS)}")
    if args.lora is None and args.lora_mode != "unmerged":
        raise unused("--lora-mode", "--lora")
    if args.lora is None and args.adapters != 1:
        raise unused("--adapters", "--lora")
    engine = load_engine(args.engine)
    model = load_model(args.model, args.lora)
    s = serve(model, load_gpu_target(args.gpu, "--gpu"), engine, precision=args.precision, kv_bits=args.kv_bits,
              lora_mode=args.lora_mode, batch=args.batch, prompt=args.prompt, generate=args.generate,
              adapters=args.adapters)
    return {"format": "primal-baseline", "model": model.name, "lora": args.lora, **s.to_dict()}


def render(r: dict) -> str:
    """The report as a short table."""
    from primal_compiler.report.text import human_time, table

    mem = r["details"]["memory"]
    lines = [f"{r['model']} on {r['gpu']} ({r['engine']}, {r['precision']}, KV {r['kv_bits']}-bit, LoRA "
             f"{r['lora'] or 'none'} {r['lora_mode'] if r['lora'] else ''}".rstrip()
             + (f", {r['adapters']} distinct adapters" if r["adapters"] > 1 else "") + f"), batch {r['batch']}, "
             f"prompt {r['prompt']}, {r['generate']} generated", ""]
    rows = [
        ("TTFT (prefill of the batch)", human_time(r["ttft_s"])),
        ("ITL, mean over the generation", human_time(r["itl_s"])),
        ("ITL, last step", human_time(r["itl_end_s"])),
        ("throughput (batch / ITL, tokens/s)", f"{r['tokens_per_s']:.1f}"),
        ("end-to-end throughput (tokens/s)", f"{r['end_to_end_tokens_per_s']:.1f}"),
        ("energy per token (decode)", f"{r['energy_per_token_j'] * 1e3:.1f} mJ"),
        ("tokens/J (decode)", f"{r['tokens_per_j']:.3f}"),
        ("power (decode, mean)", f"{r['power_w']:.0f} W"),
        ("power (prefill)", f"{r['prefill_power_w']:.0f} W"),
        ("memory used", f"{r['memory_bytes'] / 1e9:.1f} GB of {r['memory_usable_bytes'] / 1e9:.1f} GB usable "
                        f"(weights {mem['weight_bytes'] / 1e9:.1f}, LoRA {mem['lora_bytes'] / 1e9:.2f}, "
                        f"KV {mem['kv_bytes'] / 1e9:.1f})"),
        ("fits", "yes" if r["fits"] else "no"),
    ]
    lines += table(rows, None, ("left", "left"))
    d = r["details"]
    lines.append(f"(last decode step: {100 * d['decode_end_bandwidth_fraction']:.0f}% of peak HBM bandwidth; "
                 f"prefill: {100 * d['prefill_compute_fraction']:.0f}% of the dense {d['tensor'].upper()} tensor peak)")
    return "\n".join(lines)


def cmd_baseline(args) -> None:
    r = baseline(args)
    print(json.dumps(r, indent=2, sort_keys=True) if args.json else render(r))


def add_family_args(sp) -> None:
    """``--baseline-gpu`` and ``--baselines`` on a verb whose report shows the baseline family."""
    from primal_compiler.baselines.family import DEFAULT_GPU, DEFAULT_MEMBERS

    default = ",".join(m.label for m in DEFAULT_MEMBERS)
    sp.add_argument("--baseline-gpu", default=DEFAULT_GPU, help=f"GPU of the baseline family (default {DEFAULT_GPU})")
    sp.add_argument("--baselines", default=default, metavar="ENGINE:PRECISION[:kv8],...",
                    help=f"members of the baseline family (default {default})")


def add_parser(sub) -> None:
    """Register ``baseline`` on an argparse subparsers object."""
    from primal_compiler.argtypes import int_arg

    sp = sub.add_parser("baseline", help="TTFT, ITL, tokens/s, tokens/J, power and memory of one GPU configuration "
                                         "(engine-profile model)")
    sp.add_argument("model", help="built-in model name or .onnx file")
    sp.add_argument("--lora", default=None, help="LoRA adapters, e.g. q,v:8")
    sp.add_argument("--gpu", required=True, help=f"GPU target: {', '.join(GPUS)}")
    sp.add_argument("--precision", required=True, help="fp16, bf16, fp8, w8a16, w4a16 or w4a8")
    sp.add_argument("--kv-bits", type=int, default=16, help="KV-cache bits: 16 or 8 (default 16)")
    sp.add_argument("--engine", default="vllm", help="hf-eager, vllm or trtllm (default vllm)")
    sp.add_argument("--lora-mode", default="unmerged", help="merged or unmerged adapters (default unmerged)")
    for flag, hi in (("--batch", 100_000), ("--prompt", 1_000_000), ("--generate", 1_000_000)):
        sp.add_argument(flag, type=int_arg(1, hi), required=True, help=f"{flag[2:]} (1..{hi:,})")
    sp.add_argument("--adapters", type=int_arg(1, 100_000), default=1,
                    help="distinct adapters among the batch's sequences (unmerged; default 1): each further one is "
                         "gathered by an SGMV/BGMV-class kernel (docs/baselines.md)")
    sp.add_argument("--json", action="store_true", help="one JSON object")
    sp.set_defaults(func=cmd_baseline)
