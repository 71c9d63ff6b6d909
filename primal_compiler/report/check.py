"""``primal check MODEL.onnx``: does this tool understand a user's ONNX export?

:func:`check_onnx` imports the file (the frontend refuses what it does not
recognise, naming the node), compiles it with the ``fast`` pipeline for a
short prompt, replays the stream functionally in exact precision and
compares the logits of every step with ONNX Runtime on the same file and
prompt (:func:`ort_greedy`). ONNX Runtime runs the file as written, its
graph optimizations off: some change the arithmetic (the fusion of
``DequantizeLinear`` and ``MatMul`` into ``MatMulNBits`` quantizes the
activations to int8 by default). A file whose activations ONNX Runtime
quantizes at run time (``DynamicQuantizeLinear`` into ``MatMulInteger``) is
compared with its float-activation twin (``frontend.onnx_reference``: the
same weight codes, decoded by ONNX Runtime), and the result also says how
far ONNX Runtime's own quantized run is from the replay. The replay is teacher-forced with ONNX Runtime's
greedy tokens, so a near-tie in an argmax cannot make two correct runs
diverge. The error is ``max |replay - onnxruntime|`` over all steps divided
by the logit scale ``max |onnxruntime logit|``; it must stay within
:data:`TOLERANCE` (fp32 files) or :data:`TOLERANCE_FP16` (files whose logits
output is float16 or bfloat16, as ONNX Runtime reports its type).

With an adapter directory the replay also runs with the adapter's LoRA
(roles and ranks read from the adapter), but ONNX Runtime only runs the
file's own weights: the comparison is made without the adapter, and the
result says so and how far the adapter moves the logits.

The same file, target, prompt and adapter give the same result.
onnxruntime is optional: it is imported here, lazily; without it nothing is
compared and the verdict says so.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from primal_compiler.errors import InputError, one_line
from primal_compiler.ir.model import Activation, LoRA, Model, NormKind, Positional, Role
from primal_compiler.target import PrimalTarget

if TYPE_CHECKING:
    from primal_compiler.ir.program import Program

#: The prompt, unless one is given: token ids 1, 2, 3, 4 (reduced modulo the vocabulary); 0 is often padding.
PROMPT = (1, 2, 3, 4)
#: Tokens generated (the prefill's and two decode steps'), unless told.
GENERATE = 3
#: Largest error allowed, relative to the logit scale, for fp32 files (the fixtures measure below 4e-7).
TOLERANCE = 1e-5
#: The same for files whose logits are float16 or bfloat16 (ONNX Runtime computes them in that precision).
TOLERANCE_FP16 = 1e-3
_HALF = ("tensor(float16)", "tensor(bfloat16)")


def _session(path: str, as_written: bool = True):
    """ONNX Runtime on the file as written (the float-activation twin of a dynamically quantized file,
    optimizations off), or as ONNX Runtime runs it by default (``as_written=False``); one session per
    version of the file (a file rewritten in place gets a new one)."""
    stat = Path(path).stat()
    return _session_of(path, stat.st_mtime_ns, stat.st_size, as_written)


@lru_cache(maxsize=None)
def _session_of(path: str, mtime_ns: int, size: int, as_written: bool):
    import onnxruntime as ort

    from primal_compiler.frontend.onnx_reference import float_activation_twin

    options = ort.SessionOptions()
    options.log_severity_level = 4  # its errors are reported in the verdict, not logged
    if not as_written:
        return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(float_activation_twin(path) or path, options, providers=["CPUExecutionProvider"])


def ort_logits(path: str | Path, ids: list[int], as_written: bool = True) -> np.ndarray:
    """Logits of the last position of ``ids`` from ONNX Runtime, in the output's own dtype.

    Feeds every input signature the exporters write: ``input_ids``, an
    all-ones ``attention_mask``, ``position_ids`` 0..n-1, empty
    ``past_key_values.*`` (in the input's float type), and TorchScript's
    scalar index of the position whose logits are returned.
    """
    session, n = _session(str(path), as_written), len(ids)
    feeds = {}
    for i in session.get_inputs():
        if i.name == "input_ids":
            feeds[i.name] = np.array([ids], np.int64)
        elif i.name == "attention_mask":
            feeds[i.name] = np.ones((1, n), np.int64)
        elif i.name == "position_ids":
            feeds[i.name] = np.arange(n, dtype=np.int64)[None]
        elif i.name.startswith("past_key_values"):
            shape = [1] + [d if isinstance(d, int) else 0 for d in i.shape[1:]]
            feeds[i.name] = np.zeros(shape, np.float16 if i.type == "tensor(float16)" else np.float32)
        else:
            feeds[i.name] = np.array(n - 1, np.int64)
    out = session.run(None, feeds)[0]
    return out[0, -1] if out.ndim == 3 else out[0]


def ort_greedy(path: str | Path, prompt: list[int], generate: int, as_written: bool = True) -> np.ndarray:
    """Logits [generate, vocab] of greedy decoding by ONNX Runtime, feeding the whole sequence each step."""
    ids, rows = list(prompt), []
    for _ in range(generate):
        rows.append(ort_logits(path, ids, as_written))
        ids.append(int(np.argmax(rows[-1])))
    return np.stack(rows)


def compare(got: np.ndarray, want: np.ndarray, tolerance: float) -> dict:
    """Error of ``got`` against ``want`` (both [steps, vocab]), relative to the scale ``max |want|``.

    ``max_error`` is absolute, ``relative_error`` divides it by the scale
    (by 1 when every reference logit is 0); ``step`` is the first step where
    the relative error exceeds ``tolerance`` (None when none does). A NaN or
    an infinity on either side is a mismatch (its errors are None).
    """
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        raise InputError("compare", f"logits of shape {got.shape} against a reference of shape {want.shape}")
    finite = bool(np.isfinite(got).all() and np.isfinite(want).all())
    scale = float(np.abs(want).max()) if finite and want.size else 0.0
    per_step = np.abs(got - want).max(axis=1) / (scale or 1.0) if finite else np.full(len(got), np.inf)
    bad = np.flatnonzero(~(per_step <= tolerance))
    return {
        "max_error": float(np.abs(got - want).max()) if finite else None,
        "scale": scale if finite else None,
        "relative_error": float(per_step.max()) if finite else None,
        "tolerance": tolerance,
        "step": int(bad[0]) if len(bad) else None,
        "steps": len(got),
    }


def family_of(model: Model) -> str:
    """A structural label (what the layers compute, not the exporter's name): llama-style, gpt2-style, ..."""
    layer = model.layers[0]
    if layer.parallel:
        return f"parallel-block {family_of(replace(model, layers=(replace(layer, parallel=False),)))}"
    gated = layer.linear(Role.GATE) is not None
    if model.positional == Positional.ROPE and model.norm == NormKind.RMS and gated:
        return "gemma-style" if model.embed_scale != 1.0 else "llama-style"
    if model.positional == Positional.LEARNED and model.norm == NormKind.LAYER and not gated:
        if layer.activation == Activation.GELU_NEW:
            return "gpt2-style"
        if layer.activation == Activation.RELU:
            return "opt-style"
    return f"{model.positional.value} {model.norm.value} {'gated ' if gated else ''}{layer.activation.value} decoder"


def with_adapter(model: Model, adapter_dir: str | Path) -> tuple[Model, str]:
    """``model`` with exactly the LoRA of the PEFT adapter in ``adapter_dir`` (its roles, ranks, scale and DoRA),
    and a short description (``q,v r8``); LoRA on a projection the model lacks is an :class:`InputError`
    (shapes are checked by the replay)."""
    from primal_compiler.frontend.peft import load_peft_adapter

    adapter = load_peft_adapter(adapter_dir)
    lora = adapter.lora
    for n, role in lora:
        if n >= model.num_layers or model.layers[n].linear(role) is None:
            raise InputError(adapter.source, f"has LoRA on layer {n} {role.value}, a projection model {model.name} "
                                             "does not have")
    found: dict[tuple[int, Role], LoRA] = {}
    for key, p in lora.items():
        rank = p.rank
        if rank is None:  # ModelWeights.lora holds only the projections with LoRA factors
            raise InputError(adapter.source, f"has no LoRA factors on layer {key[0]} {key[1].value}")
        found[key] = LoRA(rank, p.scale * rank, p.magnitude is not None)
    layers = tuple(replace(layer, linears=tuple(replace(lin, lora=found.get((n, lin.role))) for lin in layer.linears))
                   for n, layer in enumerate(model.layers))
    roles = sorted({role.value for _, role in lora})
    ranks = sorted({f.rank for f in found.values()})
    return replace(model, layers=layers), f"{','.join(roles)} r{'/'.join(str(r) for r in ranks)}"


def _static_length(path: str) -> int | None:
    """The sequence length an export fixes in its ``input_ids`` shape, when onnxruntime can read it."""
    try:
        inputs = {i.name: i.shape for i in _session(path).get_inputs()}
    except Exception:  # no onnxruntime, or a file it cannot load: _reference says so
        return None
    shape = inputs.get("input_ids") or []
    return shape[1] if len(shape) == 2 and isinstance(shape[1], int) and shape[1] > 0 else None


def _reference(path: str, prompt: list[int], generate: int) -> tuple[np.ndarray | None, dict]:
    """ONNX Runtime's logits and what it was (version, precision), or None and why nothing was compared."""
    try:
        import onnxruntime
    except ImportError:
        return None, {"reference": None, "note": "onnxruntime not installed: compared nothing"}
    facts = {"reference": f"onnxruntime {onnxruntime.__version__}"}
    try:
        half = _session(path).get_outputs()[0].type in _HALF
        facts["precision"] = "fp16" if half else "fp32"
        return ort_greedy(path, prompt, generate), facts
    except Exception as exc:  # the reference's own failure is reported, not raised: it says nothing of the replay
        hint = " (if the export has a fixed sequence length S, pass S --prompt ids and --generate 1)"
        return None, {**facts, "note": f"onnxruntime could not run the file: {one_line(exc, 200)}{hint}: "
                                       "compared nothing"}


def check_onnx(path: str, target: PrimalTarget, prompt: list[int] | None = None, generate: int | None = None,
               adapter_dir: str | None = None) -> dict:
    """JSON-ready result of checking ``path``: ``verdict`` is OK, MISMATCH or UNVERIFIED (nothing compared).

    ``prompt`` defaults to :data:`PROMPT` and ``generate`` to :data:`GENERATE`,
    except for an export whose ``input_ids`` shape fixes the sequence length
    S (a static export): ids 1..S (modulo the vocabulary), one token.

    Anything the frontend, the compiler or the replay refuses (an unknown
    node, an adapter that does not fit) is raised as the refusing
    :class:`InputError`, which the caller reports as REFUSED; a ``prompt``
    id outside the vocabulary is an InputError whose ``where`` is ``--prompt``.
    """
    from primal_compiler.frontend import load_model
    from primal_compiler.functional import compile_for_replay, replay_functional

    model = load_model(path)
    static = _static_length(path) if prompt is None else None
    if prompt is not None and any(not 0 <= t < model.vocab_size for t in prompt):
        raise InputError("--prompt", f"token ids must be in 0..{model.vocab_size - 1}, got {list(prompt)}")
    prompt = list(prompt) if prompt else [t % model.vocab_size for t in (range(1, 1 + static) if static else PROMPT)]
    generate = generate or (1 if static else GENERATE)

    def compiled(m: Model):
        return compile_for_replay(m, target, len(prompt), generate, "fast")

    def replay(program: Program, adapter: str | None, force: list[int] | None) -> np.ndarray:
        return replay_functional(program, target, path, adapter, prompt=prompt, generate=generate,
                                 precision="exact", where=path, force=force).logits

    program = compiled(model)
    base = replay(program, None, None)  # every refusal comes before the reference runs
    if adapter_dir is not None:
        adapter_model, described = with_adapter(model, adapter_dir)
        adapter_program = compiled(adapter_model)
        replay(adapter_program, adapter_dir, None)
    want, facts = _reference(path, prompt, generate)
    info = {"file": path, "family": family_of(model), "layers": model.num_layers, "hidden": model.hidden_size,
            "vocab": model.vocab_size, "prompt": prompt, "steps": generate, "precision": None, "reference": None,
            "note": None, "adapter": None, "runtime_quantization": None, **facts}
    forced = [int(t) for t in (base if want is None else want).argmax(axis=1)][: generate - 1]
    if want is None:
        info.update(verdict="UNVERIFIED", max_error=None, scale=None, relative_error=None, step=None,
                    tolerance=None)
    else:
        base = replay(program, None, forced)
        tolerance = TOLERANCE_FP16 if info["precision"] == "fp16" else TOLERANCE
        result = compare(base, want, tolerance)
        info.update(result, verdict="OK" if result["step"] is None else "MISMATCH")
        if any(q.dynamic_inputs for q in model.weight_quant) or model.static_activations:  # against its own run
            own = np.stack([ort_logits(path, prompt + forced[:k], as_written=False) for k in range(generate)])
            info["runtime_quantization"] = {"moves_logits_by": compare(base, own, np.inf)["relative_error"],
                                            "static": bool(model.static_activations)}
    if adapter_dir is not None:
        moved = compare(replay(adapter_program, adapter_dir, forced), base, np.inf)["relative_error"]
        info["adapter"] = {"directory": adapter_dir, "lora": described, "moves_logits_by": moved,
                           "compared": False}
    return info


def render_check(info: dict) -> str:
    """The one verdict line of a result of :func:`check_onnx`."""
    head = f"{info['family']}, {info['layers']} layers, hidden {info['hidden']}"
    steps = f"{info['steps']} step{'s' if info['steps'] != 1 else ''}"
    if info["verdict"] == "OK":
        body = f"logits match onnxruntime to {info['relative_error']:.1e} of the logit scale over {steps}"
    elif info["verdict"] == "MISMATCH":
        off = "non-finite" if info["relative_error"] is None else f"{info['relative_error']:.1e} of the logit scale"
        body = (f"logits differ from onnxruntime by {off} (tolerance {info['tolerance']:.0e}), first at step "
                f"{info['step']} of {steps}")
    else:
        body = f"replayed {steps}; {info['note']}"
    if info.get("runtime_quantization"):
        moved = info["runtime_quantization"]["moves_logits_by"]
        how = ("rounds them at the file's calibrated scales" if info["runtime_quantization"].get("static")
               else "quantizes them to uint8 at run time")
        body += (f"; compared with float activations: onnxruntime's own run, which {how}, is {moved:.1e} of the "
                 "scale away")
    adapter = info["adapter"]
    if adapter is not None:
        moved = "non-finite" if adapter["moves_logits_by"] is None else f"{adapter['moves_logits_by']:.1e}"
        body += (f"; adapter {adapter['directory']} ({adapter['lora']}) replayed, moving the logits by {moved} "
                 "of their scale, but compared without it: onnxruntime runs only the file's own weights")
    return f"check {info['file']}: {info['verdict']} ({head}; {body})"


def cmd_check(args: argparse.Namespace) -> None:
    """``primal check MODEL.onnx``: print the verdict line (or ``--json`` object) of :func:`check_onnx`.

    Exit 0 for OK and UNVERIFIED, 1 for MISMATCH (``SystemExit``), 2 for
    REFUSED through the usual one-line :class:`InputError`
    (``primal: check MODEL.onnx: REFUSED: <reason>``; with ``--json`` the
    object is printed too). A missing file, a bad target, a prompt outside
    the vocabulary or no ``onnxruntime`` to compare with (it comes with the
    ``test`` extra) is a plain InputError, not a verdict: nothing is run.
    """
    from primal_compiler.argtypes import token_ids
    from primal_compiler.target import load_primal_target

    if not args.model.lower().endswith(".onnx") or not Path(args.model).is_file():
        raise InputError(args.model, "no such file; expected an ONNX export (MODEL.onnx)")
    target = load_primal_target(args.target)
    prompt = token_ids(args.prompt) if args.prompt is not None else None
    try:
        import onnxruntime  # noqa: F401  (the reference; only its absence is checked here)
    except ImportError:
        raise InputError("check", "needs onnxruntime to compare the replay with, and it is not installed "
                                  "(pip install onnxruntime, or primal-compiler[test])") from None
    try:
        info = check_onnx(args.model, target, prompt, args.generate, args.adapter)
    except InputError as exc:
        if exc.where == "--prompt":  # the user's prompt, not the file
            raise
        own = isinstance(exc.where, str) and Path(exc.where) == Path(args.model)  # the file: named once
        reason = one_line(exc.problem if own else exc, 2000)
        if args.json:
            print(json.dumps({"verdict": "REFUSED", "file": args.model, "reason": reason}, indent=2))
        raise InputError(f"check {args.model}", f"REFUSED: {reason}") from None
    print(json.dumps(info, indent=2, sort_keys=True) if args.json else render_check(info))
    if info["verdict"] == "MISMATCH":
        sys.stdout.flush()
        raise SystemExit(1)


def add_parser(sub) -> None:
    """Register ``check`` on an argparse subparsers object."""
    from primal_compiler.argtypes import option_arg

    sp = sub.add_parser("check", help="does this tool understand an ONNX export? replay it against onnxruntime")
    sp.add_argument("model", help="the .onnx file")
    sp.add_argument("--adapter", default=None, help="a PEFT adapter directory, also replayed (compared without it)")
    sp.add_argument("--target", default="primal-7nm", help="bundled target name or a .toml path")
    sp.add_argument("--prompt", default=None,
                    help="prompt token ids (default 1,2,3,4 modulo the vocabulary; 1..S for an export of "
                         "fixed length S)")
    sp.add_argument("--generate", type=option_arg("codegen", "steps"), default=None,
                    help="tokens to generate (default 3; 1 for an export of fixed sequence length)")
    sp.add_argument("--json", action="store_true", help="print one JSON object")
    sp.set_defaults(func=cmd_check)
