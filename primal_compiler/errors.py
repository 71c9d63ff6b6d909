"""The one error type user-facing commands turn into a one-line message and exit code 2."""

from __future__ import annotations


class InputError(Exception):
    """Bad input: ``where`` names the file, model, option or pass; ``problem`` says what is wrong."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}")
        self.where = where
        self.problem = problem


def one_line(exc: BaseException | str, limit: int = 300) -> str:
    """``exc``'s message with its whitespace (newlines included) collapsed, cut at ``limit`` characters."""
    text = " ".join(str(exc).split()) or (type(exc).__name__ if isinstance(exc, BaseException) else "")
    return text if len(text) <= limit else text[: limit - 3] + "..."
