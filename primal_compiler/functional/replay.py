"""Execute a compiled program's instruction stream numerically: prefill a prompt, decode greedily.

:func:`replay_functional` runs the records in stream order through a
dispatch table keyed by opcode (:mod:`.routers`, :mod:`.compute`), section
by section: for each request its ``adapter:r`` (if any), its ``prefill:r``
(the prompt, whose length the program fixed at compile time) and the first
``generate - 1`` steps of its ``decode:r`` (each step ends with ARGMAX; the
rest of the section is not issued). Every request gets the same prompt and,
when the program has LoRA, the adapter its CONFIG records name (the
program's ``codegen{requests=...}``; adapter k is the k-th directory given).
The result holds the first request's generated tokens and the logits of
each of its steps, and every request's tokens.

Supported programs: batch 1 (kv-ring ``batch=1``), or a batch whose every pass carries one sequence
(``codegen{pipeline=true}`` and one adapter per sequence, ``requests=a+b+...``: each sequence gets the
prompt and ``FunctionalResult.sequence_tokens`` its tokens), pre-norm decoder
layers, square crossbars (``rram.rows == rram.cols``) and LoRA tiles as tall
as a crossbar (``sram.rows == rram.rows``), which codegen assumes when it
wires LoRA B outputs into root columns and MLP outputs into the next
matrix's input blocks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from primal_compiler.errors import InputError
from primal_compiler.frontend.peft import load_peft_adapter
from primal_compiler.functional import compute, routers
from primal_compiler.functional.machine import OP, Machine
from primal_compiler.functional.params import load_params
from primal_compiler.functional.precision import PRECISIONS, HardwareSpec, Numerics
from primal_compiler.thermal.adc import adc_offset_lsb
from primal_compiler.ir.model import Positional
from primal_compiler.ir.tiles import Macro
from primal_compiler.isa.descriptors import DESCRIPTORS, Descriptor
from primal_compiler.isa.opcodes import ARG_ENUM_MASK, ActFn, Flag, Opcode
from primal_compiler.transforms.lora_sparsity import zero_tiles
from primal_compiler.mapping.lower import geometry

if TYPE_CHECKING:
    from primal_compiler.ir.program import Program
    from primal_compiler.target.spec import PrimalTarget


def handlers(table: Mapping[Opcode, Descriptor]) -> dict[Opcode, Callable]:
    """The functional rule of every opcode in ``table``: the function of :mod:`.routers` or :mod:`.compute`
    its ``functional_rule`` names; NameError naming the opcode and the rule when neither defines it."""
    out = {}
    for op, d in table.items():
        rule = next((f for f in (getattr(m, d.functional_rule, None) for m in (routers, compute))
                     if callable(f) and getattr(f, "__module__", None) in (routers.__name__, compute.__name__)), None)
        if rule is None:
            raise NameError(f"opcode {op.name}: functional rule {d.functional_rule!r} is not a function of "
                            f"{routers.__name__} or {compute.__name__}")
        out[op] = rule
    return out


HANDLERS = handlers(DESCRIPTORS)


@dataclass(frozen=True, eq=False)
class FunctionalResult:
    """Outcome of one replay: what the program computed for the first request."""

    tokens: list[int]  # generated token ids, ``generate`` of them
    logits: np.ndarray  # float32 [generate, vocab]: the prefill's last position, then each decode step
    prompt: list[int]
    precision: str
    records: int  # records executed over all requests
    seconds: float
    request_tokens: list[list[int]] = field(default_factory=list)  # generated ids of every request (its sequence 0)
    # (consumer, producer) int64 record indices, one row per distinct pair: a value ``producer`` wrote was
    # consumed by ``consumer`` (every request's records); only with ``producers=True``, else None
    producers: tuple[np.ndarray, np.ndarray] | None = None
    crossbars: int = 0  # RRAM crossbars the replay used
    crossbars_stored: int = 0  # of which hold a quantized file's codes as they are (hardware mode)
    sequence_tokens: list[list[list[int]]] = field(default_factory=list)  # per request, each sequence's ids

    def summary(self) -> dict:
        """JSON-ready facts (no logits)."""
        return {"tokens": self.tokens, "prompt": self.prompt, "precision": self.precision,
                "steps": len(self.tokens), "records": self.records, "seconds": round(self.seconds, 6),
                "request_tokens": self.request_tokens, "sequence_tokens": self.sequence_tokens,
                "crossbars": self.crossbars,
                "crossbars_stored": self.crossbars_stored}


def _plan(program: Program, where: str, prompt: list[int], generate: int) -> list[tuple[str, int, int, int | None]]:
    """(name, start, stop, steps to run or None for all) of every section, once the program fits the run."""
    model, stream, kv = program.model, program.stream, program.kv
    if stream is None or kv is None:
        raise InputError(where, "has no instruction stream; compile it through kv-ring and codegen")
    rec, batch = stream.records, kv.batch
    plan: list[tuple[str, int, int, int | None]] = []
    for s in stream.sections:
        part = rec[s.start : s.stop]
        argmax = (part["op"] == Opcode.ACT) & (part["arg"] == ActFn.ARGMAX)
        steps = int(argmax.sum())
        is_embed = (part["op"] == Opcode.ACT) & ((part["arg"] & ARG_ENUM_MASK[Opcode.ACT]) == ActFn.EMBED)
        if batch > 1:
            _one_sequence_a_pass(where, s.name, part, argmax, is_embed, model.hidden_size, batch)
        if s.name.startswith("prefill:"):
            embed = part[is_embed]
            tokens = int(embed["count"].astype(np.int64).sum()) // model.hidden_size // batch if len(embed) else 0
            history = int(embed["arg"].max()) >> 8 if len(embed) else 0
            if history:
                raise InputError(where, f"{s.name} continues a saved conversation of {history} tokens "
                                        f"(codegen{{history={history}}}) whose KV cache no record of this stream "
                                        "wrote; the functional replay starts from an empty cache")
            if tokens != len(prompt) or not (embed["flags"] & Flag.PREFILL).all():
                raise InputError(where, f"{s.name} prefills {tokens} tokens but the prompt has {len(prompt)}; "
                                        f"compile for the prompt (codegen{{prompt={len(prompt)}}})")
        if s.name.startswith("decode:"):
            if steps < (generate - 1) * batch:
                raise InputError(where, f"{s.name} has {steps // batch} decode steps; generating {generate} tokens "
                                        f"needs {generate - 1} (codegen{{steps={generate - 1}}})")
            plan.append((s.name, s.start, s.stop, (generate - 1) * batch))
        else:
            plan.append((s.name, s.start, s.stop, None))
    if not any(s.name.startswith("prefill:") for s in stream.sections):
        raise InputError(where, "has no prefill section")
    return plan


def _one_sequence_a_pass(where: str, name: str, part: np.ndarray, argmax: np.ndarray, embed: np.ndarray, hidden: int,
                         batch: int) -> None:
    """A batch replays when each pass carries one sequence (the stream does not say which sequence a row of a
    merged pass belongs to): one token a decode EMBED, an EMBED before every prefill ARGMAX."""
    why = (f"was compiled for batch {batch} with {name} carrying several sequences in one pass; the functional "
           "replay runs a batch whose every pass carries one sequence (codegen{pipeline=true}, and a prefill per "
           "sequence: one adapter per sequence, requests=a+b+...)")
    if name.startswith("decode:") and (part["count"][embed].astype(np.int64) != hidden).any():
        raise InputError(where, why)
    if name.startswith("prefill:"):
        seen = np.cumsum(embed)[argmax]  # EMBEDs up to each ARGMAX: a new one before each
        if len(seen) != batch or (np.diff(seen) == 0).any():
            raise InputError(where, why)


def _check_program(program: Program, target: PrimalTarget, where: str, prompt: list[int], generate: int) -> None:
    model = program.model
    if target.rram.rows != target.rram.cols or target.sram.rows != target.rram.rows:
        raise InputError(where, f"the functional replay needs rram.rows == rram.cols == sram.rows, target "
                                f"{target.name} has {target.rram.rows}, {target.rram.cols}, {target.sram.rows}")
    for layer in model.layers:
        if layer.num_norms != 2 and not (layer.parallel and layer.num_norms == 1) and not layer.post_norms:
            raise InputError(where, f"layer {layer.index} has {layer.num_norms} norms; the replay runs pre-norm layers")
    if not prompt or any(not 0 <= t < model.vocab_size for t in prompt):
        raise InputError("prompt", f"needs one or more token ids in 0..{model.vocab_size - 1}, got {prompt}")
    if generate < 1:
        raise InputError("generate", f"must be >= 1, got {generate}")
    last = len(prompt) + generate - 2
    if model.positional == Positional.LEARNED and last >= model.max_position_embeddings:
        raise InputError("generate", f"the last step sits at position {last}; model {model.name} has "
                                     f"{model.max_position_embeddings} learned positions")


def _check_masks(program: Program, target: PrimalTarget, adapter_dir) -> None:
    """Every LoRA block the program masks (``lora-sparsity``) is all zero in each adapter directory given: a
    mask taken from another adapter would drop this one's update, so it is an InputError naming the directory."""
    t = program.need_tiles()
    masked = (t.macro == Macro.SRAM) & (t.zero == 1)
    dirs = [adapter_dir] if isinstance(adapter_dir, (str, Path)) else list(adapter_dir or ())
    for d in dirs if masked.any() else ():
        held = zero_tiles(t, load_peft_adapter(d), geometry(program.model, target), program.model, padded=True) == 0
        wrong = int((masked & held).sum())
        if wrong:
            raise InputError(str(d), f"the program masks {wrong} LoRA block(s) that this adapter holds nonzero "
                                     "values in (its lora-sparsity read another adapter's zeros)")


def _adc_offsets(program: Program, target: PrimalTarget, precision: str,
                 temperature_c: float | np.ndarray | None) -> np.ndarray | None:
    """Per CT, the offset of its ADCs at ``temperature_c`` (one value, or one per CT); None without one."""
    if temperature_c is None:
        return None
    if precision != "hardware":
        raise InputError("temperature", "applies to hardware precision only (exact precision has no ADC to drift)")
    cts = int(program.need_tiles().ct.max()) + 1
    t = np.asarray(temperature_c, dtype=np.float64)
    if t.ndim > 1 or (t.ndim == 1 and t.shape != (cts,)):
        raise InputError("temperature", f"expected one temperature or one per CT ({cts}), got shape {t.shape}")
    return np.broadcast_to(adc_offset_lsb(target, t), (cts,))


def replay_functional(program: Program, target: PrimalTarget, weights_path: str | Path,
                      adapter_dir: str | Path | Sequence[str | Path] | None = None, *,
                      prompt, generate: int = 1, precision: str = "exact", where: str | None = None,
                      force=None, producers: bool = False,
                      temperature_c: float | np.ndarray | None = None) -> FunctionalResult:
    """Run ``program``'s stream on ``prompt`` for ``generate`` greedy tokens with the weights of the files.

    ``weights_path`` is the model's ONNX file (base weights, biases,
    embeddings, norms, and its unmerged LoRA if any); ``adapter_dir`` a PEFT
    adapter directory whose LoRA replaces the file's, or several, adapter
    ids 0, 1, ... in order (each CONFIG loads the adapter it names, so each
    request computes with its own). ``force`` (teacher
    forcing): ``force[k]`` replaces the token step k generated (the prefill
    is step 0) as the input of step k + 1, e.g. a reference continuation,
    so every step's logits are comparable with the reference's; ``tokens``
    still reports each step's argmax. ``where`` names the program in error
    messages. ``producers``: also log which record produced every value each
    executed record consumed, at element granularity (buffer elements, KV
    token rows, SRAM slots, mask bits, the controller's token and position;
    see :mod:`.provenance`), into ``FunctionalResult.producers``; off, the
    replay keeps no such state. ``temperature_c`` (hardware precision only):
    the die temperature of every CT, or one per CT (e.g. ``primal thermal``'s
    map); each CT's ADCs then convert with their offset drift
    (:func:`primal_compiler.thermal.adc.adc_offset_lsb`); None is the ADCs'
    calibration temperature. Any mismatch between files and program, and
    any record the state cannot execute, is an :class:`InputError`.
    """
    where = where or f"program {program.model.name}"
    if precision not in PRECISIONS:
        raise InputError("precision", f"must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    prompt = [int(t) for t in prompt]
    _check_program(program, target, where, prompt, generate)
    forced = [int(t) for t in force or ()]
    if any(not 0 <= t < program.model.vocab_size for t in forced):
        raise InputError("force", f"token ids must be in 0..{program.model.vocab_size - 1}, got {forced}")
    plan = _plan(program, where, prompt, generate)
    params = load_params(program.model, weights_path, adapter_dir)
    _check_masks(program, target, adapter_dir)
    start_time = time.perf_counter()
    numerics = Numerics(precision, HardwareSpec.of(target, program.model.precision),
                        _adc_offsets(program, target, precision, temperature_c))
    m = Machine(program, target, params, numerics, where, producers=producers)
    m.prompt = prompt
    m.forced = forced
    records = program.need_stream().records.tolist()
    executed = 0
    firsts = []
    for name, start, stop, limit in plan:
        if name.startswith("prefill:"):
            firsts.append(len(m.logits))
        goal = m.steps + limit if limit is not None else None
        for i in range(start, stop):
            if goal is not None and m.steps >= goal:
                break
            r = records[i]
            m.index, m.record = i, r
            m.check_awake()
            handler = HANDLERS.get(r[OP])
            if handler is None:
                raise m.fail(f"no functional semantics for opcode {Opcode(r[OP]).name}")
            handler(m, r)
            executed += 1
    bounds = [*firsts, len(m.logits)]
    runs = [[[x for x, q in zip(m.logits[a:b], m.logit_seq[a:b], strict=True) if q == seq][:generate]
             for seq in range(program.need_kv().batch)] for a, b in zip(bounds, bounds[1:])]
    tokens = [[[int(np.argmax(x)) for x in run] for run in request] for request in runs]
    return FunctionalResult(tokens[0][0], np.stack(runs[0][0]).astype(np.float32), prompt, precision, executed,
                            time.perf_counter() - start_time, [t[0] for t in tokens],
                            None if m.log is None else m.log.pairs(), len(m.crossbars),
                            sum(x.stored for x in m.crossbars.values()), tokens)
