"""How the ``primal`` command meets its terminal: argparse refusals as one line, and standard streams that were
closed before it started.

Guarantees: a flag is matched only by its whole name; every argparse refusal (an unknown flag, a bad value, a
missing argument) is one :class:`~primal_compiler.errors.InputError` line, exit 2, never the usage block; a
closed stdin, stdout or stderr reads as ``/dev/null``, so no later file takes its descriptor.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn

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
