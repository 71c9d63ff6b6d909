"""``primal serve`` on fuzzed trace files, and on trace paths that are not regular files.

What is guaranteed, besides the streams and the scratch tree of :mod:`tests.fuzz.harness`: a trace
(``.jsonl`` or ``.csv``) with deep nesting, huge or non-finite numbers, wrong types, missing or extra
fields, stray lines or bytes is served or refused with one line, well within the time budget; a trace
argument that is a FIFO nobody writes, a directory, a device, a socket, a link to a FIFO, a missing file
or a file of another suffix is refused with exit 2 at once (budget 1 s), never opened and blocked on.
"""

from __future__ import annotations

import json
import os
import socket
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fuzz.harness import (BUDGET_S, FUZZ, TRACE_ROWS, check_streams, check_tree, copy_inputs, invoke, scratch,
                                snapshot, violation)

TRACE_VALUES = ("0", "1", "-1", "0.5", "4", "2", "1e999", "-1e999", "1" + "0" * 400, "9" * 5000, "1e-320", "NaN",
                "Infinity", "-Infinity", "true", "false", "null", '"4"', '"x"', '"ad"', '"b"', '""', "[]", "{}",
                "[4]", '{"a": 1}', "[" * 100_000 + "]" * 100_000, '{"a":' * 20_000 + "1" + "}" * 20_000,
                '"' + "a" * 100_000 + '"', "2147483648", "4.0", "1E2")
TRACE_LINES = ("", "   ", "[" * 100_000, "[" * 100_000 + "]" * 100_000, "{" * 50_000, '"row"', "5", "null", "[]",
               "{", '{"arrival_s": 0, "adapter": "ad", "prompt_tokens": 4, "generate_tokens": 2', "\ufeff{}",
               '{"arrival_s": 0}' * 2)
FIELDS = ("arrival_s", "adapter", "prompt_tokens", "generate_tokens", "conversation")


@st.composite
def jsonl_trace(draw) -> bytes:
    lines = []
    arrival = 0.0
    for _ in range(draw(st.integers(1, 4))):
        how = draw(st.sampled_from(("row", "field", "field", "extra", "missing", "line", "bytes")))
        row = {"arrival_s": json.dumps(arrival), "adapter": json.dumps(draw(st.sampled_from(("ad", "b")))),
               "prompt_tokens": str(draw(st.integers(1, 8))), "generate_tokens": str(draw(st.integers(1, 4)))}
        arrival += 0.01
        if how == "field":
            row[draw(st.sampled_from(FIELDS))] = draw(st.sampled_from(TRACE_VALUES))
        elif how == "extra":
            row[draw(st.sampled_from(("colour", "", "Arrival_s", "x" * 1000)))] = draw(st.sampled_from(TRACE_VALUES))
        elif how == "missing":
            del row[draw(st.sampled_from(FIELDS[:4]))]
        if how == "line":
            lines.append(draw(st.sampled_from(TRACE_LINES)).encode())
        elif how == "bytes":
            lines.append(draw(st.binary(max_size=30)).replace(b"\n", b""))
        else:
            lines.append(("{" + ", ".join(f"{json.dumps(k)}: {v}" for k, v in row.items()) + "}").encode())
    return b"\n".join(lines) + draw(st.sampled_from((b"\n", b"", b"\r\n")))


@st.composite
def csv_trace(draw) -> bytes:
    header = ["arrival_s", "adapter", "prompt_tokens", "generate_tokens"]
    if draw(st.booleans()):
        header = draw(st.permutations(header + draw(st.sampled_from(([], ["conversation"], ["colour"])))))
    rows = [",".join(header)]
    for n in range(draw(st.integers(0, 3))):
        row = {"arrival_s": str(n * 0.01), "adapter": draw(st.sampled_from(("ad", "b"))), "prompt_tokens": "4",
               "generate_tokens": "2", "conversation": "", "colour": "red"}
        if draw(st.booleans()):
            row[draw(st.sampled_from(FIELDS))] = draw(st.sampled_from(TRACE_VALUES + ('"a,b"', '"', "1,2")))
        rows.append(",".join(row.get(h, "") for h in header))
    return "\n".join(rows).encode() + b"\n"


#: How the trace argument is given: a regular file, or something no reader may block on.
TRACE_PATHS = ("jsonl", "csv", "fifo", "directory", "chardev", "socket", "link-fifo", "missing", "wrong-suffix")


def trace_case(assets: Path, how: str, content: bytes, extra: list[str]) -> None:
    with scratch() as root:
        copy_inputs(assets, root, ("ad",))
        name = {"csv": "t.csv", "wrong-suffix": "t.txt"}.get(how, "t.jsonl")
        path = root / name
        if how in ("jsonl", "csv", "wrong-suffix"):
            path.write_bytes(content)
        elif how == "fifo":
            os.mkfifo(path)
        elif how == "directory":
            path.mkdir()
        elif how == "chardev":
            try:
                os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
            except PermissionError:
                pytest.skip("mknod needs CAP_MKNOD")
        elif how == "socket":
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.bind(str(path))
        elif how == "link-fifo":
            os.mkfifo(root / "fifo")
            path.symlink_to("fifo")
        argv = ["serve", "tiny-llama", "--adapters", f"{root}/in/ad", "b", "--trace", str(path), "--context", "64",
                "-p", "fast", *extra]
        before = snapshot(root)
        r = invoke(argv, root, budget_s=BUDGET_S if how in ("jsonl", "csv") else 1.0)
        r.note = f"{how}: {content.decode('utf-8', 'replace')}" if how in ("jsonl", "csv", "wrong-suffix") else how
        check_streams("serve", r)
        if how not in ("jsonl", "csv") and r.code != 2:
            violation(f"trace-path-{how}", f"a trace path that is {how} must be refused with exit 2", r)
        if r.over_budget:
            violation("slow", "serve ran into the time budget on a tiny trace", r)
        check_tree(r, before, snapshot(root), ())


@settings(max_examples=30, **FUZZ)
@given(how=st.sampled_from(("jsonl", "jsonl", "jsonl", "csv")), data=st.data())
def test_serve_traces(assets, how, data):
    content = data.draw(jsonl_trace() if how == "jsonl" else csv_trace(), label="trace")
    extra = data.draw(st.sampled_from(([], ["--max-batch", "2"], ["--no-context-save", "--json"])), label="flags")
    trace_case(assets, how, content, extra)


@pytest.mark.parametrize("line", ["[" * 100_000 + "]" * 100_000, "[" * 100_000,
                                  '{"arrival_s": 0, "adapter": "ad", "prompt_tokens": ' + "9" * 5000
                                  + ', "generate_tokens": 2}', '{"arrival_s": ' + "1" + "0" * 400
                                  + ', "adapter": "ad", "prompt_tokens": 4, "generate_tokens": 2}'],
                         ids=["nested", "unclosed", "long-int", "huge-int"])
def test_serve_trace_extremes(assets, line):
    """The deepest nesting a trace line can hold, and integers too long to convert, are one-line refusals."""
    trace_case(assets, "jsonl", line.encode() + b"\n", [])


@pytest.mark.parametrize("how", [h for h in TRACE_PATHS if h not in ("jsonl", "csv")])
def test_serve_trace_paths(assets, how):
    """A trace argument that is not a regular file (a FIFO nobody writes, a device) is refused at once."""
    trace_case(assets, how, json.dumps(TRACE_ROWS[0]).encode() + b"\n", [])
