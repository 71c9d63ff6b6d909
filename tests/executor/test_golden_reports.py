"""Golden reports: ``primal run`` on small programs writes exactly the ``report.json`` kept in ``tests/golden/``.

A change meant to make the replay faster (issue 54: fewer events, structure reused, a cache) must leave every
figure of every report as it was; this test holds it to that, byte for byte (``report.json`` carries no wall
times; the package version and the program's path are left out). The programs cover what such a change touches: a multicast-heavy
single sequence after the genetic placement, a pipelined batch whose sequences switch adapters, two exported
ONNX families (GQA with LoRA on Q and V; Gemma-2's sliding window and multi-query attention), and OPT-1.3B over
21 CTs, whose 32 KB multicasts contend where their trees branch (a tree branch that waited at the wrong input
buffer moved its TTFT; the smaller programs did not notice).

A change that is meant to move the figures (a model change) regenerates the files and says why in its commit:
``python tests/executor/test_golden_reports.py`` from the repository root.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import pytest

from primal_compiler.cli import main

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"
ONNX = ROOT / "tests" / "fixtures" / "onnx"

CASES = {
    "tiny-llama": ["tiny-llama", "--lora", "q,v:8", "--context", "64"],
    "tiny-llama-mixed-batch": ["tiny-llama", "--lora", "q,v:4", "--batch", "4", "--context", "64", "-p",
                               "lower-tiles,blocking,zcurve-order,kv-ring,"
                               "codegen{requests=0+0+1+1;0+1+1+0;1,pipeline=true},srpg"],
    "mistral-lora": [str(ONNX / "mistral_lora_qv_r2_dynamo.onnx"), "--context", "64"],
    "opt-1.3b": ["opt-1.3b", "--lora", "q,v:8", "--context", "128", "-p",
                 "lower-tiles,blocking,zcurve-order,kv-ring,codegen,srpg"],
    "gemma2": [str(ONNX / "families" / "gemma2.onnx"), "--context", "64"],
}
"""Name -> ``primal run`` arguments (``-o`` added)."""


def report_text(args: list[str], out: Path) -> str:
    """``report.json`` of ``primal run ARGS -o OUT`` as the golden file holds it: less the package version and the
    program's path (where the checkout lies)."""
    assert main(["run", *args, "-o", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    report.pop("package_version"), report.pop("program")
    return json.dumps(report, indent=1, sort_keys=True) + "\n"


@pytest.mark.parametrize("name", sorted(CASES))
def test_report_equals_the_golden_one(name, tmp_path, capsys):
    got = report_text(CASES[name], tmp_path / name)
    capsys.readouterr()
    want = (GOLDEN / f"{name}.json").read_text()
    if got != want:
        diff = [f"{k}: {a!r} -> {b!r}" for k, a, b in _differences(json.loads(want), json.loads(got))]
        pytest.fail(f"{name}: the report moved ({len(diff)} values), e.g. " + "; ".join(diff[:5]))


def test_a_replay_read_from_the_cache_reports_the_same(tmp_path, capsys):
    """A second ``primal run`` of the output reads its schedule from the replay cache: the same report, figure
    for figure."""
    out = tmp_path / "opt"
    first = report_text(CASES["opt-1.3b"], out)
    capsys.readouterr()
    assert main(["run", str(out), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert "schedule" not in again["metrics"].pop("replay_s")  # read from the cache: no schedule ran
    again.pop("package_version"), again.pop("program")
    want = json.loads(first)
    want.pop("program_sha256")  # report.json names the program file it wrote; --json of a directory does not
    assert again == want


def _differences(a, b, key=""):
    """(dotted key, golden value, new value) of every leaf that differs."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            yield from _differences(a.get(k), b.get(k), f"{key}.{k}" if key else k)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            yield from _differences(x, y, f"{key}[{i}]")
    elif a != b:
        yield key, a, b


if __name__ == "__main__":  # regenerate the golden files (a model change only; say why in the commit)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["XDG_CACHE_HOME"] = str(Path(tmp) / "cache")
        GOLDEN.mkdir(exist_ok=True)
        for case, arguments in sorted(CASES.items()):
            (GOLDEN / f"{case}.json").write_text(report_text(arguments, Path(tmp) / case))
            print(f"wrote {GOLDEN / case}.json", file=sys.stderr)
