"""primal-compiler: map transformer LLMs with LoRA adapters onto the PRIMAL PIM accelerator."""

__version__ = "0.1.0"
