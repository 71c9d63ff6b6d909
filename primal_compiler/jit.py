"""numba compilation with an on-disk cache where one can be written, and without one where none can.

``numba.njit(cache=True)`` raises ``RuntimeError: cannot cache function``
when it is applied (at import) if numba finds no writable place for the
cache: ``NUMBA_CACHE_DIR`` unset or unwritable, the package's own
``__pycache__`` unwritable (a system-wide install used by another user) and
the user cache directory (``$XDG_CACHE_HOME/numba``, by default
``~/.cache/numba``) unwritable too (no home directory, a read-only home).

Guarantee: :func:`njit` never raises that error. It compiles with the cache
where numba can write one, in numba's order (``NUMBA_CACHE_DIR``, the
package's ``__pycache__``, the user cache directory), and otherwise compiles
the same function without a cache — the same results, only each process
compiles it again on first call. Every other numba error is raised as is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numba


def njit(**options: Any) -> Callable[[Callable[..., Any]], Any]:
    """``numba.njit(cache=True, **options)`` as a decorator, uncached where no cache can be written."""

    def decorate(fn: Callable[..., Any]) -> Any:
        try:
            return numba.njit(cache=True, **options)(fn)
        except RuntimeError as exc:
            if "cannot cache function" not in str(exc):
                raise
            return numba.njit(cache=False, **options)(fn)

    return decorate
