"""Chrome / Perfetto trace-event JSON of a served trace (open in ui.perfetto.dev or chrome://tracing).

Process 0, "machine": thread 0 the batches, each as its exposed adapter
switch ("switch cold -> A" / "switch warm -> A"), its prefill and its decode
steps; thread 1 adapter residency, one span per stretch of batches on one
set of loaded adapters (names joined by ``+``). Process 1, "requests": one async track per request (``id``
= its index in the trace), "queued" from arrival to its batch's start,
"prefill" (or "prefill resumed", over its saved context) to its first
token, "decode" to its last. Times in microseconds;
the JSON is written with sorted keys, so the same run gives the same bytes.
"""

from __future__ import annotations

import json

import numpy as np

from primal_compiler.serve.trace import Trace

US = 1e6


def _span(name: str, pid: int, tid: int, begin: float, end: float, **args) -> dict:
    return {"name": name, "ph": "X", "pid": pid, "tid": tid, "ts": round(begin * US, 3),
            "dur": round(max(end - begin, 0.0) * US, 3), "args": args}


def events(trace: Trace, run: dict) -> list[dict]:
    """The trace events of ``simulate``'s ``run`` of ``trace`` (module docstring)."""
    names = trace.adapters
    out: list[dict] = [
        {"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "machine"}},
        {"name": "thread_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "batches"}},
        {"name": "thread_name", "ph": "M", "pid": 0, "tid": 1, "args": {"name": "adapter residency"}},
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "requests"}},
    ]
    log = run["batch_log"]
    members = np.bincount(run["batch"], minlength=len(log["start_s"]))
    for b, (t, exposed, first, end, k, sw) in enumerate(zip(*(log[key] for key in log))):
        if sw:
            out.append(_span(f"switch {('cold', 'warm')[sw - 1]} -> {'+'.join(names[a] for a in k)}", 0, 0, t,
                             t + exposed, batch=b))
        out.append(_span("prefill", 0, 0, t + exposed, first, batch=b, requests=int(members[b])))
        if end > first:
            out.append(_span("decode", 0, 0, first, end, batch=b, requests=int(members[b])))
    since = 0
    for b in range(1, len(log["adapter"]) + 1):
        if b == len(log["adapter"]) or log["switch"][b]:
            held = "+".join(names[a] for a in log["adapter"][since])
            out.append(_span(held, 0, 1, log["start_s"][since], log["end_s"][b - 1], batches=b - since))
            since = b
    for i in range(len(trace)):
        prefill = "prefill resumed" if run["saved_tokens"][i] else "prefill"
        phases = (("queued", trace.arrival_s[i], run["start_s"][i]), (prefill, run["start_s"][i],
                  run["first_token_s"][i]), ("decode", run["first_token_s"][i], run["finish_s"][i]))
        for name, begin, end in phases:
            if end > begin:
                common = {"name": name, "cat": names[trace.adapter[i]], "pid": 1, "tid": 0, "id": i}
                out.append({**common, "ph": "b", "ts": round(float(begin) * US, 3)})
                out.append({**common, "ph": "e", "ts": round(float(end) * US, 3)})
    return out


def trace_json(trace: Trace, run: dict) -> str:
    return json.dumps({"traceEvents": events(trace, run), "displayTimeUnit": "ms"}, sort_keys=True)
