"""Which replay metrics a sweep keeps, and how a run report becomes flat numeric columns.

Metric names are the keys of ``primal run --json``'s ``metrics`` object
(``docs/executor.md``), nested keys joined with dots
(``power_breakdown_w.static``, ``hops.inter_ct.max_hops``), plus the H100
baseline of the same work under ``h100.`` (``h100.tokens_per_j``). A name
that is a table keeps all of its numeric leaves; ``*`` matches within one
level (``power_breakdown_w.*``).

Guarantees: :func:`check_metric` rejects a name whose first part is not a
metric the executor reports, before anything runs; :func:`select` returns
exactly one float (or None when the point did not produce it) per kept
leaf, so every row of a sweep has the same metric columns, all ``float64``.
"""

from __future__ import annotations

import fnmatch
import math
from typing import Any

from primal_compiler.errors import InputError

#: Top-level keys of the executor's metrics dict (``executor/metrics.py``) and the H100 baseline.
KNOWN = (
    "request", "batch", "context", "decode_steps", "prompt_tokens", "ttft_s", "itl_s", "tokens_per_s",
    "itl_p50_s", "itl_p99_s", "itl_first_step_s", "passes", "program_load_s",
    "energy_per_token_j", "tokens_per_j", "power_w", "power_breakdown_w", "power_by_state_w",
    "static_by_domain_w", "prefill_energy_j", "reconfig_exposed_s", "max_hops", "mean_hops", "weighted_hops",
    "hops", "kv_storage_utilisation", "area_mm2", "num_cts", "records", "h100",
)

DEFAULT_METRICS = (
    "ttft_s", "itl_s", "tokens_per_s", "tokens_per_j", "power_w", "energy_per_token_j", "max_hops",
    "mean_hops", "weighted_hops", "num_cts", "power_breakdown_w", "h100.tokens_per_s", "h100.tokens_per_j",
)

#: Leaves of table metrics, so a table name expands to the same columns whether or not a point succeeded.
TABLE_LEAVES = {
    "power_breakdown_w": ("rram_adc", "base_dcim", "sram_dcim", "router_dmac", "links", "controller", "wakeup", "static"),
    "power_by_state_w": ("active", "waking", "gated", "controller"),
    "static_by_domain_w": ("rram_adc", "base_dcim", "sram_dcim", "router_dmac", "scratchpad"),
    "area_mm2": ("rram", "sram", "router", "dmac", "scratchpad", "total"),
    "records": ("total", "decode", "prefill", "adapter"),
    "h100": ("ttft_s", "itl_s", "tokens_per_s", "tokens_per_j", "energy_per_token_j", "power_w",
             "prefill_energy_j", "prefill_power_w"),
}


def check_metric(name: str, where: str) -> None:
    """InputError unless ``name``'s first part is a reported metric."""
    head = name.split(".", 1)[0]
    if head not in KNOWN:
        raise InputError(where, f"unknown metric {name!r}; metrics: {', '.join(KNOWN)}")


def flatten(report: dict) -> dict[str, float]:
    """Numeric leaves of a run report's ``metrics`` plus ``h100``, as ``dotted.name -> float``."""
    out: dict[str, float] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[prefix] = float(value)

    walk("", report.get("metrics", {}))
    h100 = report.get("h100")
    if isinstance(h100, dict):
        walk("h100", {k: v for k, v in h100.items() if k != "error"})
    return out


def columns(kept: tuple[str, ...]) -> tuple[str, ...]:
    """The metric columns ``kept`` expands to without a report (tables by their known leaves)."""
    out: list[str] = []
    for name in kept:
        if name in TABLE_LEAVES:
            out += [f"{name}.{leaf}" for leaf in TABLE_LEAVES[name]]
        elif name.endswith(".*") and name[:-2] in TABLE_LEAVES:
            out += [f"{name[:-2]}.{leaf}" for leaf in TABLE_LEAVES[name[:-2]]]
        elif "*" not in name:
            out.append(name)
    return tuple(dict.fromkeys(out))


def select(flat: dict[str, float] | None, kept: tuple[str, ...]) -> dict[str, float | None]:
    """One value per kept column; tables and globs also keep leaves not in :data:`TABLE_LEAVES`."""
    cols = list(columns(kept))
    if flat:
        for name in kept:
            if name in flat:
                continue
            pattern = name if "*" in name else name + ".*"
            cols += [k for k in flat if fnmatch.fnmatchcase(k, pattern) and k not in cols]
    row: dict[str, float | None] = {}
    for c in cols:
        v = (flat or {}).get(c)
        row[c] = None if v is None or not math.isfinite(v) else v
    return row


#: How a name's unit suffix reads on a figure (the target's and the metrics' naming convention, docs/targets.md).
UNITS = {"s": "s", "ms": "ms", "us": "\u00b5s", "ns": "ns", "j": "J", "mj": "mJ", "uj": "\u00b5J", "pj": "pJ",
         "w": "W", "mw": "mW", "uw": "\u00b5W", "hz": "Hz", "mhz": "MHz", "ghz": "GHz", "c": "\u00b0C", "k": "K",
         "mm2": "mm\u00b2", "bytes": "B", "bits": "bits", "cycles": "cycles"}
WORDS = {"ttft": "TTFT", "itl": "ITL", "kv": "KV", "lora": "LoRA", "srpg": "SRPG", "rram": "RRAM", "sram": "SRAM",
         "adc": "ADC", "dmac": "DMAC", "d2d": "die-to-die", "h100": "H100", "p50": "p50", "p99": "p99"}


def readable(name: str) -> str:
    """``name`` (a metric or a swept key) as a figure labels it: words for its parts, its unit suffix in
    parentheses, ``per`` as a slash (``tokens_per_j`` reads ``tokens/J``, ``rram.leakage_uw`` ``RRAM leakage
    (\u00b5W)``, ``power_breakdown_w.static`` ``power breakdown static (W)``)."""
    words: list[str] = []
    unit = None
    for part in name.split("."):
        w = part.split("_")
        if len(w) >= 3 and w[-2] == "per" and w[-3] in UNITS:  # energy_pj_per_bit: a unit per something
            unit, w = f"{UNITS[w[-3]]}/{w[-1]}", w[:-3]
        elif len(w) >= 3 and w[-2] == "per":  # tokens_per_j: the name is the ratio
            w = [*w[:-3], f"{w[-3]}/{UNITS.get(w[-1], w[-1])}"]
        elif len(w) > 1 and w[-1] in UNITS:
            unit, w = UNITS[w[-1]], w[:-1]
        words += [WORDS.get(x, x) for x in w]
    return " ".join(words) + (f" ({unit})" if unit else "")
