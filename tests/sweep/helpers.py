"""Small tiny-llama sweeps (cheap ordering pipeline, ~0.1 s a point once a worker is warm)."""

from __future__ import annotations

import textwrap
from pathlib import Path

TINY = """
[sweep]
model = "tiny-llama"
lora = "q,v:8"
context = 64
pipeline = "lower-tiles,blocking,zcurve-order,kv-ring,codegen,srpg"
metrics = ["tokens_per_s", "tokens_per_j", "power_w", "weighted_hops", "power_breakdown_w", "h100.tokens_per_j"]

[axes]
batch = [1, 2, 1024]
"srpg.gating" = [true, false]
"""

#: columns that say when and where a row was computed, not what it is
VOLATILE = ("wall_s", "compile_s", "replay_s", "worker", "finished_at", "run_id")


def write_spec(tmp_path: Path, text: str = TINY, name: str = "spec.toml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def stable_rows(table) -> list[dict]:
    rows = [{k: v for k, v in r.items() if k not in VOLATILE} for r in table.to_pylist()]
    return sorted(rows, key=lambda r: r["point_id"])
