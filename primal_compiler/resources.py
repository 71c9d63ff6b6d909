"""Where the bundled data (``targets/``, ``passes/``) lives, installed or in a checkout.

A wheel carries them under ``primal_compiler/_bundled/``; an editable install
or a source checkout reads them from the repository root.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def data_dir(kind: str) -> Path:
    """Directory of bundled ``kind`` files (``targets`` or ``passes``); raises if absent."""
    for candidate in (_PACKAGE / "_bundled" / kind, _PACKAGE.parent / kind):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"bundled {kind}/ directory not found next to {_PACKAGE}")


def bundled(kind: str) -> dict[str, Path]:
    """Bundled ``kind`` files by name (file stem), sorted by name."""
    return {p.stem: p for p in sorted(data_dir(kind).glob("*.toml"), key=lambda p: p.stem)}
