"""How far one run's next-token distributions are from a reference run's, step by step.

Both take logits ``[steps, vocab]`` of the same inputs (a teacher-forced
replay against the reference's own continuation).
"""

from __future__ import annotations

import numpy as np


def top1_agreement(logits: np.ndarray, reference: np.ndarray) -> float:
    """Fraction of steps whose most likely token is the reference's."""
    return float(np.mean(np.argmax(logits, axis=-1) == np.argmax(reference, axis=-1)))


def mean_kl(logits: np.ndarray, reference: np.ndarray) -> float:
    """Mean over steps of KL(reference || run) of the softmax distributions, in nats."""
    def log_softmax(x: np.ndarray) -> np.ndarray:
        x = x.astype(np.float64)
        z = x - x.max(axis=-1, keepdims=True)
        return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))

    p, q = log_softmax(reference), log_softmax(logits)
    return float(np.mean(np.maximum(np.sum(np.exp(p) * (p - q), axis=-1), 0.0)))  # >= 0 but for rounding


def logit_error(logits: np.ndarray, reference: np.ndarray) -> float:
    """RMS of the logit differences over the RMS spread of the reference logits around each step's mean."""
    spread = reference - reference.mean(axis=-1, keepdims=True)
    return float(np.sqrt(np.mean((logits - reference) ** 2) / np.mean(spread**2)))
