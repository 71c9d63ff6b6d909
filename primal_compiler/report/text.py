"""Numbers and tables as the text reports print them (one place, so every report reads the same).

:func:`table` lays out every text table with tabulate (``simple`` format:
a header, a rule of dashes under each column, cells already formatted as
text, the first column left-aligned and the others right-aligned unless
told; a list of labels and values in ``plain`` format, without a header).
"""

from __future__ import annotations

from collections.abc import Sequence

from tabulate import tabulate


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


def table(rows: Sequence[Sequence[object]], headers: Sequence[str] | None, align: Sequence[str] | None = None,
          indent: str = "") -> list[str]:
    """The lines of a text table of ``rows`` under ``headers`` (None: a plain two-column list of labels and
    values, no header) with cells printed as given (numbers are formatted by the caller); ``align``: per
    column "left" or "right" (default: the first left, the rest right); ``indent`` before every line."""
    columns = len(rows[0]) if headers is None and rows else len(headers or ())
    if align is None:
        align = ("left",) + ("right",) * (columns - 1)
    text = tabulate([[str(c) for c in row] for row in rows], headers=() if headers is None else list(headers),
                    tablefmt="plain" if headers is None else "simple", colalign=tuple(align), disable_numparse=True)
    return [(indent + line).rstrip() for line in text.splitlines()]
