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

numba's cache notices a change to the file of the function it compiled, not
to the files of the compiled functions it calls: ``depends`` lists those
modules, and the cache index then records their files' stamps too, so a
change to any of them compiles the function again. Where numba's cache
object does not have the shape this relies on (another numba version), the
function is compiled without a cache rather than risk a stale one.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numba


def _stamp(module: ModuleType) -> tuple[float, int]:
    if module.__file__ is None:  # a namespace package or built-in module: nothing for the cache to stamp
        raise TypeError(f"njit(depends=...): module {module.__name__} has no file")
    st = os.stat(module.__file__)
    return st.st_mtime, st.st_size


def njit(depends: tuple[ModuleType, ...] = (), **options: Any) -> Callable[[Callable[..., Any]], Any]:
    """``numba.njit(cache=True, **options)`` as a decorator, uncached where no cache can be written, its
    cache invalidated by a change to the ``depends`` modules as well as its own."""

    def decorate(fn: Callable[..., Any]) -> Any:
        try:
            compiled = numba.njit(cache=True, **options)(fn)
        except RuntimeError as exc:
            if "cannot cache function" not in str(exc):
                raise
            return numba.njit(cache=False, **options)(fn)
        if depends:
            index = getattr(getattr(compiled, "_cache", None), "_cache_file", None)
            if index is None or not hasattr(index, "_source_stamp"):
                return numba.njit(cache=False, **options)(fn)
            index._source_stamp = (index._source_stamp, *(_stamp(m) for m in depends))
        return compiled

    return decorate
