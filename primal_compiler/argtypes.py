"""argparse ``type=`` callables that validate a command-line flag where it is parsed.

A flag that sets a pass option (``--batch`` is ``kv-ring``'s ``batch``) takes that option's declared
range (:func:`option_arg`), so the command line and pipelines accept the same values; any other
bounded flag states its own range (:func:`int_arg`, :func:`float_arg`). A bad value raises
``argparse.ArgumentTypeError``: argparse prints the usage and one error line naming the flag and
exits with code 2. Pass classes are imported only when such a flag is given, so building the parser
stays cheap.
"""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING, Callable, TypeVar

from primal_compiler.errors import InputError

if TYPE_CHECKING:
    from primal_compiler.executor.cache import ReplayCache

T = TypeVar("T", int, float)


def int_arg(lo: int, hi: int) -> Callable[[str], int]:
    """An integer flag in ``lo..hi``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {_shown(text)}") from None
        return _in_range(value, lo, hi, text)

    return parse


def float_arg(lo: float, hi: float) -> Callable[[str], float]:
    """A finite number flag in ``lo..hi``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {_shown(text)}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {_shown(text)}")
        return _in_range(value, lo, hi, text)

    return parse


#: The transports a Dask scheduler address may name (``distributed.comm``); no scheme means tcp.
SCHEDULER_SCHEMES = ("tcp", "tls", "ws", "wss", "ucx")


def scheduler_address(text: str) -> tuple[str, str, int]:
    """(scheme, host, port) of a Dask scheduler address ``[SCHEME://]HOST:PORT``; ValueError when it is none."""
    from urllib.parse import urlsplit

    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "tcp", text
    parts = urlsplit(f"//{rest}")
    port = parts.port  # ValueError when not a number in 0..65535
    if scheme not in SCHEDULER_SCHEMES or not parts.hostname or not port or parts.path:
        raise ValueError(text)
    return scheme, parts.hostname, port


def scheduler_arg(text: str) -> str:
    """A Dask scheduler address ``[SCHEME://]HOST:PORT`` (port 1..65535), checked before anything connects."""
    try:
        scheduler_address(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a Dask scheduler address SCHEME://HOST:PORT (scheme one of "
                                         f"{', '.join(SCHEDULER_SCHEMES)}), got {_shown(text)}") from None
    return text


def unused(flag: str, needs: str) -> InputError:
    """The error for ``flag`` given where it changes nothing because ``needs`` (what gives it meaning) is not:
    an option a verb would silently ignore is refused before any work."""
    return InputError(flag, f"has no effect without {needs}; give {needs} or leave {flag} out")


def path_arg(text: str) -> str:
    """A file or directory argument: anything but empty (``Path("")`` would silently mean ``.``)."""
    if not text:
        raise argparse.ArgumentTypeError("empty path")
    return text


def pipeline_arg(text: str) -> str:
    """A ``-p`` pipeline: anything but blank (an empty pipeline compiles nothing); resolved later."""
    if not text.strip():
        raise argparse.ArgumentTypeError("empty pipeline; give passes such as lower-tiles,blocking,zcurve-order "
                                         "or a bundled name (default, fast, thorough)")
    return text


def option_arg(pass_name: str, opt: str) -> Callable[[str], int | float]:
    """A flag that sets int or float option ``opt`` of pass ``pass_name``: that option's declared range."""

    def parse(text: str) -> int | float:
        import primal_compiler.transforms  # noqa: F401  (registers every pass)
        from primal_compiler.passmgr import REGISTRY, option_fields

        f, kind = next((f, kind) for f, kind in option_fields(REGISTRY[pass_name]) if f.name == opt)
        lo, hi = f.metadata["range"]
        return (int_arg if kind is int else float_arg)(lo, hi)(text)

    return parse


def layout_rules_arg(text: str) -> tuple[str, ...]:
    """``--enforce``: seed layout rules ``ga-placement`` keeps, colon-separated, or ``none``."""
    from primal_compiler.transforms.ga_placement import ENFORCEABLE

    rules = () if text == "none" else tuple(text.split(":"))
    bad = [r for r in rules if r not in ENFORCEABLE]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown rule {_shown(bad[0])}; enforceable: {', '.join(ENFORCEABLE)} "
                                         "(colon-separated) or none")
    return rules


def _in_range(value: T, lo: float, hi: float, text: str) -> T:
    if not lo <= value <= hi:
        raise argparse.ArgumentTypeError(f"must be >= {lo} and <= {hi}, got {_shown(text)}")
    return value


def _shown(text: str, limit: int = 40) -> str:
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def token_ids(text: str) -> list[int]:
    """``--prompt 1,2,3`` as token ids; InputError naming ``--prompt`` otherwise."""
    try:
        ids = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError("--prompt", f"expected comma-separated token ids, got {text!r}") from None
    if not ids or min(ids) < 0:
        raise InputError("--prompt", f"expected one or more non-negative token ids, got {text!r}")
    return ids


def add_cache_flag(parser) -> None:
    """``--no-cache`` on a verb that replays (read by :func:`replay_cache`)."""
    parser.add_argument("--no-cache", action="store_true",
                        help="neither read nor keep the replay's schedule in the replay cache "
                             "($XDG_CACHE_HOME or ~/.cache, primal-compiler/replays; docs/executor.md, Replay cache)")


def replay_cache(args) -> ReplayCache | None:
    """The replay cache a verb's ``--no-cache`` asks for: the default one, or None."""
    from primal_compiler.executor.cache import ReplayCache

    return None if args.no_cache else ReplayCache()
