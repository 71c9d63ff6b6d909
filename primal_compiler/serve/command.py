"""``primal serve MODEL --adapters A B ... --trace TRACE`` and ``primal trace -o TRACE ...`` (docs/serving.md)."""

from __future__ import annotations

import argparse
import json
import sys

from primal_compiler.errors import InputError
from primal_compiler.serve import BATCHING, SEED_ZERO_FRACTION

#: ``primal trace --think``'s default: mean seconds between a conversation's turns.
THINK_S = 30.0


def cmd_serve(args) -> None:
    from primal_compiler.argtypes import replay_cache, unused
    from primal_compiler.serve.costs import Policy
    from primal_compiler.serve.report import render_serve

    if args.force and args.perfetto is None:
        raise unused("--force", "--perfetto FILE")

    policy = Policy(prefetch=not args.no_prefetch, sparse=not args.no_sparse, max_batch=args.max_batch,
                    zero_fraction=args.zero_fraction, context_save=not args.no_context_save, batching=args.batching)
    from primal_compiler.serve.run import serve

    report = serve(args.model, args.lora, tuple(args.adapters), args.trace, args.target, args.pipeline,
                   args.context, policy, lambda line: print(line, file=sys.stderr, flush=True), args.json,
                   args.perfetto, args.force, replay_cache(args))
    print(json.dumps(report, indent=2, sort_keys=True) if args.json else render_serve(report))


def _range(text: str) -> tuple[int, int]:
    lo, sep, hi = text.partition(":")
    try:
        low, high = int(lo), int(hi if sep else lo)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LOW:HIGH token counts, got {text[:40]!r}") from None
    if not 1 <= low <= high <= 1 << 20:
        raise argparse.ArgumentTypeError(f"expected 1 <= LOW <= HIGH <= {1 << 20}, got {text[:40]!r}")
    return low, high


def cmd_trace(args) -> None:
    from primal_compiler.argtypes import unused
    from primal_compiler.outdir import check_destination, existing, output_file
    from primal_compiler.serve.run import adapters
    from primal_compiler.serve.trace import poisson_trace, trace_jsonl

    if not args.output.endswith(".jsonl"):
        raise InputError(args.output, "a generated trace is written as .jsonl")
    if args.turns == (1, 1) and args.think != THINK_S:
        raise unused("--think", "--turns above 1:1")
    inputs = existing(*args.adapters)
    check_destination(args.output, args.force, directory=False, inputs=inputs)
    names, _ = adapters(tuple(args.adapters))  # as serve names them: a directory by its last path component
    trace = poisson_trace(args.requests, args.rate, names, args.zipf, args.prompt, args.generate, args.seed,
                          args.turns, args.think, args.context)
    with output_file(args.output, args.force, inputs=inputs) as f:
        f.write(trace_jsonl(trace).encode("utf-8"))
    print(f"wrote {args.output} ({len(trace):,} requests over {trace.arrival_s[-1]:.4g} s)")


def add_parsers(sub) -> None:
    """Register ``serve`` and ``trace`` on an argparse subparsers object."""
    from primal_compiler.argtypes import add_cache_flag, float_arg, int_arg, option_arg, path_arg, pipeline_arg

    sp = sub.add_parser("serve", help="replay a request trace over several adapters: per-request TTFT and ITL, "
                                      "throughput, tokens/J, adapter switches (docs/serving.md)")
    sp.add_argument("model", help="built-in name (llama2-7b, ...) or an .onnx file")
    sp.add_argument("--lora", default=None,
                    help="the adapters' LoRA, TARGETS:RANK[:ALPHA] (default: the adapter directories' own, else q,v:8, "
                         "the seed's rank 8 on Q and V)")
    sp.add_argument("--adapters", nargs="+", required=True,
                    help="the adapters: names, or PEFT adapter directories (named by their last path component); "
                         "the trace refers to these names")
    sp.add_argument("--trace", type=path_arg, required=True, help="requests: a .jsonl or .csv file (docs/serving.md)")
    sp.add_argument("--target", default="primal-7nm", help="bundled target name or a .toml path")
    sp.add_argument("-p", "--pipeline", type=pipeline_arg, default="default",
                    help="pipeline whose placement passes place the model (default: default)")
    sp.add_argument("--context", type=option_arg("kv-ring", "context"), default=2048,
                    help="context tokens per sequence of the KV space (prompt + generation must fit)")
    sp.add_argument("--max-batch", type=int_arg(1, 64), default=1,
                    help="batch up to this many waiting requests (default 1: no batching)")
    sp.add_argument("--batching", choices=BATCHING, default="mixed",
                    help="which requests share a batch: the oldest whatever their adapters (mixed, the default), "
                         "the oldest's adapter only (same-adapter), or the adapters the SRAM-DCIM slots hold first "
                         "and never more than the slots (resident) (docs/serving.md)")
    sp.add_argument("--no-prefetch", action="store_true",
                    help="load an adapter only after the previous request and before its own prefill")
    sp.add_argument("--no-sparse", action="store_true", help="configure every LoRA block, zero or not")
    sp.add_argument("--no-context-save", action="store_true",
                    help="free a conversation's KV cache after each turn, so a returning turn prefills its history again")
    sp.add_argument("--zero-fraction", type=float_arg(0.0, 1.0), default=SEED_ZERO_FRACTION,
                    help=f"share of LoRA blocks all zero in every adapter (default {SEED_ZERO_FRACTION}: the seed's "
                         "35%% of matrices over 70%% sparse)")
    sp.add_argument("--perfetto", default=None, metavar="FILE.json",
                    help="also write the timeline (batches, adapter residency, every request) as Perfetto JSON")
    sp.add_argument("--force", action="store_true", help="replace the --perfetto file if it exists")
    sp.add_argument("--json", action="store_true", help="print one JSON object, every request's times too")
    add_cache_flag(sp)
    sp.set_defaults(func=cmd_serve)

    sp = sub.add_parser("trace", help="write a seeded Poisson request trace (docs/serving.md)")
    sp.add_argument("-o", "--output", required=True, help="the .jsonl file to write")
    sp.add_argument("--force", action="store_true", help="replace the file if it exists")
    sp.add_argument("--adapters", nargs="+", required=True, help="adapter names, most popular first")
    sp.add_argument("--requests", type=int_arg(1, 10_000_000), required=True)
    sp.add_argument("--rate", type=float_arg(1e-6, 1e9), required=True, help="mean arrivals per second")
    sp.add_argument("--zipf", type=float_arg(0.0, 10.0), default=1.0,
                    help="adapter k drawn with weight 1/(k+1)^ZIPF (0: uniform; default 1)")
    sp.add_argument("--prompt", type=_range, default=(64, 512), help="prompt tokens LOW:HIGH, uniform (64:512)")
    sp.add_argument("--generate", type=_range, default=(16, 128), help="generated tokens LOW:HIGH, uniform (16:128)")
    sp.add_argument("--turns", type=_range, default=(1, 1),
                    help="turns per conversation LOW:HIGH, uniform (default 1:1: every request on its own); "
                         "conversations start at RATE over the mean turn count")
    sp.add_argument("--think", type=float_arg(0.0, 1e9), default=THINK_S,
                    help=f"mean seconds between a conversation's turns, exponential (default {THINK_S:g})")
    sp.add_argument("--context", type=option_arg("kv-ring", "context"), default=2048,
                    help="a conversation ends before the turn that would take it past this many tokens (2048)")
    sp.add_argument("--seed", type=int_arg(0, 2**32 - 1), default=0)
    sp.set_defaults(func=cmd_trace)
