"""Numbers as the text reports print them (one place, so every report reads the same)."""

from __future__ import annotations


def human_time(seconds: float) -> str:
    """Seconds as s, ms or us with a sensible number of digits."""
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.2f} us"


def human_bytes(n: float) -> str:
    """Bytes in MiB, KiB or B, one decimal."""
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"
