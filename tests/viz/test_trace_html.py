"""The Perfetto trace is valid trace-event JSON with a track per CT; the HTML report loads in headless Chromium."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest

from primal_compiler.viz import trace

CHROMIUM = "/usr/bin/chromium"


def test_trace_has_one_track_per_ct_and_the_controller(rendered, vdata):
    doc = json.loads((Path(rendered["dir"]) / "trace.json").read_text())
    events = doc["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(names) == list(range(vdata.num_cts + 1))
    assert names[vdata.num_cts] == "controller (NMC)" and names[0].startswith("CT 0")
    spans = [e for e in events if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == set(range(vdata.num_cts + 1))  # every CT and the controller run records
    by_thread = defaultdict(list)
    for e in spans:
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0 and e["dur"] > 0 and e["name"]
        by_thread[e["pid"], e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
    for spans_ in by_thread.values():  # slices of one thread never overlap (Perfetto needs proper nesting)
        spans_.sort()
        assert all(b[0] >= a[1] - 1e-6 for a, b in zip(spans_, spans_[1:]))
    records = sum(sum(e["args"].values()) for e in spans)
    assert records == len(vdata.stream.records) == doc["otherData"]["records"]


def test_trace_merges_spans_to_meet_the_cap(vdata):
    full = trace.spans(vdata)
    capped = trace.spans(vdata, max_events=25)
    assert capped["facts"]["spans"] <= 25 < full["facts"]["spans"]
    assert capped["counts"].sum() == full["counts"].sum() == len(vdata.stream.records)


CHECK = """<script>
window.addEventListener("load", function () {
  var imgs = Array.prototype.slice.call(document.images);
  var ok = imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length;
  document.body.setAttribute("data-images", imgs.length + "/" + ok);
  document.body.setAttribute("data-errors", String(window.__errors || 0));
});
window.addEventListener("error", function () { window.__errors = (window.__errors || 0) + 1; }, true);
</script>"""


def _chromium(args, tmp_path, timeout=90):
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'profile'}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed (/usr/bin/chromium); "
                                                        ".ci/run installs it")
def test_html_report_loads_in_headless_chromium(rendered, tmp_path):
    out = Path(rendered["dir"])
    text = (out / "report.html").read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", text), "the page must not fetch anything"
    pictures = [f for f in rendered["files"] if f.endswith(".png")]
    assert text.count("<img ") == len(pictures) >= 6
    probe = tmp_path / "report.html"
    shutil.copy(out / "report.html", probe)
    probe.write_text(probe.read_text().replace("</body>", CHECK + "</body>"))
    res = _chromium(["--dump-dom", probe.as_uri()], tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    body = re.search(r"<body[^>]*>", res.stdout)
    assert body, res.stdout[:500]
    assert f'data-images="{len(pictures)}/{len(pictures)}"' in body.group(0), body.group(0)
    assert 'data-errors="0"' in body.group(0)
    assert "Metrics" in res.stdout and "codegen{requests=0;1}" in res.stdout  # metrics and pass records shown
    shot = tmp_path / "shot.png"
    res = _chromium([f"--screenshot={shot}", "--window-size=1280,2400", (out / "report.html").as_uri()], tmp_path)
    assert res.returncode == 0 and shot.stat().st_size > 20_000, res.stderr[-2000:]


CLICK = """<script>
window.addEventListener("load", function () {
  var th = document.querySelector("table.sortable th:nth-child(2)");  // the metrics table's PRIMAL column
  th.click();
  var first = th.closest("table").querySelectorAll("tr")[1].children[0].textContent;
  th.click();
  var last = th.closest("table").querySelectorAll("tr")[1].children[0].textContent;
  var img = document.querySelector("figure img");
  img.click();
  document.body.setAttribute("data-sorted", first + "|" + last + "|" + th.getAttribute("aria-sort"));
  document.body.setAttribute("data-zoom", img.className);
});
</script>"""


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed (/usr/bin/chromium); "
                                                        ".ci/run installs it")
def test_the_page_sorts_a_table_and_zooms_a_picture_on_a_click(rendered, tmp_path):
    """Clicking the PRIMAL column's header sorts the metrics by value (the smallest first; again, the largest
    first); clicking a picture shows it at full size."""
    page = (Path(rendered["dir"]) / "report.html").read_text()
    table = page[page.index("<h2>Metrics</h2>"):page.index("</table>")]
    values = {m[1]: float(m[2].replace(",", "")) for m in re.finditer(r"<tr><td>([^<]*)</td><td class=num>([^<]*)</td>",
                                                                      table)}
    probe = tmp_path / "report.html"
    shutil.copy(Path(rendered["dir"]) / "report.html", probe)
    probe.write_text(probe.read_text().replace("</body>", CLICK + "</body>"))
    res = _chromium(["--dump-dom", probe.as_uri()], tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    body = re.search(r"<body[^>]*>", res.stdout).group(0)
    first, last, order = re.search(r'data-sorted="([^"]*)"', body).group(1).split("|")
    assert (values[first], values[last]) == (min(values.values()), max(values.values())) and order == "descending"
    assert 'data-zoom="zoom"' in body
