"""Serving: a request trace over several adapters, replayed on compiled shapes (:mod:`.costs`) and simulated
request by request (:mod:`.sim`); ``primal serve`` and ``primal trace`` (:mod:`.command`, docs/serving.md)."""

SEED_ZERO_FRACTION = 0.245  # seed: ~35% of LoRA delta matrices are >70% sparse -> 0.35 x 0.7 of blocks all zero

#: ``primal serve --batching``: which waiting requests share a batch (serve/sim.py).
BATCHING = ("mixed", "same-adapter", "resident")
