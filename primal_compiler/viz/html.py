"""One self-contained HTML page: metrics, pipeline, pass records and every picture inlined (no fetches)."""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path

from primal_compiler.viz.data import VizData, same_run

CSS = """
body { font-family: sans-serif; margin: 1.5em auto; max-width: 1400px; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; font-size: 0.9em; } td, th { border: 1px solid #ccc; padding: 3px 8px; }
th { background: #f0f0f0; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
pre { background: #f7f7f7; padding: 0.6em; overflow-x: auto; font-size: 0.8em; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 0.85em; color: #555; } code { background: #f3f3f3; padding: 0 3px; }
table.sortable th { cursor: pointer; } th[aria-sort=ascending]::after { content: " \\25B2"; }
th[aria-sort=descending]::after { content: " \\25BC"; }
figure { overflow-x: auto; } figure img { cursor: zoom-in; } figure img.zoom { max-width: none; cursor: zoom-out; }
"""

SCRIPT = """<script>
// Sortable tables: a click on a header sorts the rows by that column (numbers as numbers), again to reverse.
function sortBy(th) {
  var table = th.closest("table"), col = Array.prototype.indexOf.call(th.parentNode.children, th);
  var rows = Array.prototype.slice.call(table.querySelectorAll("tr")).slice(1);
  var up = th.getAttribute("aria-sort") !== "ascending";
  function key(row) {
    var text = row.children[col] ? row.children[col].textContent.trim() : "";
    var num = parseFloat(text.replace(/,/g, ""));
    return isNaN(num) ? text.toLowerCase() : num;
  }
  rows.sort(function (a, b) {
    var x = key(a), y = key(b), n = typeof x === "number" && typeof y === "number";
    var c = n ? x - y : String(x).localeCompare(String(y));
    return up ? c : -c;
  });
  Array.prototype.forEach.call(th.parentNode.children, function (h) { h.removeAttribute("aria-sort"); });
  th.setAttribute("aria-sort", up ? "ascending" : "descending");
  rows.forEach(function (row) { row.parentNode.appendChild(row); });
}
document.addEventListener("click", function (e) {
  var th = e.target.closest("table.sortable th");
  if (th) { sortBy(th); return; }
  if (e.target.tagName === "IMG" && e.target.closest("figure")) { e.target.classList.toggle("zoom"); }
});
</script>"""

MIME = {"png": "image/png", "svg": "image/svg+xml"}

CAPTIONS = {
    "placement": "Placement: package overview (layer of each CT) and representative CTs, each PE coloured by the "
                 "role of its RRAM tile; squares mark LoRA A (black) / B (white) SRAM tiles, dots KV chunks.",
    "traffic": "Bytes per directed link for the decode step and the prefill (busiest CT's mesh), die-to-die links "
               "on the package grid, and mesh bytes per CT; circles mark the hottest links.",
    "hops": "Hop histogram of every transfer leg (share of legs per hop count).",
    "power": "Power state of every CT over the decode step and over an adapter switch (reconfiguring = CONFIG "
             "records writing the CT's SRAM) and power over time.",
    "adapters": "A request rewriting its adapters (more adapters than SRAM-DCIM slots, or lora_residency="
                "per-token): per layer, each pass's LoRA products "
                "(solid, in the colour of the adapter they read) and the CONFIG writes of the next adapter "
                "(hatched), over the first decode step.",
    "thermal": "Every CT die's steady temperature under sustained decode (rise over ambient; the ring marks the "
               "hottest) and the hottest die's warm-up from ambient (primal thermal, docs/thermal.md).",
    "breakdown": "Energy per generated token by component, PRIMAL next to the H100 baseline, and area by PE "
                 "component.",
}


def _img(path: Path) -> str:
    fmt = path.suffix.lstrip(".")
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(path.stem)}" src="data:{MIME[fmt]};base64,{data}">'


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:,.1f}" if abs(v) >= 1000 else f"{v:.4g}"
    return html.escape(str(v))


def metrics_table(d: VizData, other: VizData | None = None) -> str:
    """The headline metrics, beside the H100 baseline's; with ``other`` (``--compare``) also its value and the
    ratio of the two, metric by metric."""
    m, g = d.metrics, d.h100
    g = None if not g or "error" in g else g
    rows = [("TTFT (s)", "ttft_s"), ("ITL (s)", "itl_s"), ("throughput (tokens/s)", "tokens_per_s"),
            ("energy per token (J)", "energy_per_token_j"), ("tokens/J", "tokens_per_j"),
            ("power, decode (W)", "power_w"), ("max hops (decode, on-CT)", "max_hops"), ("mean hops", "mean_hops"),
            ("traffic-weighted hops", "weighted_hops"), ("KV storage-bandwidth utilisation", "kv_storage_utilisation"),
            ("CTs", "num_cts"), ("area (mm\u00b2)", "area_mm2")]
    value = lambda metrics, key: metrics["area_mm2"]["total"] if key == "area_mm2" else metrics[key]  # noqa: E731
    head = ("<tr><th>metric</th><th>PRIMAL</th>" + ("<th>H100</th>" if g else "")
            + (f"<th>{html.escape(other.where)}</th><th>ratio</th>" if other else "") + "</tr>")
    body = []
    for k, (name, key) in enumerate(rows):
        mine = value(m, key)
        row = f"<tr><td>{name}</td><td class=num>{_fmt(mine)}</td>"
        if g:
            row += f"<td class=num>{_fmt(g[key])}</td>" if k < 6 else "<td></td>"
        if other:
            theirs = value(other.metrics, key)
            row += f"<td class=num>{_fmt(theirs)}</td><td class=num>{_fmt(theirs / mine) if mine else '-'}</td>"
        body.append(row + "</tr>")
    return f"<table class=sortable>{head}{''.join(body)}</table>"


def critical_table(d: VizData) -> str:
    """Where request 0's TTFT and ITL (per step) go along their critical paths, by class of record (``primal run
    --critical-path``, docs/executor.md), or how to have it computed."""
    from primal_compiler.executor.critical import CLASS_KEYS, LABELS

    cp = d.metrics.get("critical_path")
    if not cp:
        return ("<p>Not computed (it needs a full replay): <code>primal viz OUT --critical-path</code>, or keep it "
                "with <code>primal run MODEL --critical-path -o OUT</code>.</p>")
    t, i = cp["ttft"], cp["itl"]

    def cells(part: dict, key: str) -> str:
        v, total = part["by_class_s"][key], part["total_s"]
        return f"<td class=num>{v:.4g}</td><td class=num>{100 * v / total if total else 0:.1f}</td>"

    rows = [f"<tr><td>{html.escape(LABELS[k])}</td>{cells(t, k)}{cells(i, k)}</tr>" for k in CLASS_KEYS
            if t["by_class_s"][k] or i["by_class_s"][k]]
    head = ("<tr><th>class</th><th>TTFT (s)</th><th>TTFT share (%)</th><th>ITL per step (s)</th>"
            "<th>ITL share (%)</th></tr>")
    return (f"<table class=sortable>{head}{''.join(rows)}</table><p>TTFT {t['total_s']:.4g} s, bound by "
            f"{html.escape(LABELS[t['bound_by']])}; ITL {i['total_s']:.4g} s per step, bound by "
            f"{html.escape(LABELS[i['bound_by']])} (request 0).</p>")


def records_table(d: VizData) -> str:
    if not d.records:
        return "<p>No <code>records.json</code> beside the program.</p>"
    rows = []  # (no timing column: a compile output keeps no wall times, so the page's bytes are the program's)
    for r in d.records:
        details = json.dumps(r.get("details", {}), sort_keys=True, default=str)
        short = details if len(details) <= 160 else details[:157] + "..."
        rows.append(f"<tr><td>{html.escape(str(r.get('name')))}</td><td><code>{html.escape(str(r.get('spec')))}"
                    f"</code></td><td><details><summary>{html.escape(short)}</summary><pre>"
                    f"{html.escape(json.dumps(r.get('details', {}), indent=1, sort_keys=True, default=str))}"
                    f"</pre></details></td></tr>")
    return "<table class=sortable><tr><th>pass</th><th>spec</th><th>details</th></tr>" + "".join(rows) + "</table>"


def memory_note(d: VizData) -> str:
    """The scratchpad line at the top of the page, as a warning when the program's buffers do not fit."""
    from primal_compiler.report.run import render_memory

    mem = d.metrics.get("memory")
    if not mem:
        return ""
    lines = render_memory(mem)
    style = "" if mem["fits"] else ' style="color:#b00020;font-weight:bold"'
    return "".join(f"<p{style}>{html.escape(line.strip())}</p>" for line in lines)


def page(d: VizData, pictures: list[Path], text_report: str, other: VizData | None = None) -> str:
    title = f"PRIMAL: {d.meta.get('model')} on {d.meta.get('target')}"
    figs = []
    stems: dict[str, list[Path]] = {}
    for p in pictures:  # one figure per picture, whatever formats it was written in
        stems.setdefault(p.stem, []).append(p)
    for stem, files in stems.items():
        key = stem.split("_")[0]
        cap = CAPTIONS.get(key, "")
        if stem.startswith("placement_ct"):
            cap = f"Placement map of CT {int(stem[12:])}."
        elif stem == "placement_overview":
            cap = "Which layer sits on which CT (package grid, snake order; red: CTs drawn in detail)."
        shown = next((p for p in files if p.suffix.lstrip(".") in MIME), None)
        links = " ".join(f'<a href="{html.escape(p.name)}">{html.escape(p.name)}</a>' for p in files if p is not shown)
        names = html.escape(shown.name) + (f" (also {links})" if links else "") if shown else links
        figs.append(f"<figure>{_img(shown) if shown else ''}<figcaption>{names}: {html.escape(cap)}</figcaption>"
                    "</figure>")
    secs = d.metrics["records"]
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title><style>{CSS}</style></head>
<body>
<h1>{html.escape(title)}</h1>
<p>Program <code>{html.escape(d.where)}</code>: {d.num_cts} CTs of {d.rows}x{d.cols} PEs, batch {d.metrics['batch']},
context {d.metrics['context']}, {secs['total']:,} records (adapter {secs['adapter']:,}, prefill {secs['prefill']:,},
decode {secs['decode']:,}).</p>
{memory_note(d)}
<h2>Metrics</h2>
{metrics_table(d, other)}
<h2>Where the time goes (critical path)</h2>
{critical_table(d)}
<details><summary>full text report (<code>primal run</code>)</summary><pre>{html.escape(text_report)}</pre></details>
<h2>Pipeline</h2>
<p><code>{html.escape(str(d.meta.get('pipeline')))}</code></p>
{records_table(d)}
<h2>Pictures</h2>
{''.join(figs)}
<p>Trace of the replay: <code>trace.json</code> beside this page (open it in ui.perfetto.dev).
The page holds no wall-clock times, so the same program gives the same bytes; <code>primal viz</code>
prints its timings on the terminal. Click a table's header to sort it, a picture to see it at full size.</p>
{SCRIPT}
</body></html>
"""


def render(d: VizData, out: Path, pictures: list[str], other: VizData | None = None) -> list[str]:
    """Write ``report.html``: a pure function of the program (and ``other``'s, with ``--compare``), its saved
    run report and its pictures (no dates, no timings). The full text report is the saved one (``primal run
    MODEL -o OUT``'s, with its GPU baselines) when it is of the replay drawn (:func:`~.data.same_run`), else
    the replay's."""
    from primal_compiler.report.run import render_run, without_wall_times

    metrics = without_wall_times(d.metrics)
    report = {"model": d.meta.get("model"), "target": d.target.name, "metrics": metrics, "h100": d.h100}
    if d.saved is not None and same_run(d.saved, d.target.name, d.metrics):
        report = d.saved
    try:
        text = render_run(report)
    except (KeyError, TypeError, ZeroDivisionError) as exc:  # the page must not depend on the text layout
        text = f"(text report unavailable: {exc})"
    (out / "report.html").write_text(page(d, [out / p for p in pictures], text, other))
    return ["report.html"]
