"""The family of GPU baselines every PRIMAL report shows beside PRIMAL.

A member is (engine, precision, KV bits); the family is priced for one GPU
with :func:`~primal_compiler.baselines.engine.serve` on the same model,
adapters (unmerged), batch, prompt and context as the PRIMAL program, so the
reader sees how the PRIMAL/GPU ratio moves with the engine and the
precision. The seed's own comparison point (the FP16 H100 roofline of
:mod:`.h100`) stays in reports under ``h100`` and is labelled as such.

A :class:`Selection` (the GPU and the members) is passed to every report
explicitly; ``primal run`` and ``primal reproduce`` build it from
``--baseline-gpu`` / ``--baselines`` (:func:`selection`).
"""

from __future__ import annotations

from dataclasses import dataclass

from primal_compiler.errors import InputError

__all__ = ["DEFAULT", "DEFAULT_GPU", "DEFAULT_MEMBERS", "Member", "Selection", "family_for", "family_for_program",
           "parse_members", "selection"]


@dataclass(frozen=True)
class Member:
    """One GPU configuration of the family."""

    engine: str
    precision: str
    kv_bits: int = 16

    @property
    def label(self) -> str:
        """``vllm:fp16`` (``:kv8`` appended for an 8-bit KV cache)."""
        return f"{self.engine}:{self.precision}" + (":kv8" if self.kv_bits == 8 else "")


DEFAULT_GPU = "h100"
#: FP16 vLLM-class, FP16 TensorRT-LLM-class, FP8 and W4A16 (the precision PRIMAL's 4-bit base weights compare with).
DEFAULT_MEMBERS = (Member("vllm", "fp16"), Member("trtllm", "fp16"), Member("trtllm", "fp8"), Member("vllm", "w4a16"))



@dataclass(frozen=True)
class Selection:
    """The GPU a report's family is priced on, and its members."""

    gpu: str = DEFAULT_GPU
    members: tuple[Member, ...] = DEFAULT_MEMBERS


DEFAULT = Selection()


def parse_members(text: str) -> tuple[Member, ...]:
    """``"vllm:fp16,trtllm:fp8:kv8"`` -> members; a malformed entry raises :class:`InputError`."""
    from primal_compiler.baselines.engine import PRECISION
    from primal_compiler.baselines.profile import engine_names

    out = []
    for item in (t.strip() for t in text.split(",")):
        parts = item.split(":")
        if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("kv8", "kv16")):
            raise InputError("--baselines", f"{item!r}: expected ENGINE:PRECISION[:kv8], e.g. vllm:fp16,trtllm:fp8:kv8")
        if parts[0] not in engine_names():
            raise InputError("--baselines", f"{item!r}: unknown engine {parts[0]!r}; known: {', '.join(engine_names())}")
        if parts[1] not in PRECISION:
            raise InputError("--baselines", f"{item!r}: unknown precision {parts[1]!r}; known: {', '.join(PRECISION)}")
        out.append(Member(parts[0], parts[1], 8 if parts[2:] == ["kv8"] else 16))
    return tuple(out)


def selection(gpu: str, members: str) -> Selection:
    """The selection of ``--baseline-gpu GPU --baselines MEMBERS``; the GPU target must load and be a GPU."""
    from primal_compiler.target import load_gpu_target

    load_gpu_target(gpu, "--baseline-gpu")
    return Selection(gpu, parse_members(members))


def family_for(model, batch: int, context: int, prompt: int | None, chosen: Selection = DEFAULT) -> dict:
    """``{gpu, members: [...]}`` priced for ``model``; a member that cannot run says why instead of its costs.

    Each member entry holds ``label``, ``engine``, ``precision``, ``kv_bits`` and
    either the :class:`~primal_compiler.baselines.engine.Serving` metrics of a
    static batch whose last decode step attends over ``context`` positions
    (prompt ``prompt``, default ``context - 1``) or ``error``.
    """
    from primal_compiler.baselines.engine import serve
    from primal_compiler.baselines.profile import load_engine
    from primal_compiler.target import load_gpu_target

    gpu_name, members = chosen.gpu, chosen.members
    gpu = load_gpu_target(gpu_name, "--baseline-gpu")
    prompt = max(1, min(prompt or context - 1, context - 1))
    out = []
    for m in members:
        entry = {"label": m.label, "engine": m.engine, "precision": m.precision, "kv_bits": m.kv_bits}
        try:
            s = serve(model, gpu, load_engine(m.engine), precision=m.precision, kv_bits=m.kv_bits, batch=batch,
                      prompt=prompt, generate=context - prompt + 1, lora_mode="unmerged")
        except InputError as exc:
            entry["error"] = str(exc)
        else:
            entry.update({k: v for k, v in s.to_dict().items() if k not in ("details", "gpu", "engine", "precision", "kv_bits")})
        out.append(entry)
    return {"gpu": gpu_name, "members": out}


def family_for_program(meta: dict, m: dict, chosen: Selection = DEFAULT) -> dict | None:
    """:func:`family_for` the model, batch, context and prompt of a replayed program (None without a model description)."""
    from primal_compiler.ir.model_json import model_from_dict

    if "model_ir" not in meta:
        return None
    return family_for(model_from_dict(meta["model_ir"]), m["batch"], m["context"], m.get("prompt_tokens"), chosen)


def render_family(family: dict | None, m: dict, seed: dict | None) -> list[str]:
    """Lines of the table PRIMAL vs the seed's H100 point and each family member: times, rates and the two ratios."""
    from primal_compiler.report.text import human_time, table

    if not family:
        return []
    rows: list[tuple] = []
    if seed and "error" not in seed:
        rows.append(("H100 FP16 roofline (seed's point)", seed))
    rows += [(f"{family['gpu']} {e['label']}", e) for e in family["members"]]
    cells = [(name, human_time(g["ttft_s"]), human_time(g["itl_s"]), f"{g['tokens_per_s']:.1f}",
              f"{g['tokens_per_j']:.3f}", f"{g['power_w']:.0f} W", f"{m['tokens_per_s'] / g['tokens_per_s']:.2f}x",
              f"{m['tokens_per_j'] / g['tokens_per_j']:.1f}x") for name, g in rows if "error" not in g]
    lines = [f"GPU baselines: same model, adapters, batch {m['batch']}, context {m['context']} "
             f"(docs/baselines.md; ratios above 1 favour PRIMAL)"]
    lines += table(cells, ("GPU baseline", "TTFT", "ITL", "tokens/s", "tokens/J", "power", "PRIMAL/GPU tok/s", "tok/J"))
    lines += [f"{name}: {g['error']}" for name, g in rows if "error" in g]  # a member that cannot run, after the table
    return lines
