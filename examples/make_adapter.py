"""Write ``examples/qwen2-tiny-lora/``: a PEFT LoRA adapter directory for ``examples/qwen2-tiny.onnx``.

``qwen2-tiny.onnx`` is a real export: a tiny random-weight Hugging Face Qwen2 (2 layers, hidden 32, 4 heads,
2 kv heads, vocabulary 96) through ``torch.onnx.export(dynamo=True)`` (torch 2.13.0, transformers 4.57.6), the
same file as ``tests/fixtures/onnx/families/qwen2.onnx`` (made by ``tests/fixtures/make_families.py``). The
adapter is what PEFT saves for ``LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])``:
``adapter_config.json`` and ``adapter_model.safetensors`` with ``lora_A.weight`` (r x in) and
``lora_B.weight`` (out x r) per module, drawn from a fixed seed so the files are the same on every run. Run
from the repository root::

    python examples/make_adapter.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

HERE = Path(__file__).resolve().parent
SHAPES = {"q_proj": (32, 32), "v_proj": (32, 16)}  # (in, out) of each adapted projection
RANK, ALPHA, LAYERS, SEED = 4, 8.0, 2, 2026


def write(directory: Path) -> None:
    """The adapter directory, deterministic from :data:`SEED`."""
    rng = np.random.default_rng(SEED)
    tensors = {}
    for layer in range(LAYERS):
        for module, (fan_in, fan_out) in SHAPES.items():
            key = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{key}.lora_A.weight"] = rng.normal(0.0, 0.3, (RANK, fan_in)).astype(np.float32)
            tensors[f"{key}.lora_B.weight"] = rng.normal(0.0, 0.3, (fan_out, RANK)).astype(np.float32)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "adapter_model.safetensors"), metadata={"format": "pt"})
    config = {"peft_type": "LORA", "r": RANK, "lora_alpha": ALPHA, "target_modules": sorted(SHAPES),
              "bias": "none", "use_dora": False}
    (directory / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    write(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "qwen2-tiny-lora")
