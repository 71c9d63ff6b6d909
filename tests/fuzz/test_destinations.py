"""Every writing verb pointed at every kind of destination.

What is guaranteed: a device, a FIFO, a socket, a symbolic link (to anything), a path under a file and
the verb's own inputs (a file it reads, the same file under a second name, a directory it reads, an
entry of such a directory, a directory holding one) are refused with exit 2 and stay the node they were;
a user's regular file is replaced only by a file verb with ``--force``; a user's non-empty directory
never; an earlier output of ours only by a directory verb with ``--force``; what a success writes is the
kind of thing the verb writes. A name past the file system's limits (a 300-byte component, a path past
``PATH_MAX``) is refused with exit 2 like any destination that cannot be written. Nothing else in the scratch tree changes (:mod:`tests.fuzz.harness`).

How: each writer of :data:`WRITERS` (``compile -o``, ``run MODEL -o``, ``viz -o``, ``disasm -o``,
``asm -o``, ``trace -o``, ``serve --perfetto``, ``run --functional --save-logits``, ``sweep -o``) gets a
fresh scratch tree holding one of each kind of node (:func:`make_user_tree`), and is pointed at a
destination of :data:`KINDS` spelled one of :data:`SPELLINGS` ways, with and without ``--force``. Each
kind is also an explicit example, so every kind is tried whatever Hypothesis draws.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.fuzz.harness import (ALLOWED, BUDGET_S, FUZZ, check_streams, check_tree, copy_inputs, invoke, scratch,
                                snapshot, violation)


@dataclass(frozen=True)
class Writer:
    """A verb that writes: its argv for a destination, what it reads, and what kind of thing it writes."""

    argv: Callable[[Path, str], list[str]]
    inputs: tuple[str, ...]  # asset names copied into $S/in
    directory: bool  # writes a directory (else a file)
    suffix: str = ""  # every destination name ends so (trace -o wants .jsonl)
    input_file: str | None = None  # $S-relative: a file the verb reads, named on its command line
    input_dir: str | None = None  # $S-relative: a directory it reads
    inside: str | None = None  # $S-relative: an existing file inside input_dir
    force: bool = True  # has --force
    renames: dict[str, str] = field(default_factory=dict)
    sweep: bool = False  # a results directory that is appended to, not one of our marked outputs
    budget_s: float = BUDGET_S  # more where a success takes seconds (viz renders, sweep starts a worker, the
    #                             first functional replay imports onnxruntime)


WRITERS: dict[str, Writer] = {
    "compile": Writer(lambda s, d: ["compile", "tiny-llama", "-p", f"{s}/in/fast.toml", "--adapter", f"{s}/in/ad",
                                    "-o", d], ("fast.toml", "ad"), True, "", "in/fast.toml", "in/ad",
                      "in/ad/adapter_config.json"),
    "run": Writer(lambda s, d: ["run", "tiny-llama", "-p", f"{s}/in/fast.toml", "--adapter", f"{s}/in/ad",
                                "--context", "64", "-o", d], ("fast.toml", "ad"), True, "", "in/fast.toml", "in/ad",
                  "in/ad/adapter_config.json"),
    "viz": Writer(lambda s, d: ["viz", f"{s}/in/out", "-o", d, "--format", "svg", "--max-events", "1000"], ("out",),
                  True, "", None, "in/out", "in/out/summary.json", budget_s=10.0),
    "disasm": Writer(lambda s, d: ["disasm", f"{s}/in/out", "-o", d], ("out",), False, ".txt", None, "in/out",
                     "in/out/program.primal"),
    "asm": Writer(lambda s, d: ["asm", f"{s}/in/prog.txt", "-o", d], ("prog.txt",), False, ".primal", "in/prog.txt"),
    "trace": Writer(lambda s, d: ["trace", "-o", d, "--adapters", f"{s}/in/ad.jsonl", "b", "--requests", "3",
                                  "--rate", "1", "--prompt", "1:4", "--generate", "1:4"], ("ad", "t.jsonl"), False,
                    ".jsonl", None, "in/ad.jsonl", "in/ad.jsonl/notes.jsonl",
                    renames={"ad": "ad.jsonl", "t.jsonl": "ad.jsonl/notes.jsonl"}),
    "serve": Writer(lambda s, d: ["serve", "tiny-llama", "--adapters", f"{s}/in/ad", "b", "--trace", f"{s}/in/t.jsonl",
                                  "--context", "64", "-p", "fast", "--perfetto", d], ("ad", "t.jsonl"), False, ".json",
                    "in/t.jsonl", "in/ad", "in/ad/adapter_config.json"),
    "functional": Writer(lambda s, d: ["run", f"{s}/in/m.onnx", "--functional", "--weights", f"{s}/in/m.onnx",
                                       "--prompt", "1,2,3", "--adapter", f"{s}/in/lad", "--save-logits", d],
                         ("m.onnx", "lad"), False, ".npy", "in/m.onnx", "in/lad", "in/lad/adapter_config.json",
                         budget_s=10.0),
    "sweep": Writer(lambda s, d: ["sweep", f"{s}/in/s.toml", "-o", d, "--workers", "1", "--no-progress"],
                    ("s.toml",), True, "", "in/s.toml", force=False, sweep=True, budget_s=10.0),
}

#: Destinations, as paths relative to the scratch root ({s}: the verb's suffix). Each is built fresh.
KINDS = ("new", "new-nested", "file", "dir", "empty", "ours", "fifo", "socket", "chardev", "link-file", "link-dir",
         "link-empty", "link-ours", "link-fifo", "link-socket", "link-chardev", "link-dangling", "link-loop",
         "under-file", "input-file", "hardlink-input", "input-dir", "inside-input", "new-inside-input",
         "input-parent", "long-name", "long-path")
#: ... of which these are refused, --force or not, whatever the verb.
REFUSED = frozenset(KINDS) - {"new", "new-nested", "file", "empty", "ours", "new-inside-input"}
#: How a destination is spelled on the command line (the process runs in the scratch root).
SPELLINGS = ("absolute", "relative", "dot", "trailing-slash", "double-slash", "dotdot")


def make_user_tree(root: Path, assets: Path, sfx: str) -> None:
    """The user's files around the destination: one of each kind of node, and links to each."""
    (root / "keep.txt").write_text("the user's, never touched")
    (root / f"file{sfx}").write_text("mine")
    (root / f"dir{sfx}").mkdir()
    (root / f"dir{sfx}" / "notes.md").write_text("mine too")
    (root / f"empty{sfx}").mkdir()
    shutil.copytree(assets / "out", root / f"ours{sfx}")
    os.mkfifo(root / f"fifo{sfx}")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(root / f"socket{sfx}"))
    with contextlib.suppress(PermissionError):
        os.mknod(root / f"chardev{sfx}", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    for target in ("file", "dir", "empty", "ours", "fifo", "socket", "chardev"):
        (root / f"link-{target}{sfx}").symlink_to(f"{target}{sfx}")
    (root / f"link-dangling{sfx}").symlink_to(f"nowhere{sfx}")
    (root / f"link-loop{sfx}").symlink_to(f"link-loop{sfx}")


def destination(w: Writer, kind: str) -> str | None:
    """The $S-relative destination of ``kind`` for writer ``w`` (None: the verb has no such input)."""
    sfx = w.suffix
    plain = {"new": f"new{sfx}", "new-nested": f"a/b/new{sfx}", "under-file": f"file{sfx}/x{sfx}",
             "hardlink-input": f"hard{sfx}" if w.input_file else None, "input-file": w.input_file,
             "input-dir": w.input_dir, "inside-input": w.inside, "input-parent": "in",
             "new-inside-input": f"{w.input_dir}/new{sfx}" if w.input_dir else None,
             "long-name": f"{'n' * 300}{sfx}", "long-path": f"{'d/' * 2100}new{sfx}"}
    return plain[kind] if kind in plain else f"{kind}{sfx}"


def spell(root: Path, rel: str, spelling: str) -> str:
    return {"absolute": f"{root}/{rel}", "relative": rel, "dot": f"./{rel}", "trailing-slash": f"{root}/{rel}/",
            "double-slash": f"{root}//{rel}", "dotdot": f"{root}/in/../{rel}"}[spelling]


def expected_codes(w: Writer, kind: str, force: bool, spelling: str) -> frozenset[int]:
    """The exit codes the rules allow for this destination (ALLOWED where they say nothing)."""
    if kind in REFUSED:
        return frozenset({2})
    ok = frozenset({0}) if spelling != "trailing-slash" else frozenset({0, 2})
    if kind in ("new", "new-nested"):
        return ok
    if kind == "file":  # a user's regular file: replaced by a file verb, and only with --force
        return ok if (not w.directory and force) else frozenset({2})
    if kind == "empty":
        return ok if w.directory else frozenset({2})
    if kind == "ours":  # an earlier compile output of ours
        return ok if (w.directory and not w.sweep and force) else frozenset({2})
    if kind == "new-inside-input":  # a new name inside an input directory: refused for a file
        return frozenset({0, 2}) if w.directory else frozenset({2})
    return ALLOWED


def destination_case(assets: Path, verb: str, kind: str, force: bool, spelling: str) -> None:
    w = WRITERS[verb]
    rel = destination(w, kind)
    if rel is None:
        return
    with scratch() as root:
        copy_inputs(assets, root, w.inputs, w.renames)
        make_user_tree(root, assets, w.suffix)
        if kind in ("chardev", "link-chardev") and not os.path.lexists(root / f"chardev{w.suffix}"):
            return  # mknod needs CAP_MKNOD: no device to test here
        if w.input_file:
            os.link(root / w.input_file, root / f"hard{w.suffix}")
        argv = w.argv(root, spell(root, rel, spelling)) + (["--force"] if force and w.force else [])
        before = snapshot(root)
        node = os.lstat(root / rel) if os.path.lexists(root / rel) else None
        r = invoke(argv, root, w.budget_s)
        after = snapshot(root)
        check_streams(verb.replace("functional", "run"), r)
        want = expected_codes(w, kind, force, spelling)
        if r.code not in want:
            violation(f"destination-{kind}", f"destination kind {kind!r} (force={force}, {spelling}): exit {r.code}, "
                                             f"expected {sorted(want)}", r)
        if r.over_budget:
            violation("slow", "ran into the time budget", r)
        if kind in REFUSED and node is not None:
            now = os.lstat(root / rel) if os.path.lexists(root / rel) else None
            if now is None or stat.S_IFMT(now.st_mode) != stat.S_IFMT(node.st_mode) or now.st_rdev != node.st_rdev \
                    or now.st_ino != node.st_ino:
                violation(f"replaced-{kind}", f"the {kind} at {rel} is no longer the same node", r)
        check_tree(r, before, after, (rel,))
        if r.code == 0:
            made = os.lstat(root / rel) if os.path.lexists(root / rel) else None
            good = made is not None and (stat.S_ISDIR(made.st_mode) if w.directory else stat.S_ISREG(made.st_mode))
            if not good:
                violation("no-output", f"exit 0 but {rel} is not a {'directory' if w.directory else 'file'}", r)


def _every_kind(kinds: tuple[str, ...]):
    """Explicit examples: each kind once with --force (the strongest request; not for the user's file and
    our earlier output, which --force may replace), spelled plainly."""
    def add(test):
        for kind in reversed(kinds):
            test = example(kind=kind, force=kind not in ("file", "ours"), spelling="absolute")(test)
        return test
    return add


CHEAP_WRITERS = [v for v in WRITERS if v != "viz"]


@pytest.mark.parametrize("verb", CHEAP_WRITERS)
@settings(max_examples=8, **FUZZ)
@given(kind=st.sampled_from(KINDS), force=st.booleans(), spelling=st.sampled_from(SPELLINGS))
@_every_kind(KINDS)
def test_output_destinations(assets, verb, kind, force, spelling):
    destination_case(assets, verb, kind, force, spelling)


VIZ_KINDS = tuple(k for k in KINDS if k in REFUSED or k in ("file", "ours"))


@settings(max_examples=4, **FUZZ)
@given(kind=st.sampled_from(VIZ_KINDS), force=st.booleans(), spelling=st.sampled_from(SPELLINGS))
@_every_kind(VIZ_KINDS)
def test_output_destinations_viz(assets, kind, force, spelling):
    """``viz`` renders for seconds when it succeeds, so here only what it must refuse (its success on a new
    path is ``tests/fuzz/test_options.py::test_every_base_command_line_succeeds``)."""
    destination_case(assets, "viz", kind, force, spelling)
