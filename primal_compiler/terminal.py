"""How the ``primal`` command meets its terminal: argparse refusals as one line, standard streams that were
closed before it started, and a progress bar over a verb's named steps.

Guarantees: a flag is matched only by its whole name; every argparse refusal (an unknown flag, a bad value, a
missing argument) is one :class:`~primal_compiler.errors.InputError` line, exit 2, never the usage block; a
closed stdin, stdout or stderr reads as ``/dev/null``, so no later file takes its descriptor.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, NoReturn

from primal_compiler.errors import InputError


class Parser(argparse.ArgumentParser):
    """argparse as every verb uses it: flags only by their whole names (``--forc`` is an error, not ``--force``)
    and a refused argument as one :class:`InputError` line (``primal: run: argument --batch: ...``, exit 2)
    instead of the usage block."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        verb = self.prog.partition(" ")[2] or "command line"
        raise InputError(verb, f"{message} ({self.prog} --help lists the options)")


def reopen_closed_streams() -> None:
    """A standard stream closed before we started (``primal passes >&-``) becomes ``/dev/null``: it reads as
    empty and discards what is written. Python leaves such a stream ``None`` (an error line printed to a
    ``None`` stderr lands on stdout), and the free descriptor would be the next file opened, an output file
    included, where a native library's writes to fd 1 or 2 would then land."""
    for fd, name, flags, mode in ((0, "stdin", os.O_RDONLY, "r"), (1, "stdout", os.O_WRONLY, "w"),
                                  (2, "stderr", os.O_WRONLY, "w")):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, flags)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            setattr(sys, name, open(fd, mode, encoding="utf-8", closefd=False))


@contextmanager
def steps(total: int, desc: str, stream: IO[str] | None = None) -> Iterator[Callable[[str], None]]:
    """A progress bar over ``total`` named steps on ``stream`` (stderr), drawn only when it is a terminal;
    ``step(name)`` ends the step before and starts ``name``. Elsewhere (a pipe, a file, CI) it draws nothing, so
    output meant for a file stays clean."""
    out = sys.stderr if stream is None else stream
    if not out.isatty():
        yield lambda name: None
        return
    from tqdm import tqdm

    bar = tqdm(total=total, desc=desc, unit="step", leave=False, file=out, dynamic_ncols=True)
    started = False

    def step(name: str) -> None:
        nonlocal started
        if started:
            bar.update(1)
        started = True
        bar.set_postfix_str(name)

    try:
        yield step
    finally:
        bar.close()
