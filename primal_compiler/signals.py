"""How a command meets SIGINT and SIGTERM: as exceptions in the main thread, so every ``finally`` and
temporary-directory cleanup runs, and recorded, so an error the signal caused elsewhere (an extension
module whose import it cut short raises ``ImportError: initialization failed``) is still reported as the
interruption (:func:`primal_compiler.cli.main`)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Terminated(BaseException):
    """SIGTERM, raised in the main thread."""


_RECEIVED: list[int] = []


def received() -> int | None:
    """The first signal (SIGINT or SIGTERM) of the command running under :func:`handled`, if one came."""
    return _RECEIVED[0] if _RECEIVED else None


def raise_if_received() -> None:
    """Raise the exception of a signal that came under :func:`handled` but whose exception something swallowed
    (a library catching broadly, an extension's import turning it into an error it then ignores): called before
    an output is committed and when a command returns, so an interrupted command never ends as a success."""
    if _RECEIVED:
        if _RECEIVED[0] == signal.SIGINT:
            raise KeyboardInterrupt
        raise Terminated()


def on_sigterm(signum: int, frame: object) -> None:
    _RECEIVED.append(signal.SIGTERM)
    raise Terminated()


def on_sigint(signum: int, frame: object) -> None:
    _RECEIVED.append(signal.SIGINT)
    raise KeyboardInterrupt


@contextmanager
def handled() -> Iterator[None]:
    """Within: SIGTERM raises :class:`Terminated`, SIGINT ``KeyboardInterrupt``, both recorded; the previous
    handlers come back after (in the main thread only; elsewhere nothing changes)."""
    _RECEIVED.clear()
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, on_sigterm), signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])
