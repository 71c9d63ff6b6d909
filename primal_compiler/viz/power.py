"""Power timelines: a Gantt chart of every CT's power state and the power drawn over time.

Windows: the decode steps the stream replays (``decode:0``), and an adapter switch (the
``adapter:1`` section through the end of ``prefill:1`` when the program
serves a second adapter, e.g. ``codegen{requests=0;1}``; else the first
adapter load with its prefill). States come from the replay's
:class:`~primal_compiler.executor.power.Timeline` (active, waking, gated);
*reconfiguring* marks the time CONFIG records writing a CT's SRAM run.
Power is binned: each record's dynamic energy spread evenly over its
[start, finish), plus every CT's static power in its state (the executor's
``interval_watts``: its domains' leakage and its RRAM periphery's bias).
"""

from __future__ import annotations

import numpy as np
from matplotlib.patches import Patch

from primal_compiler.executor import power as xpower
from primal_compiler.isa.opcodes import Opcode, step_ends
from primal_compiler.report.text import human_time
from primal_compiler.viz import style
from primal_compiler.viz.data import VizData

BINS = 300


def windows(d: VizData) -> list[tuple[str, int, int]]:
    """(title, first cycle, end cycle) of the decode step and of the adapter switch or first load."""
    rp, names = d.rp, d.section_names()
    out = []

    def span(*secs):
        idx = np.concatenate([rp.section(s) for s in secs])
        return int(rp.start[idx].min()), int(rp.finish[idx].max())

    if "decode:0" in names:  # the section holds every decode step the stream replays, one ARGMAX each
        steps = int(step_ends(d.stream.records[rp.section("decode:0")]).sum())
        out.append((f"decode, {steps} step{'s' if steps != 1 else ''} (decode:0)", *span("decode:0")))
    if "adapter:1" in names and "prefill:1" in names:
        out.append(("adapter switch (adapter:1 + prefill:1)", *span("adapter:1", "prefill:1")))
    elif "adapter:0" in names and "prefill:0" in names:
        out.append(("first adapter load (adapter:0 + prefill:0)", *span("adapter:0", "prefill:0")))
    return out


def reconfig_intervals(d: VizData) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ct, begin, end) of the union of CONFIG records' run time on each destination CT."""
    r = d.stream.records
    sel = np.flatnonzero(r["op"] == Opcode.CONFIG)
    ct = r["dst_ct"][sel].astype(np.int64)
    return _union(ct, d.rp.start[sel], d.rp.finish[sel])


def _union(key, begin, end):
    """Merge overlapping intervals per key: (key, begin, end) of the union."""
    if not len(key):
        return key, begin, end
    order = np.lexsort((begin, key))
    key, begin, end = key[order], begin[order].astype(np.int64), end[order].astype(np.int64)
    big = int(end.max()) + 2
    b, e = begin + key * big, end + key * big
    reach = np.maximum.accumulate(e)
    new = np.ones(len(b), dtype=bool)
    new[1:] = b[1:] > reach[:-1]
    first = np.flatnonzero(new)
    out_end = np.maximum.reduceat(e, first) - key[first] * big
    return key[first], begin[first], out_end


def _binned(times_b, times_e, energy, edges):
    """Energy falling in each bin when each item spreads ``energy`` evenly over [begin, end)."""
    dur = np.maximum(times_e - times_b, 1).astype(np.float64)
    rate = energy / dur
    t = np.concatenate([times_b, times_b + dur]).astype(np.float64)
    dr = np.concatenate([rate, -rate])
    order = np.argsort(t, kind="stable")
    t, dr = t[order], dr[order]
    r = np.cumsum(dr)
    e = np.concatenate([[0.0], np.cumsum(r[:-1] * np.diff(t))])
    return np.diff(np.interp(edges, t, e))


def power_series(d: VizData, w0: int, w1: int, bins: int = BINS) -> dict[str, np.ndarray]:
    """Bin centres (cycles) and watts per bin: ``dynamic`` and ``static`` (leakage of every CT in its state)."""
    rp = d.rp
    edges = np.linspace(w0, w1, bins + 1)
    sel = np.flatnonzero((rp.finish > w0) & (rp.start < w1))
    e_dyn = sum(v[sel] for v in rp.energy_pj.values())
    dyn = _binned(rp.start[sel], rp.finish[sel], e_dyn, edges) if len(sel) else np.zeros(bins)
    tl = rp.timeline
    pj_per_cycle = xpower.interval_watts(tl, d.target, rp.topo.pes) * 1e12 / d.clock_hz
    sta = _binned(tl.begin, tl.end, pj_per_cycle * (tl.end - tl.begin), edges)
    seconds = np.diff(edges) / d.clock_hz
    return {"t": (edges[:-1] + edges[1:]) / 2, "dynamic": dyn * 1e-12 / seconds, "static": sta * 1e-12 / seconds}


def _time_unit(cycles: float, clock: float) -> tuple[float, str]:
    s = cycles / clock
    if s >= 1:
        return clock, "s"
    if s >= 1e-3:
        return clock / 1e3, "ms"
    return clock / 1e6, "us"


def gantt(ax, d: VizData, w0: int, w1: int, scale: float) -> None:
    tl = d.rp.timeline
    on = (tl.end > w0) & (tl.begin < w1)
    b = np.maximum(tl.begin[on], w0)
    e = np.minimum(tl.end[on], w1)
    colors = np.array([style.STATE_COLORS[s] for s in xpower.STATES])[tl.state[on]]
    h = 0.9 if d.num_cts <= 32 else 1.0
    style.rects(ax, (b - w0) / scale, (e - b) / scale, tl.ct[on] - h / 2, h, colors)
    ct, rb, re = reconfig_intervals(d)
    on = (re > w0) & (rb < w1)
    if on.any():
        b, e = np.maximum(rb[on], w0), np.minimum(re[on], w1)
        style.rects(ax, (b - w0) / scale, np.maximum((e - b) / scale, (w1 - w0) / scale / 400), ct[on] - 0.3, 0.6,
                    style.STATE_COLORS["reconfiguring"])
    ax.set_ylim(d.num_cts - 0.5, -0.5)
    ax.set_xlim(0, (w1 - w0) / scale)
    ax.set_ylabel("CT")
    ax.yaxis.get_major_locator().set_params(integer=True)


def figure(d: VizData):
    wins = windows(d)
    n = max(1, len(wins))
    gantt_h = float(np.clip(0.03 * d.num_cts + 1.2, 1.6, 7.0))
    fig = style.figure(7.0 * n, gantt_h + 2.8)
    top = 1 - 0.85 / fig.get_figheight()
    gs = fig.add_gridspec(2, n, height_ratios=[gantt_h, 1.9], hspace=0.28, wspace=0.22, top=top, bottom=0.5 / fig.get_figheight())
    for k, (title, w0, w1) in enumerate(wins):
        scale, unit = _time_unit(w1 - w0, d.clock_hz)
        ax = fig.add_subplot(gs[0, k])
        gantt(ax, d, w0, w1, scale)
        ax.set_title(f"{title}: {human_time((w1 - w0) / d.clock_hz)} from t = "
                     f"{human_time(w0 / d.clock_hz)}", fontsize=9)
        ax.tick_params(labelbottom=False)
        ax.set_xlabel("")
        p = power_series(d, w0, w1)
        ax2 = fig.add_subplot(gs[1, k], sharex=ax)
        t = (p["t"] - w0) / scale
        ax2.stackplot(t, p["static"], p["dynamic"], labels=("static (leakage by state)", "dynamic"),
                      colors=("#bdbdbd", "#3182bd"), step=None)
        total = p["static"] + p["dynamic"]
        ax2.set_ylabel("power (W)")
        ax2.set_xlabel(f"time in window ({unit})")
        ax2.set_ylim(0, max(float(total.max()) * 1.1, 1e-9))
        ax2.legend(fontsize=7, frameon=True, loc="lower right", framealpha=0.8)
        ax2.set_title(f"power: mean {total.mean():.3g} W, peak {total.max():.3g} W ({BINS} bins)", fontsize=8)
    handles = [Patch(color=c, label=s) for s, c in style.STATE_COLORS.items()]
    fig.legend(handles=handles, loc="upper center", ncol=4, fontsize=8, frameon=False,
               bbox_to_anchor=(0.5, 1 - 0.3 / fig.get_figheight()))
    fig.suptitle(f"Power states of {d.meta.get('model')}'s {d.num_cts} CTs", fontsize=10, y=1 - 0.05 / fig.get_figheight())
    return fig


def render(d: VizData, out, formats: tuple[str, ...]) -> list[str]:
    return style.save(figure(d), out, "power", formats)
