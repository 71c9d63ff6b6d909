"""Running one ``primal`` invocation in-process and checking what the package docstring guarantees.

- :func:`invoke`: ``main(argv)`` in a scratch directory, stdout and stderr captured, under a wall-clock
  budget: past it the process gets SIGTERM, which the CLI turns into ``primal: terminated`` (exit 143,
  an allowed outcome that must still leave no temporaries). Where a quick answer is owed, the caller
  treats running into the budget as a failure.
- :func:`check_streams`: the exit code, and stderr's lines (one ``primal: `` line on failure; an argparse
  refusal in its one documented form).
- :func:`snapshot` and :func:`check_tree`: every entry's name, ``lstat`` type, size, SHA-256 of regular
  files, device numbers and symlink targets, compared before and after.
- :func:`violation`: each broken guarantee raises its own ``AssertionError`` subclass, so Hypothesis
  reports distinct kinds of failure as distinct bugs.

No test functions live here.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import signal
import stat
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from hypothesis import HealthCheck

from primal_compiler.cli import main

ALLOWED = frozenset({0, 2, 130, 143})
#: stderr lines a verb prints while it works, which are not errors.
PROGRESS: dict[str, tuple[str, ...]] = {
    "run": ("compiled ", "wrote "),
    "serve": ("serve: ",),
    "reproduce": ("placing ", "  ", "solving"),
    "thermal": ("thermal policy: ",),
    "sweep": ("sweep:", "primal: warning: "),
}
#: An argparse refusal: ``primal: VERB: PROBLEM (primal VERB --help lists the options)``, or the top-level
#: parser's ``primal: command line: PROBLEM (primal --help lists the options)``.
ARGPARSE_LINE = re.compile(r"primal: (?P<where>command line|[a-z]+): (?P<problem>.+) "
                           r"\(primal(?: (?P<verb>[a-z]+))? --help lists the options\)")
#: The CLI cuts an error line at this many characters after ``primal: `` (``one_line(exc, 2000)``), ending
#: it with ``...``: an echoed 5000-character value loses the line's tail, and nothing else may.
LINE_LIMIT = 2000
BUDGET_S = 3.0  # wall-clock seconds an invocation may take before the test sends SIGTERM
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "onnx"
ONNX_MODEL = FIXTURES / "llama_dynamo.onnx"

FUZZ = dict(deadline=None, derandomize=True, database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                   HealthCheck.function_scoped_fixture, HealthCheck.data_too_large])


# --------------------------------------------------------------------------- running one invocation


@dataclass
class Result:
    argv: list[str]
    code: int | str
    out: str
    err: str
    seconds: float
    over_budget: bool
    scratch: Path | None = None
    note: str = ""  # the fuzzed input behind the argv (a trace, an adapter config), for the report

    def shown(self) -> str:
        text = " ".join(_quote(a) for a in self.argv)
        err = self.err if len(self.err) < 3000 else self.err[:1500] + " [...] " + self.err[-1500:]
        if self.scratch is not None:
            text, err = (s.replace(str(self.scratch), "$S") for s in (text, err))
        note = f"\ninput: {_short(self.note)!r}" if self.note else ""
        return _runs(f"argv: {text}\nexit: {self.code}  ({self.seconds:.2f} s)\nstderr: {err!r}{note}")


def _runs(text: str) -> str:
    """``text`` with each run of 20 or more repeats of one or two characters written once and counted."""
    return re.sub(r"(.{1,2}?)\1{19,}", lambda m: f"{m[1]}<x{len(m[0]) // len(m[1])}>", text, flags=re.S)


def _short(text: str) -> str:
    return text if len(text) < 400 else f"{text[:250]}...<{len(text)} chars>...{text[-100:]}"


def _quote(arg: str) -> str:
    arg = arg if len(arg) < 200 else f"{arg[:60]}...<{len(arg)} chars>...{arg[-20:]}"
    return arg if re.fullmatch(r"[\w@%+=:,./-]+", arg) else repr(arg)


def invoke(argv: list[str], cwd: Path, budget_s: float = BUDGET_S) -> Result:
    """``main(argv)`` in ``cwd`` with stdout and stderr captured (warnings shown on stderr as the console
    script would show them) and SIGTERM sent after ``budget_s`` seconds."""
    out, err = io.StringIO(), io.StringIO()
    fired: list[bool] = []

    def alarm(signum, frame) -> None:
        fired.append(True)
        os.kill(os.getpid(), signal.SIGTERM)

    old_alarm = signal.signal(signal.SIGALRM, alarm)
    old_term = signal.signal(signal.SIGTERM, lambda signum, frame: None)  # a late one must not end pytest
    old_cwd = os.getcwd()
    start = time.perf_counter()
    try:
        os.chdir(cwd)
        with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(out), \
                contextlib.redirect_stderr(err):
            warnings.simplefilter("default")
            for quiet in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
                warnings.filterwarnings("ignore", category=quiet)
            signal.setitimer(signal.ITIMER_REAL, budget_s)
            try:
                code: int | str = main(list(argv))
            except SystemExit as exc:  # --help, or a verb's own exit
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except BaseException as exc:  # noqa: BLE001  (anything escaping main is a finding)
                code = f"raised {type(exc).__name__}: {exc}"
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        signal.signal(signal.SIGALRM, old_alarm)
        signal.signal(signal.SIGTERM, old_term)
        os.chdir(old_cwd)
    text = err.getvalue() + "".join(warnings.formatwarning(w.message, w.category, w.filename, w.lineno)
                                    for w in caught)
    return Result(list(argv), code, out.getvalue(), text, time.perf_counter() - start, bool(fired), cwd)


# --------------------------------------------------------------------------- the checks

_KINDS_OF_VIOLATION: dict[str, type] = {}


def violation(category: str, message: str, r: Result) -> None:
    """Raise one broken guarantee, as an ``AssertionError`` subclass of its own per category."""
    kind = _KINDS_OF_VIOLATION.setdefault(category, type(f"Violation_{category}", (AssertionError,), {}))
    raise kind(f"{category}: {message}\n{r.shown()}")


def error_lines(verb: str, r: Result) -> list[str]:
    """stderr's lines less the progress lines ``verb`` prints while it works."""
    return [line for line in r.err.splitlines()
            if not (line.startswith(PROGRESS.get(verb, ())) or (verb == "sweep" and not line.strip()))]


def argparse_form(line: str) -> bool:
    """Whether ``line`` is an argparse refusal in its documented form (its own verb named twice, or the
    command line and the top-level parser), allowing only the CLI's cut of an overlong line."""
    m = ARGPARSE_LINE.fullmatch(line)
    if m is not None:
        return (m["where"] == "command line") == (m["verb"] is None) and m["where"] in ("command line", m["verb"])
    cut = len(line) >= len("primal: ") + LINE_LIMIT - 3 and line.endswith("...")
    return cut and re.match(r"primal: (command line|[a-z]+): ", line) is not None


def check_streams(verb: str, r: Result, argparse_refusal: bool = False) -> None:
    """The exit code is an allowed one; stderr is at most one line on success and exactly one ``primal: ``
    line on failure; a line that names ``--help`` is in argparse's form; ``argparse_refusal``: the command
    line is one argparse must refuse, so the exit is 2 and the line is argparse's."""
    if r.code not in ALLOWED:
        violation("exit-code", f"exit code {r.code!r} is not one of {sorted(ALLOWED)}", r)
    if "Traceback" in r.err:
        violation("traceback", "a traceback on stderr", r)
    lines = error_lines(verb, r)
    if any(line.startswith("usage: ") for line in lines):
        violation("usage-block", "argparse's usage block on stderr", r)
    if r.code == 0:
        if len(lines) > 1:
            violation("stderr-on-success", f"{len(lines)} stderr lines on success", r)
    elif len(lines) != 1 or not lines[0].startswith("primal: "):
        violation("error-lines", "the error is not exactly one line starting 'primal: '", r)
    elif "--help lists the options" in lines[0] and not argparse_form(lines[0]):
        violation("argparse-form", "an argparse refusal not in the form 'primal: VERB: ... (primal VERB --help "
                                   "lists the options)'", r)
    if argparse_refusal and (r.code != 2 or not argparse_form(lines[0] if lines else "")):
        violation("not-an-argparse-refusal", "argparse must refuse this command line: exit 2, one line ending "
                                             "'(primal VERB --help lists the options)'", r)


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under ``root`` (symlinks not followed): lstat type, size, content hash, rdev, link target."""
    entries: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st_ = os.lstat(path)
            kind = stat.S_IFMT(st_.st_mode)
            digest = link = None
            if stat.S_ISREG(st_.st_mode):
                with open(path, "rb") as f:
                    digest = hashlib.file_digest(f, "sha256").hexdigest()
            elif stat.S_ISLNK(st_.st_mode):
                link = os.readlink(path)
            rdev = st_.st_rdev if stat.S_ISCHR(st_.st_mode) or stat.S_ISBLK(st_.st_mode) else None
            size = st_.st_size if not stat.S_ISDIR(st_.st_mode) else None
            entries[os.path.relpath(path, root)] = (kind, size, digest, rdev, link)
    return entries


def _under(entry: str, output: str) -> bool:
    return entry == output or entry.startswith(output + "/")


def check_tree(r: Result, before: dict, after: dict, outputs: tuple[str, ...]) -> None:
    """Nothing changed but ``outputs`` (paths relative to the scratch root) and, on success, the new
    parents they needed; a failure changed nothing at all; no temporary sibling is left."""
    left = sorted(e for e in after if ".primal-tmp." in e.rsplit("/", 1)[-1] or ".primal-old." in e.rsplit("/", 1)[-1])
    if left:
        violation("temporaries-left", f"temporaries left behind: {left[:5]}", r)
    changed = sorted(e for e in before.keys() | after.keys() if before.get(e) != after.get(e) and e not in left)
    if r.code != 0:
        if changed:
            violation("changed-on-failure", f"a failed invocation changed {changed[:6]}", r)
        return
    new_parents = {p for o in outputs for p in map(str, Path(o).parents) if p != "." and p not in before}
    outside = [e for e in changed if not any(_under(e, o) for o in outputs) and e not in new_parents]
    if outside:
        violation("changed-outside-output", f"changed outside the output {list(outputs)}: {outside[:6]}", r)


def rel(root: Path, value: str) -> str | None:
    """``value`` (a path as given on the command line, relative to ``root``) relative to ``root``, lexically."""
    full = os.path.normpath(os.path.join(root, value)) if value else None
    if full is None or not (full + "/").startswith(str(root) + "/") or full == str(root):
        return None
    return os.path.relpath(full, root)


# --------------------------------------------------------------------------- the scratch tree and its inputs


@contextlib.contextmanager
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="vf") as d:
        yield Path(d).resolve()


TRACE_ROWS = [{"arrival_s": 0.0, "adapter": "ad", "prompt_tokens": 4, "generate_tokens": 2},
              {"arrival_s": 0.05, "adapter": "b", "prompt_tokens": 3, "generate_tokens": 2},
              {"arrival_s": 0.1, "adapter": "ad", "prompt_tokens": 4, "generate_tokens": 3}]
#: ``-p fast`` with a 64-token context and one decode step: a program of under a thousand records, so that
#: disasm, asm, viz and the replays of every example stay cheap.
SMALL = "lower-tiles,blocking{context=64},zcurve-order,kv-ring{context=64},codegen{steps=1,generate=1},srpg"
SWEEP_SPEC = """\
[sweep]
model = "tiny-llama"
lora = "q,v:8"
context = 64
pipeline = "lower-tiles,blocking,zcurve-order,kv-ring,codegen"
metrics = ["tokens_per_s"]

[axes]
batch = [1]
"""


def build_assets(a: Path) -> Path:
    """Write into ``a`` the inputs every test copies into its scratch tree: a compile output of ours
    (``out``), its text (``prog.txt``), PEFT adapters for tiny-llama (``ad``) and the ONNX fixture (``lad``),
    that ONNX model (``m.onnx``), a trace (``t.jsonl``), a pipeline file (``fast.toml``) and a one-point
    sweep (``s.toml``)."""
    from primal_compiler.frontend import load_model
    from primal_compiler.resources import bundled
    from tests.frontend.test_weights import write_adapter

    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["compile", "tiny-llama", "-p", SMALL, "-o", str(a / "out")]) == 0
        assert main(["disasm", str(a / "out"), "-o", str(a / "prog.txt")]) == 0
    write_adapter(a / "ad", load_model("tiny-llama", "q,v:8"))
    write_adapter(a / "lad", load_model(str(ONNX_MODEL)))
    shutil.copy(ONNX_MODEL, a / "m.onnx")
    (a / "t.jsonl").write_text("".join(json.dumps(row) + "\n" for row in TRACE_ROWS))
    shutil.copy(bundled("passes")["fast"], a / "fast.toml")
    (a / "s.toml").write_text(SWEEP_SPEC)
    return a


def copy_inputs(assets: Path, root: Path, names: tuple[str, ...], renames: dict[str, str] | None = None) -> None:
    (root / "in").mkdir()
    for name in names:
        dest = root / "in" / (renames or {}).get(name, name)
        (shutil.copytree if (assets / name).is_dir() else shutil.copy)(assets / name, dest)
