"""The serving report: per-request latencies and the run's throughput, energy and adapter switches.

Definitions (docs/serving.md): a request's **TTFT** runs from its arrival
to its first token (queueing, any adapter switch, its batch's prefill);
its **ITL** is its batch's decode step (requests generating one token have
none); **queueing** is arrival to its batch's start. **Throughput** is the
generated tokens of every request over the span from the first arrival to
the last token; **tokens/J** divides them by all the energy of that span:
adapter switches, prefills, decode steps and the idle machine between
batches. A switch's **exposed** time is what it adds to its batch's first
tokens; its **CONFIG** time is the span of the load's CONFIG records, hidden
behind compute or not. A batch on more adapters than the SRAM-DCIM slots
hold rewrites them between passes: its decode steps' **exposed** time is
their time less the same steps on one adapter. **Reprogramming exposed** is
both summed over the run. **Context save** counts the returning turns (those
with a history), how many resumed their saved KV cache, the history tokens
they did not prefill again, and the saved conversations that gave their
slots up. Percentiles are over requests (linear interpolation).
"""

from __future__ import annotations

import numpy as np

from primal_compiler.serve.costs import Policy
from primal_compiler.serve.trace import Trace


def _pct(values: np.ndarray) -> dict:
    v = values[~np.isnan(values)]
    if not len(v):
        return {"p50": None, "p99": None, "mean": None}
    return {"p50": float(np.percentile(v, 50)), "p99": float(np.percentile(v, 99)), "mean": float(v.mean())}


def serve_report(trace: Trace, policy: Policy, run: dict, model: str, target: str, context: int,
                 per_request: bool = True) -> dict:
    """JSON-ready report of ``simulate``'s ``run`` of ``trace``."""
    arrival = trace.arrival_s
    tokens = int(trace.generate.sum())
    span = float(run["finish_s"].max() - arrival[0])
    energy = sum(run["energy_j"].values())
    switched = run["switched"]
    out = {
        "format": "primal-serve", "model": model, "target": target, "context": context, "policy": policy.__dict__,
        "adapters": list(trace.adapters), "requests": len(trace), "generated_tokens": tokens,
        "span_s": span, "batches": run["batches"],
        "ttft_s": _pct(run["first_token_s"] - arrival), "itl_s": _pct(run["itl_s"]),
        "queueing_s": _pct(run["start_s"] - arrival),
        "tokens_per_s": tokens / span if span > 0 else None, "energy_j": energy,
        "energy_by_phase_j": run["energy_j"], "tokens_per_j": tokens / energy if energy > 0 else None,
        "idle_w": run["idle_w"],
        "adapter_switches": {"total": int((switched > 0).sum()), "cold": int((switched == 1).sum()),
                             "warm": int((switched == 2).sum())},
        "reconfiguration": {"exposed_s": run["reconfig_s"], "config_s": run["config_s"],
                            "decode_exposed_s": run["decode_exposed_s"],
                            "energy_j": run["energy_j"]["reconfiguration"]},
        "max_adapters_per_batch": run["max_adapters_per_batch"],
        "reprogramming_exposed_s": run["reconfig_s"] + run["decode_exposed_s"],
        "context_save": {"returning": int((trace.history > 0).sum()),
                         "resumed": int((run["saved_tokens"] > 0).sum()),
                         "saved_tokens": int(run["saved_tokens"].sum()),
                         "prefilled_tokens": int((trace.history + trace.prompt - run["saved_tokens"]).sum()),
                         "evictions": run["evictions"], "kv_slots": run["kv_slots"]},
        "shapes": run["shapes"],
    }
    if per_request:
        out["per_request"] = {"arrival_s": arrival.tolist(), "adapter": [trace.adapters[k] for k in trace.adapter],
                              "start_s": run["start_s"].tolist(), "first_token_s": run["first_token_s"].tolist(),
                              "finish_s": run["finish_s"].tolist(), "batch": run["batch"].tolist(),
                              "switch": [("", "cold", "warm")[k] for k in switched],
                              "saved_tokens": run["saved_tokens"].tolist()}
    return out


def _ms(d: dict) -> str:
    if d["p50"] is None:
        return "none"
    return f"p50 {d['p50'] * 1e3:.4g} ms  p99 {d['p99'] * 1e3:.4g} ms  mean {d['mean'] * 1e3:.4g} ms"


def render_serve(r: dict) -> str:
    """The text form of :func:`serve_report`."""
    p, e, sw, cs = r["policy"], r["energy_by_phase_j"], r["adapter_switches"], r["context_save"]
    on = lambda flag: "on" if flag else "off"  # noqa: E731
    lines = [
        f"serve: {r['model']} on {r['target']}, {len(r['adapters'])} adapters, {r['requests']:,} requests, "
        f"{r['generated_tokens']:,} tokens generated over {r['span_s']:.4g} s in {r['batches']:,} batches",
        f"  policy          prefetch {on(p['prefetch'])}, block-sparse LoRA {on(p['sparse'])}"
        + (f" ({p['zero_fraction']:.1%} of blocks zero)" if p["sparse"] else "")
        + f", batching up to {p['max_batch']} requests ({p['batching']}), context save {on(p['context_save'])}",
        f"  TTFT            {_ms(r['ttft_s'])}",
        f"  ITL             {_ms(r['itl_s'])}",
        f"  queueing        {_ms(r['queueing_s'])}",
        f"  throughput      {r['tokens_per_s']:,.1f} tokens/s",
        f"  energy          {r['energy_j']:.4g} J ({r['tokens_per_j']:,.1f} tokens/J): prefill {e['prefill']:.3g} J, "
        f"decode {e['decode']:.3g} J, reconfiguration {e['reconfiguration']:.3g} J, idle {e['idle']:.3g} J "
        f"({r['idle_w']:.3g} W)",
        f"  adapter switch  {sw['total']:,} ({sw['cold']:,} cold, {sw['warm']:,} warm): "
        f"{r['reconfiguration']['exposed_s'] * 1e3:.4g} ms exposed of {r['reconfiguration']['config_s'] * 1e3:.4g} ms "
        "of CONFIG records",
        f"  mixed batches   up to {r['max_adapters_per_batch']} adapters a batch; rewriting adapters between passes "
        f"adds {r['reconfiguration']['decode_exposed_s'] * 1e3:.4g} ms to decode steps "
        f"({r['reprogramming_exposed_s'] * 1e3:.4g} ms of reprogramming exposed in all)",
        f"  context save    {cs['resumed']:,} of {cs['returning']:,} returning turns resumed, "
        f"{cs['saved_tokens']:,} tokens not prefilled again ({cs['prefilled_tokens']:,} prefilled); "
        f"{cs['kv_slots']:,} KV slots, {cs['evictions']:,} saved contexts evicted",
        f"  replayed        {len(r['shapes'])} shapes (batch, prompt bucket[, saved][, adapters]): "
        + ", ".join(f"({s['batch']}, {s['bucket']}" + (f", {s['history']} saved" if s["history"] else "")
                    + (f", {s['adapters']} adapters)" if s["adapters"] > 1 else ")") for s in r["shapes"]),
    ]
    return "\n".join(lines)
