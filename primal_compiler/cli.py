"""The ``primal`` console script: a thin front end over :mod:`primal_compiler.api`.

Every user error becomes one line on stderr (``primal: <where>: <problem>``)
and exit code 2; nothing is written when a command fails. An internal error is
one line too (exit 70; ``--debug`` adds the traceback); SIGINT and SIGTERM end
with one line and exit 130 and 143 after every temporary output is removed; a
closed stdout (``| head``) ends quietly.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import traceback
from pathlib import Path

from primal_compiler.errors import InputError, one_line
from primal_compiler.outdir import check_destination, existing
from primal_compiler.signals import Terminated, handled, raise_if_received, received
from primal_compiler.terminal import Parser, reopen_closed_streams, steps as progress_steps


def _target(name: str):
    from primal_compiler.target import load_primal_target

    return load_primal_target(name)


def cmd_inspect(args) -> None:
    from primal_compiler.frontend import load_model
    from primal_compiler.report.inspect import adapter_info, inspect_model, render_inspect

    model = load_model(args.model, args.lora, args.adapter)
    info = inspect_model(model, _target(args.target))
    if args.adapter:
        described = [adapter_info(d, model) for d in args.adapter]
        info["adapter"] = described[0]
        if len(described) > 1:
            info["adapters"] = described
    print(json.dumps(info, indent=2) if args.json else render_inspect(info))


def cmd_compile(args) -> None:
    from primal_compiler import api, compiled
    from primal_compiler.pipeline import Workload
    from primal_compiler.frontend import load_model
    from primal_compiler.report.inspect import inspect_model, render_inspect
    from primal_compiler.report.hops import render_hops
    from primal_compiler.report.text import table

    inputs = _inputs(args)
    check_destination(args.output, args.force, directory=True, inputs=inputs)
    model = load_model(args.model, args.lora, args.adapter)
    target = _target(args.target)
    steps, generate = _generation(None, None)
    pipeline = api.for_workload(args.pipeline, Workload(adapters=len(args.adapter or ()), steps=steps, generate=generate,
                                                        memory=args.memory))
    program = api.compile_model(model, target, pipeline, verify=args.verify)
    compiled.write_compiled(program, target, Path(args.output), args.force, inputs)
    print(render_inspect(inspect_model(program.model, target, program)))
    print()
    print(render_hops(api.last_details(program, "hops")))
    print(f"\npipeline: {api.pipeline_text(program)}")
    print("\n".join(table([(rec.name, f"{rec.seconds:.2f} s") for rec in program.records], ("pass", "time"),
                          indent="  ")))
    if program.stream is not None:
        sections = ", ".join(f"{s.name} {s.stop - s.start:,}" for s in program.stream.sections)
        print(f"stream: {len(program.stream):,} records ({sections})")
    files = "placement.npz, placement.txt, summary.json, records.json"
    print(f"wrote {args.output}/ ({files}{', program.primal' if program.stream is not None else ''})")


def _generation(generate: int | None, replayed: int | None) -> tuple[int, int]:
    """The workload's ``steps`` and ``generate`` for ``--generate`` and ``--replay-steps`` (codegen's defaults)."""
    from primal_compiler.passmgr import DEFAULT_GENERATE, DEFAULT_REPLAYED

    generate = generate or DEFAULT_GENERATE
    return min(generate, replayed or DEFAULT_REPLAYED), generate


def _inputs(args) -> tuple[str, ...]:
    """What a compiling verb reads (an ONNX model, adapter directories, target and pipeline files), which its
    outputs may not replace; built-in names are not paths."""
    return existing(args.model, args.target, args.pipeline, *(args.adapter or ()))


#: ``primal run``'s options that only the cost replay uses, and those only ``--functional`` uses (flag, dest).
COST_ONLY = (("-o", "output"), ("--batch", "batch"), ("--no-validate", "no_validate"), ("--control", "control"),
             ("--memory", "memory"), ("--critical-path", "critical_path"), ("--replay-steps", "replay_steps"),
             ("--prefill-chunk", "prefill_chunk"), ("--baseline-gpu", "baseline_gpu"), ("--baselines", "baselines"),
             ("--no-cache", "no_cache"))
FUNCTIONAL_ONLY = (("--weights", "weights"), ("--prompt", "prompt"), ("--precision", "precision"),
                   ("--temperature-c", "temperature_c"), ("--save-logits", "save_logits"))


def _check_replay_options(args) -> None:
    """Refuse, before any work, an option set away from its default that the chosen replay would ignore."""
    wrong, other, mode = ((COST_ONLY, "the cost replay", "--functional") if args.functional
                          else (FUNCTIONAL_ONLY, "--functional", "the cost replay"))
    ignored = [flag for flag, dest in wrong if getattr(args, dest) != args.defaults[dest]]
    if ignored:
        raise InputError(ignored[0], f"applies to {other} only; {mode} would ignore it")


def cmd_run(args) -> None:
    from primal_compiler import api, compiled
    from primal_compiler.argtypes import replay_cache
    from primal_compiler.pipeline import Workload
    from primal_compiler.report import collect
    from primal_compiler.report.run import render_run

    from primal_compiler.baselines.family import selection

    _check_replay_options(args)
    if args.functional:
        from primal_compiler.functional.command import run_functional

        run_functional(args)
        return
    chosen = selection(args.baseline_gpu, args.baselines)  # checked before any compile or replay
    compiling = not collect.is_program(args.model)
    if not compiling:
        if args.lora or args.adapter or args.pipeline or args.output is not None:
            raise InputError(args.model, "--lora, --adapter, -p and -o apply when compiling a model (--adapter also "
                                         "with --functional); this is a compiled program")
        c = collect.load_compiled(Path(args.model), args.target)
        kv, where = c.meta.get("kv", {}), c.where
        for name, want in (("batch", args.batch), ("context", args.context)):
            if want is not None and want != kv.get(name):
                raise InputError(where, f"compiled for {name} {kv.get(name)}, not {want}; recompile with "
                                        f"`primal run MODEL --{name} {want}` (the KV space is laid out at compile time)")
        for flag, given in (("--replay-steps", args.replay_steps), ("--prefill-chunk", args.prefill_chunk)):
            if given is not None:
                raise InputError(where, f"{flag} applies when compiling a model (it shapes the stream); "
                                        "this is a compiled program")
        steps = collect.decode_steps(c.stream)
        if args.generate is not None and args.generate < steps:
            raise InputError(where, f"compiled for {steps} decode steps, more than --generate {args.generate}; "
                                    f"recompile with `primal run MODEL --generate {args.generate}`")
    else:
        from primal_compiler.frontend import load_model

        inputs = _inputs(args)
        if args.output is not None:
            check_destination(args.output, args.force, directory=True, inputs=inputs)
        model = load_model(args.model, args.lora, args.adapter)
        target = _target(args.target or "primal-7nm")
        steps, generate = _generation(args.generate, args.replay_steps)
        workload = Workload(batch=args.batch, context=args.context, steps=steps, generate=generate,
                            adapters=len(args.adapter or ()), prefill_chunk=args.prefill_chunk, memory=args.memory)
        pipeline = api.for_workload(args.pipeline or "default", workload)
    with progress_steps(len(api.resolve_pipeline(pipeline)) + 1 if compiling else 1, args.model) as step:
        if compiling:  # each pass a step of the bar (on a terminal), then the replay
            program = api.compile_model(model, target, pipeline, progress=step)
            passes = ", ".join(f"{r.name} {r.seconds:.1f} s" for r in program.records)
            print(f"compiled {model.name}: {api.pipeline_text(program)} ({passes})", file=sys.stderr)
            c = compiled.Compiled.of(program, target, args.model)
        step("replay")
        report = collect.replay_report(c, validate=not args.no_validate, baselines=chosen, control=args.control,
                                       critical_path=args.critical_path, memory=args.memory or "report",
                                       generate=args.generate, cache=replay_cache(args))
    if compiling and args.output is not None:  # written once the replay succeeded
        compiled.write_compiled(program, target, Path(args.output), args.force, inputs, report)
        print(f"wrote {args.output}/ (program.primal, report.json, report.txt, placement, summary.json, records.json)",
              file=sys.stderr)
    print(json.dumps(report, indent=2, sort_keys=True) if args.json else render_run(report))


def cmd_reproduce(args) -> None:
    from primal_compiler.argtypes import unused
    from primal_compiler.baselines.family import selection
    from primal_compiler.argtypes import replay_cache
    from primal_compiler.report.reproduce import Study, render_reproduce, reproduce

    if args.solve_budget_s != args.defaults["solve_budget_s"] and not args.solve:
        raise unused("--solve-budget-s", "--solve")
    study = Study(model=args.model, lora=args.lora, target=args.target, digital=args.digital,
                  pipeline=args.pipeline, context=args.context,
                  batch8_context=args.batch8_context, baselines=selection(args.baseline_gpu, args.baselines))

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    rows = reproduce(study, say, args.solve_budget_s if args.solve else 0.0, replay_cache(args))
    print(json.dumps(rows, indent=2) if args.json else render_reproduce(rows))


def cmd_map(args) -> None:
    from primal_compiler.frontend import load_model
    from primal_compiler.report.hops import compare_strategies, render_comparison

    model = load_model(args.model, args.lora)
    table = compare_strategies(model, _target(args.target), args.context, args.seed, args.generations,
                               args.enforce, args.lns_rounds)
    print(json.dumps(table, indent=2) if args.json else render_comparison(table))


def cmd_passes(args) -> None:
    from primal_compiler.report.inspect import render_passes

    print(render_passes())


def build_parser() -> argparse.ArgumentParser:
    from primal_compiler.argtypes import (add_cache_flag, float_arg, int_arg, layout_rules_arg, option_arg, path_arg,
                                          pipeline_arg)
    from primal_compiler.baselines.command import add_family_args
    from primal_compiler.passmgr import CONTEXT_RANGE, DEFAULT_GENERATE, DEFAULT_REPLAYED, MAX_GENERATE
    from primal_compiler.target.command import cmd_targets

    p = Parser(prog="primal", description="PRIMAL mapping compiler and cost simulator")
    p.add_argument("--debug", action="store_true", help="print the traceback of an internal error")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)

    def model_args(sp):
        sp.add_argument("model", help="built-in name (llama2-13b, ...) or an .onnx file")
        sp.add_argument("--lora", default=None, help="adapters, e.g. q,v:8 or q,k,v,o:16:32 (TARGETS:RANK[:ALPHA])")
        sp.add_argument("--target", default="primal-7nm", help="bundled target name or a .toml path")

    adapter_help = "a PEFT adapter directory: its config sets the LoRA (replacing the file's; --lora must agree)"
    many = ("; repeat it for a multi-adapter program (adapter ids 0, 1, ... in order; smaller ranks and missing "
            "roles padded with zeros; one request per adapter unless codegen{requests} says otherwise)")
    sp = sub.add_parser("inspect", help="print the recognised model structure and its hardware needs")
    model_args(sp)
    sp.add_argument("--adapter", action="append", default=None, help=adapter_help + "; also describes the adapter")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=cmd_inspect)

    sp = sub.add_parser("compile", help="compile a model to a placed PRIMAL program")
    model_args(sp)
    sp.add_argument("--adapter", action="append", default=None, help=adapter_help + many)
    sp.add_argument("-p", "--pipeline", type=pipeline_arg, default="default",
                    help="bundled pipeline, .toml file or pipeline text")
    sp.add_argument("-o", "--output", required=True, help="output directory (new, or an earlier output with --force)")
    sp.add_argument("--force", action="store_true", help="replace OUT if it is an earlier primal compile output")
    sp.add_argument("--verify", action="store_true", help="verify the IR after every pass")
    sp.add_argument("--memory", choices=("report", "strict"), default=None,
                    help="strict: the program must fit the scratchpads: the compiler streams the prefill in chunks "
                         "that fit, or refuses naming the PE and its buffers (default: the pipeline's codegen{memory}, "
                         "report; docs/executor.md, The compiler's allocation)")
    sp.set_defaults(func=cmd_compile)

    sp = sub.add_parser("run", help="replay a compiled program (or compile a model and replay it) and print its costs")
    sp.add_argument("model", type=path_arg,
                    help="a compile output directory or program.primal, or a model to compile first")
    sp.add_argument("--lora", default=None, help="adapters when compiling a model, e.g. q,v:8")
    sp.add_argument("--adapter", action="append", default=None,
                    help=adapter_help + "; --functional reads its weights" + many)
    sp.add_argument("--target", default=None, help="target (default: the program's own, or primal-7nm)")
    sp.add_argument("-p", "--pipeline", type=pipeline_arg, default=None,
                    help="pipeline when compiling a model (default: default)")
    sp.add_argument("-o", "--output", default=None, help="when compiling a model, also write the program here")
    sp.add_argument("--force", action="store_true", help="replace -o OUT (an earlier primal output) or --save-logits F")
    sp.add_argument("--batch", type=option_arg("kv-ring", "batch"), default=None,
                    help="sequences sharing the KV space (compile time)")
    sp.add_argument("--context", type=option_arg("kv-ring", "context"), default=None,
                    help="context tokens per sequence (compile time)")
    sp.add_argument("--no-validate", action="store_true", help="skip checking stream hops against the mapping")
    sp.add_argument("--control", choices=("distributed", "central"), default=None,
                    help="who dispatches records: a sequencer per CT, or the NMC alone (default: the target's system.control)")
    sp.add_argument("--memory", choices=("report", "strict"), default=None,
                    help="a scratchpad overflow: reported beside the figures (default, or the pipeline's "
                         "codegen{memory} when compiling), or an error: compiling, the "
                         "compiler streams the prefill in chunks that fit or refuses naming the PE and its buffers; "
                         "on a compiled program, the replay names the record, CT, PE and buffer (docs/executor.md, Memory)")
    sp.add_argument("--critical-path", action="store_true",
                    help="also break request 0's TTFT and ITL down along their critical paths (where the time goes)")
    sp.add_argument("--json", action="store_true", help="print one JSON object")
    add_cache_flag(sp)
    fn = sp.add_argument_group("functional replay (execute the stream numerically, docs/functional.md)")
    fn.add_argument("--functional", action="store_true", help="run the stream on real weights instead of costing it")
    fn.add_argument("--weights", default=None, help="the model's ONNX file (base weights, and its LoRA if unmerged)")
    fn.add_argument("--prompt", default=None, help="prompt token ids, e.g. 1,2,3,4")
    sp.add_argument("--generate", type=int_arg(1, MAX_GENERATE), default=None,
                    help=f"tokens to generate per sequence (default {DEFAULT_GENERATE}; with --functional 1, generated "
                         "greedily): the cost replay reports ITL mean/p50/p99, tokens/s and tokens/J over them")
    sp.add_argument("--replay-steps", type=option_arg("codegen", "steps"), default=None,
                    help=f"decode steps compiled and replayed record by record (default {DEFAULT_REPLAYED}, at most --generate); the "
                         "later tokens repeat the last one once it is periodic (docs/executor.md, Steady-state decode)")
    sp.add_argument("--prefill-chunk", type=int_arg(1, CONTEXT_RANGE[1]), default=None, metavar="TOKENS",
                    help="prompt tokens per prefill pass (compile time; default: the whole prompt in one pass): "
                         "smaller chunks hold fewer activations in the scratchpads (docs/executor.md, Memory)")
    fn.add_argument("--precision", default="exact", choices=("exact", "hardware"))
    fn.add_argument("--temperature-c", type=float, default=None, help="die temperature of every CT in degC: "
                    "hardware precision adds the ADC offset drift (default: none, the calibration temperature)")
    fn.add_argument("--save-logits", default=None, help="write the logits of every step to this .npy file")
    add_family_args(sp)
    sp.set_defaults(func=cmd_run, defaults={dest: sp.get_default(dest) for _, dest in COST_ONLY + FUNCTIONAL_ONLY})

    sp = sub.add_parser("reproduce", help="the seed's result table: ours (replayed), the seed's design read literally, the seed's")
    sp.add_argument("--model", default="llama2-13b")
    sp.add_argument("--lora", default="q,v:8")
    sp.add_argument("--target", default="primal-7nm")
    sp.add_argument("--digital", default="digital-7nm", help="the all-digital reference target of the PE-level rows")
    sp.add_argument("-p", "--pipeline", type=pipeline_arg, default="default", help="pipeline of the main placement")
    sp.add_argument("--context", type=option_arg("kv-ring", "context"), default=2048)
    sp.add_argument("--batch8-context", type=option_arg("kv-ring", "context"), default=256,
                    help="context of the batch-8 row (must fit 8 sequences)")
    sp.add_argument("--json", action="store_true", help="rows as JSON objects")
    sp.add_argument("--solve", action="store_true",
                    help="for every row more than 25%% from the seed, the stated-range target constant whose value "
                         "would reproduce the seed's number, and whether it is plausible (docs/reproduce.md)")
    sp.add_argument("--solve-budget-s", type=float_arg(1.0, 86_400.0), default=1800.0,
                    help="wall-time budget of --solve in seconds (default 1800)")
    add_family_args(sp)
    add_cache_flag(sp)
    sp.set_defaults(func=cmd_reproduce, defaults={"solve_budget_s": sp.get_default("solve_budget_s")})

    from primal_compiler.baselines.command import add_parser as add_baseline
    from primal_compiler.isa.command import add_parsers as add_isa
    from primal_compiler.report.check import add_parser as add_check
    from primal_compiler.serve.command import add_parsers as add_serve
    from primal_compiler.sweep.command import add_parser as add_sweep
    from primal_compiler.thermal.command import add_parser as add_thermal
    from primal_compiler.viz.command import add_parser as add_viz

    add_viz(sub)
    add_sweep(sub)
    add_baseline(sub)
    add_check(sub)
    add_isa(sub)
    add_thermal(sub)
    add_serve(sub)

    sp = sub.add_parser("map", help="compare placement strategies (hops) for a model")
    model_args(sp)
    sp.add_argument("--context", type=option_arg("blocking", "context"), default=2048)
    sp.add_argument("--seed", type=option_arg("ga-placement", "seed"), default=0)
    sp.add_argument("--generations", type=option_arg("ga-placement", "generations"), default=30)
    sp.add_argument("--lns-rounds", type=option_arg("ga-placement", "lns_rounds"), default=0,
                    help="large-neighbourhood search rounds after the GA's polish "
                         "(default 0; 0.01-0.07 s a round per 32x32 CT template)")
    sp.add_argument("--enforce", type=layout_rules_arg, default=None,
                    help="seed layout rules the GA keeps, e.g. columns:qk_horizontal (the default) or none")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=cmd_map)

    sp = sub.add_parser("passes", help="list every pass with its options and defaults")
    sp.set_defaults(func=cmd_passes)
    sp = sub.add_parser("targets", help="list and validate the bundled targets")
    sp.set_defaults(func=cmd_targets)  # (target/command.py)

    return p


def _run(argv: list[str] | None) -> int:
    args = None
    try:
        args = build_parser().parse_args(argv)
        args.func(args)
        raise_if_received()  # a signal whose exception something swallowed is still the command's end
        sys.stdout.flush()
    except InputError as exc:
        print(f"primal: {one_line(exc, 2000)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("primal: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print("primal: terminated", file=sys.stderr)
        return 143
    except BrokenPipeError:  # the reader went away (`primal ... | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except MemoryError:
        print("primal: out of memory (the input is larger than this machine can hold)", file=sys.stderr)
        return 1
    except Exception as exc:  # a bug: one line by default, the traceback with --debug
        if received() is not None:  # a signal surfaced as another error (signals.py)
            interrupted = received() == signal.SIGINT
            print("primal: interrupted" if interrupted else "primal: terminated", file=sys.stderr)
            return 130 if interrupted else 143
        if isinstance(exc, OSError) and exc.filename is not None:  # the system refused a path the user named
            print(f"primal: {one_line(str(exc.filename), 300)}: {exc.strerror or type(exc).__name__}", file=sys.stderr)
            return 2
        debug = bool(getattr(args, "debug", False))
        if debug:
            traceback.print_exc()
        print(f"primal: internal error ({type(exc).__name__}: {one_line(exc)}); please report it "
              "with the command line" + ("" if debug else " (rerun with --debug for the traceback)"),
              file=sys.stderr)
        return 70
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run one command; the exit code is 0, 2 (bad input), 70 (internal error), 130/143 (SIGINT/SIGTERM),
    141 (stdout's reader went away)."""
    reopen_closed_streams()
    with handled():
        return _run(argv)


if __name__ == "__main__":
    sys.exit(main())
