"""Command lines to mutate, and what the rules say of a mutated one (no test functions).

:data:`BASE` holds a small valid command line per verb (built-in ``tiny-llama``, ``-p fast``). The
strategy :func:`mutated_argv` replaces a value (text, a huge, negative, non-finite, empty or nested-JSON-ish
one), drops an item, duplicates one, adds an unknown flag, adds a valueless flag or abbreviates a flag,
and says of the result:

- whether argparse must refuse it (:attr:`Mutant.argparse`): an unknown or abbreviated flag (only whole
  names are flags), a missing required argument, a positional too many, a value argparse reads as a
  flag, a non-number (or non-finite number) for a numeric flag, a value outside a flag's choices, an
  empty path or a blank pipeline;
- whether it must be refused at all (:attr:`Mutant.refused`): also an option set where it has no
  effect (:func:`no_effect`): ``disasm --force`` without ``-o``, ``serve --force`` without
  ``--perfetto``, ``sweep --x``/``--y`` without ``--plot``, ``trace --think`` with single turns,
  ``reproduce --solve-budget-s`` without ``--solve``, ``baseline --lora-mode`` without ``--lora``, and
  ``run``'s options of the other replay (:data:`COST_ONLY`, :data:`FUNCTIONAL_ONLY`).
"""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass
from pathlib import Path

from hypothesis import strategies as st

from primal_compiler.cli import build_parser
from tests.fuzz.harness import rel


def _parsers() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    top = build_parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    return top, dict(sub.choices)


TOP, PARSERS = _parsers()

#: A small valid command line per verb (and per mode of ``run``); {s} is the scratch root.
BASE: dict[str, str] = {
    "inspect": "inspect tiny-llama --lora q,v:8 --target primal-7nm --json",
    "compile": "compile tiny-llama --lora q,v:8 -p fast --target primal-7nm -o {s}/out",
    "run-program": "run {s}/in/out --generate 8 --control central --memory report --json",
    "run-model": "run tiny-llama -p fast --batch 1 --context 64 --generate 8 -o {s}/out",
    "run-functional": "run {s}/in/m.onnx --functional --weights {s}/in/m.onnx --prompt 1,2,3 --generate 2 "
                      "--precision exact --save-logits {s}/l.npy",
    "reproduce": "reproduce --model tiny-llama --context 64 --batch8-context 32 -p fast --json",
    "viz": "viz {s}/in/out -o {s}/v --format svg --max-events 1000",
    "sweep": "sweep {s}/in/s.toml -o {s}/res --workers 1 --no-progress --max-points 10 --flush-every 0",
    "baseline": "baseline tiny-llama --gpu h100 --precision fp16 --batch 1 --prompt 4 --generate 4 --json",
    "check": "check {s}/in/m.onnx --prompt 1,2,3 --generate 2 --json",
    "disasm": "disasm {s}/in/out -o {s}/p.txt",
    "asm": "asm {s}/in/prog.txt -o {s}/p.primal",
    "thermal": "thermal {s}/in/out --phase decode --ambient-c 25 --json",
    "serve": "serve tiny-llama --adapters ad b --trace {s}/in/t.jsonl --context 64 -p fast --max-batch 2 "
             "--zero-fraction 0.3 --perfetto {s}/p.json --json",
    "trace": "trace -o {s}/t.jsonl --adapters a b --requests 3 --rate 1 --prompt 1:4 --generate 1:4 --seed 1",
    "map": "map tiny-llama --generations 1 --context 64 --json",
    "passes": "passes",
    "targets": "targets",
}
#: Verbs whose successful run takes a second or more (fewer examples).
SLOW_CASES = ("viz", "reproduce")
OUTPUT_FLAGS = ("-o", "--output", "--perfetto", "--save-logits")
NEVER_ADDED = ("--solve", "--help", "-h", "--scheduler", "--scheduler-file")  # slow, or not the CLI under test
UNKNOWN = ("--frobnicate", "--frobnicate=1", "-Z", "--no-such-option", "--force=yes", "--json=1")
WEIRD = ("nan", "", " ", "NaN", "inf", "-inf", "Infinity", "-1", "0", "0.5", "1", "1e400", "-1e400", "9" * 5000,
         str(2**63), str(10**30), "[" * 2000 + "]" * 2000, "[" * 5000, '{"a": [1, {"b": [null, true, 1e999]}]}',
         "{", "q,v:8", "primal-7nm", "tiny-llama", "x" * 5000, "é💥", "--", "-", "a=b", "1,2,3", "1:4", "4:1",
         "0:0", "\t", "1_000", "0x10", "+5", "٣", "tokens_per_s", "itl_s:min", "merged", "hardware", "strict")
NUMERIC_WEIRD = ("nan", "inf", "-inf", "NaN", "Infinity", "1e400", "-1e400", "9" * 5000, str(2**63), str(-2**63),
                 str(10**30), "-1", "0", "0.5", "1e-400", "", " 1 ", "1_000", "0x10", "+5", "٣", "[1]", '{"a": 1}',
                 "2", "3", "5", "30", "[" * 2000 + "]" * 2000, "1,2", "1:4")
#: random text: never a NUL (argv cannot hold one) nor a "/" (an output value must stay in the scratch tree)
TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00/"), max_size=20)

#: Options (and values) that have an effect only beside another option, per verb: added by the mutation
#: "misplace", so that :func:`no_effect`'s rules meet command lines argparse takes.
MISPLACED: dict[str, tuple[tuple[str, ...], ...]] = {
    "disasm": (("--force",),),
    "serve": (("--force",),),
    "sweep": (("--x", "itl_s"), ("--y", "tokens_per_s:min")),
    "trace": (("--think", "5"), ("--think", "30"), ("--turns", "1:3"), ("--turns", "1:1")),
    "reproduce": (("--solve-budget-s", "5"), ("--solve-budget-s", "1800")),
    "baseline": (("--lora-mode", "merged"), ("--lora-mode", "unmerged"), ("--lora", "q,v:8")),
    "run": (("-o", "{s}/o2"), ("--batch", "2"), ("--no-validate",), ("--control", "central"), ("--memory", "strict"),
            ("--memory", "report"), ("--critical-path",), ("--replay-steps", "2"), ("--baseline-gpu", "a100"),
            ("--baselines", "vllm:fp16"), ("--weights", "{s}/in/m.onnx"), ("--prompt", "1,2,3"),
            ("--precision", "hardware"), ("--precision", "exact"), ("--temperature-c", "50"),
            ("--save-logits", "{s}/l2.npy"), ("--functional",)),
}

#: ``primal run``'s options that only the cost replay uses, and those only ``--functional`` uses (dests): set
#: away from its default, one of the other replay's options is refused (README, ``primal run``).
COST_ONLY = ("output", "batch", "no_validate", "control", "memory", "critical_path", "replay_steps", "baseline_gpu",
             "baselines")
FUNCTIONAL_ONLY = ("weights", "prompt", "precision", "temperature_c", "save_logits")


@dataclass
class Item:
    flag: str | None  # None: a positional
    values: list[str]
    bad: str | None = None  # "argparse": argparse must refuse it; "refused": it must be refused


@dataclass
class Mutant:
    argv: list[str]  # {s} unfilled
    argparse: bool  # argparse must refuse it
    refused: bool  # it must be refused (argparse's reasons, or an option set where it has no effect)
    what: str


def _actions(verb: str) -> list[argparse.Action]:
    return [a for a in PARSERS[verb]._actions if not isinstance(a, argparse._HelpAction)]


def _action(verb: str, flag: str) -> argparse.Action | None:
    return next((a for a in _actions(verb) if flag in a.option_strings), None)


def _positionals(verb: str) -> list[argparse.Action]:
    return [a for a in _actions(verb) if not a.option_strings]


def _flags(verb: str) -> set[str]:
    """Every whole flag name ``verb``'s command line may hold (its own and the top-level parser's)."""
    return {s for p in (TOP, PARSERS[verb]) for a in p._actions for s in a.option_strings}


def tokenize(verb: str, argv: list[str]) -> list[Item]:
    items, i = [], 0
    while i < len(argv):
        token = argv[i]
        if token.startswith("-"):
            a = _action(verb, token)
            n = {None: 1, 0: 0, "+": 2 if token == "--adapters" else 1}[a.nargs]
            items.append(Item(token, argv[i + 1:i + 1 + n]))
            i += 1 + n
        else:
            items.append(Item(None, [token]))
            i += 1
    return items


def flatten(verb: str, items: list[Item]) -> list[str]:
    return [verb] + [t for it in items for t in ([it.flag] if it.flag else []) + it.values]


def _numeric(a: argparse.Action) -> str | None:
    """'int' or 'float' if the flag takes a number (argparse checks it), else None."""
    name = getattr(a.type, "__qualname__", "")
    if a.type is int or name.startswith("int_arg"):
        return "int"
    if a.type is float or name.startswith(("float_arg", "option_arg")):
        return "float"
    return None


def _flag_like(value: str) -> bool:
    """Whether argparse reads ``value`` as a flag (or the ``--`` separator), not as a value."""
    return value == "--" or (value.startswith("-") and len(value) > 1 and " " not in value
                             and not re.fullmatch(r"-\d+|-\d*\.\d+", value))


def refused_value(a: argparse.Action, value: str) -> str | None:
    """Whether ``value`` for ``a`` must be refused: "argparse" for a value argparse reads as a flag, one not
    among its choices, a non-number (or, for our number types, a non-finite number) for a numeric flag, an
    empty path or a blank pipeline; "refused" for a non-finite number given to a plain ``float`` flag
    (argparse takes ``nan``; the verb must not)."""
    if _flag_like(value) or (a.choices is not None and value not in a.choices):
        return "argparse"
    name = getattr(a.type, "__name__", "")
    if (name == "path_arg" and not value) or (name == "pipeline_arg" and not value.strip()):
        return "argparse"
    kind = _numeric(a)
    if kind == "int":
        try:
            int(value)
        except ValueError:
            return "argparse"
    elif kind == "float":
        try:
            finite = math.isfinite(float(value))
        except ValueError:
            return "argparse"
        return None if finite else "refused" if a.type is float else "argparse"
    return None


def _given(a: argparse.Action, it: Item) -> bool:
    return (it.flag in a.option_strings) if a.option_strings else it.flag is None


def argparse_refuses(verb: str, items: list[Item]) -> bool:
    """An item argparse refuses, a required argument missing, more positionals than the verb takes (those
    right after ``--adapters A B`` are more adapters), or a value its type function refuses."""
    kept, listing = [], False
    for it in items:
        if it.flag is not None:
            listing = getattr(_action(verb, it.flag), "nargs", None) == "+"
        if not (listing and it.flag is None):
            kept.append(it)
    missing = [a for a in _actions(verb) if a.required and not any(_given(a, it) for it in kept)]
    extra = sum(it.flag is None for it in kept) > len(_positionals(verb))
    if any(it.bad == "argparse" for it in items) or missing or extra:
        return True
    try:
        effective(verb, items)
    except (argparse.ArgumentTypeError, TypeError, ValueError):  # argparse's own type check refuses it
        return True
    return False


def effective(verb: str, items: list[Item]) -> dict[str, object]:
    """The parsed value of each option the command line sets (the last one given), by dest."""
    values: dict[str, object] = {}
    for it in items:
        a = _action(verb, it.flag) if it.flag else None
        if a is None:
            continue
        if a.nargs == 0:
            values[a.dest] = a.const
        elif a.nargs is None:
            values[a.dest] = a.type(it.values[-1]) if callable(a.type) else it.values[-1]
    return values


def no_effect(verb: str, items: list[Item]) -> str | None:
    """The option set where it has no effect, which must be refused (None: none is); only for a command
    line argparse takes."""
    values = effective(verb, items)
    default = {a.dest: a.default for a in _actions(verb)}

    def changed(dest: str) -> bool:
        return dest in values and values[dest] != default[dest]

    rules = {
        "disasm": [("--force", changed("force") and values.get("output") is None)],
        "serve": [("--force", changed("force") and values.get("perfetto") is None)],
        "sweep": [(flag, changed(flag[2:]) and not values.get("plot")) for flag in ("--x", "--y")],
        "trace": [("--think", changed("think") and values.get("turns", default["turns"]) == (1, 1))],
        "reproduce": [("--solve-budget-s", changed("solve_budget_s") and not values.get("solve"))],
        "baseline": [("--lora-mode", changed("lora_mode") and values.get("lora") is None)],
        "run": [(dest, changed(dest)) for dest in (COST_ONLY if values.get("functional") else FUNCTIONAL_ONLY)],
    }
    return next((flag for flag, hit in rules.get(verb, ()) if hit), None)


@st.composite
def mutated_argv(draw, case: str) -> Mutant:
    verb = case.split("-")[0]
    items = tokenize(verb, BASE[case].split()[1:])
    actions = [a for a in _actions(verb) if not set(a.option_strings) & set(NEVER_ADDED)]
    done = []
    for _ in range(draw(st.integers(1, 3))):
        how = draw(st.sampled_from(("value", "value", "drop", "duplicate", "unknown", "flag", "abbreviate",
                                    "misplace", "misplace")))
        if how == "value" and actions:
            given_ = [a for a in actions if a.nargs != 0 and any(_given(a, it) for it in items)]
            a = draw(st.sampled_from(given_ or actions)) if draw(st.integers(0, 3)) else draw(st.sampled_from(actions))
            if a.nargs == 0:
                continue
            pool = NUMERIC_WEIRD if _numeric(a) else WEIRD + tuple(a.choices or ())
            value = draw(st.one_of(st.sampled_from(pool), TEXT) if draw(st.integers(0, 3)) else TEXT)
            present = [it for it in items if _given(a, it)]
            if not a.option_strings:
                if not present:
                    continue
                target = present[0]
                target.values = [value]
            elif present and draw(st.booleans()):
                target = draw(st.sampled_from(present))
                target.values = [value]
            else:
                target = Item(a.option_strings[-1], [value])
                items.append(target)
            target.bad = refused_value(a, value)
            done.append(f"{a.option_strings[-1] if a.option_strings else a.dest}={value[:20]!r}")
        elif how == "drop" and items:
            i = draw(st.integers(0, len(items) - 1))
            done.append(f"drop {items[i].flag or items[i].values[0]}")
            del items[i]
        elif how == "duplicate" and items:
            it = draw(st.sampled_from(items))
            items.append(Item(it.flag, list(it.values), it.bad))
            done.append(f"duplicate {it.flag or it.values[0]}")
        elif how == "unknown":
            items.append(Item(draw(st.sampled_from(UNKNOWN)), [], bad="argparse"))
            done.append(f"unknown {items[-1].flag}")
        elif how == "flag":
            flags = [a for a in actions if a.nargs == 0]
            if flags:
                items.append(Item(draw(st.sampled_from(flags)).option_strings[-1], []))
                done.append(f"flag {items[-1].flag}")
        elif how == "misplace" and verb in MISPLACED:
            flag, *values = draw(st.sampled_from(MISPLACED[verb]))
            items.append(Item(flag, values))
            done.append(f"add {' '.join([flag, *values])}")
        elif how == "abbreviate":
            longs = sorted({s for a in actions for s in a.option_strings if s.startswith("--") and len(s) > 3})
            if longs:
                flag = draw(st.sampled_from(longs))
                short = flag[:draw(st.integers(3, len(flag) - 1))]
                if short not in _flags(verb):
                    mine = [it for it in items if it.flag == flag]
                    it = mine[0] if mine else Item(flag, [] if _action(verb, flag).nargs == 0 else ["1"])
                    it.flag, it.bad = short, "argparse"
                    items += [] if mine else [it]
                    done.append(f"abbreviate {flag} as {short}")
    argparse_ = argparse_refuses(verb, items)
    last = {it.flag: it for it in items if it.flag}  # argparse keeps an option's last value
    refused = argparse_ or any(it.bad for it in last.values()) or no_effect(verb, items) is not None
    return Mutant(flatten(verb, items), argparse_, refused, "; ".join(done))


def outputs(case: str, argv: list[str], root: Path) -> tuple[str, ...]:
    """The $S-relative paths an invocation may write: its output flags' last values (argparse keeps the last),
    or ``viz``'s default OUT/viz."""
    found: dict[str, str] = {}
    for flag, value in zip(argv, argv[1:]):
        if flag in OUTPUT_FLAGS:
            found["-o" if flag == "--output" else flag] = value
    if case == "viz" and "-o" not in found:
        positional = next((a for a in argv[1:] if not a.startswith("-")), None)
        found["-o"] = f"{positional}/viz" if positional else ""
    return tuple(r for r in (rel(root, v) for v in found.values()) if r)
