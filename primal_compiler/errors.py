"""The one error type user-facing commands turn into a one-line message and exit code 2."""

from __future__ import annotations


class InputError(Exception):
    """Bad input: ``where`` names the file, model, option or pass; ``problem`` says what is wrong."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}")
        self.where = where
        self.problem = problem
