"""Model front ends: ONNX files and built-in architectures, plus ``--lora`` specs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from primal_compiler.errors import InputError
from primal_compiler.frontend.builtin import BUILTIN, load_builtin
from primal_compiler.frontend.lora_spec import attach_lora
from primal_compiler.ir.model import Model


def load_model(spec: str, lora: str | None = None, adapter: str | Sequence[str] | None = None) -> Model:
    """A built-in name or an ONNX path, with the adapters of ``lora`` attached; bad input is an InputError.

    ``adapter`` (a PEFT adapter directory) sets the LoRA from its config instead, replacing the file's;
    a ``lora`` given with it must agree (see :func:`~primal_compiler.frontend.peft.attach_adapter`).
    Several directories (adapter ids 0, 1, ... of a multi-adapter program) share one placement of LoRA
    tiles: every role any of them adapts, at the largest rank any gives it (with the alpha of the first
    that gives that rank). An adapter of a smaller rank, or without a role, is stored padded with zeros,
    which computes its own update exactly; alphas may differ (each CONFIG writes its adapter's scaled B).
    """
    if spec.lower() in BUILTIN:
        model = load_builtin(spec)
    elif spec.endswith(".onnx") or _exists(spec):
        from primal_compiler.frontend.onnx_import import load_onnx

        model = load_onnx(Path(spec))
    else:
        model = load_builtin(spec)  # raises the "unknown built-in" error
    dirs = [adapter] if isinstance(adapter, str) else list(adapter or ())
    if dirs:
        from primal_compiler.frontend.peft import attach_adapter, read_adapter

        adapters = [read_adapter(d, model) for d in dirs]
        return attach_adapter(model, adapters, lora)
    if lora:
        model = attach_lora(model, lora)
    return model


def _exists(spec: str) -> bool:
    """Whether ``spec`` names something on disk (a name too long or otherwise unusable as a path does not)."""
    try:
        return bool(spec) and Path(spec).exists()
    except (OSError, ValueError):
        return False


__all__ = ["InputError", "load_model"]
