"""Every picture renders for a tiny model; the placement map's pixels show the placed roles."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from matplotlib.colors import to_rgb
from matplotlib.image import imread

from primal_compiler.ir.tiles import ROLE_CODES, Macro
from primal_compiler.isa.opcodes import Opcode, step_ends
from primal_compiler.viz import data, placement, power, style, traffic
from primal_compiler.viz.data import EMPTY, HUB, KV_ONLY

PICTURES = ["placement", "placement_overview", "traffic", "hops", "power", "thermal", "breakdown"]


def test_every_file_is_written_with_a_sane_size(rendered):
    out = Path(rendered["dir"])
    for name in PICTURES:
        f = out / f"{name}.png"
        assert f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert 5_000 < f.stat().st_size < 1_500_000, (name, f.stat().st_size)
    cts = sorted(out.glob("placement_ct*.png"))
    assert [p.name for p in cts] == ["placement_ct000.png", "placement_ct001.png", "placement_ct002.png"]
    assert 50_000 < (out / "report.html").stat().st_size < 5_000_000
    assert (out / "trace.json").stat().st_size > 1_000
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".viz.")], "temporary directory left behind"


def test_svg_format_writes_svg(out_naive, tmp_path):
    from primal_compiler.viz.command import render_all

    res = render_all(out_naive, tmp_path / "svg", fmt="svg")
    for name in PICTURES:
        text = (tmp_path / "svg" / f"{name}.svg").read_text()
        assert "<svg" in text[:1000], name
    page = (tmp_path / "svg" / "report.html").read_text()
    assert "data:image/svg+xml;base64," in page
    assert "report.html" in res["files"]
    # the scratchpad line heads the page, above the metrics it qualifies (issue 48, item 6)
    assert -1 < page.index("scratchpad: peak") < page.index("<h2>Metrics</h2>")


def test_vector_output_next_to_the_png(out_naive, tmp_path):
    """``--format png,pdf``: every picture as PNG (inlined in the page) and PDF (linked beside it), the PDF
    undated so two renders give the same bytes."""
    from primal_compiler.viz.command import render_all

    for name in ("a", "b"):
        res = render_all(out_naive, tmp_path / name, fmt="png,pdf")
    for pic in PICTURES:
        assert (tmp_path / "a" / f"{pic}.pdf").read_bytes()[:5] == b"%PDF-", pic
        assert (tmp_path / "a" / f"{pic}.pdf").read_bytes() == (tmp_path / "b" / f"{pic}.pdf").read_bytes(), pic
        assert f"{pic}.png" in res["files"] and f"{pic}.pdf" in res["files"]
    page = (tmp_path / "a" / "report.html").read_text()
    assert page.count("<figure>") == len([f for f in res["files"] if f.endswith(".png")])
    assert '<a href="breakdown.pdf">breakdown.pdf</a>' in page and "data:application/pdf" not in page


@pytest.mark.parametrize("fmt", ["jpg", "png,png", "", "png;pdf"])
def test_an_unsupported_format_is_one_line(out_naive, tmp_path, capsys, fmt):
    from primal_compiler.cli import main

    assert main(["viz", str(out_naive), "-o", str(tmp_path / "v"), "--format", fmt]) == 2
    err = capsys.readouterr().err
    assert err.startswith("primal: --format") or "--format" in err.splitlines()[0]
    assert err.count("\n") == 1 and not (tmp_path / "v").exists()


def _close(pixel, color) -> bool:
    return bool(np.abs(np.asarray(pixel[:3]) - np.asarray(to_rgb(color))).max() < 2.5 / 255)


@pytest.mark.parametrize("ct", [0, 2])
def test_placement_pixels_show_the_role_of_each_placed_tile(vdata, tmp_path, ct):
    a = vdata.arrays
    fig, ax = placement.ct_figure(vdata, ct)
    sel = np.flatnonzero((a["tile_ct"] == ct) & (a["tile_macro"] == Macro.RRAM) & (a["tile_pe"] >= 0))
    assert len(sel)
    centres = {int(a["tile_pe"][i]): placement.cell_center_px(fig, ax, int(a["tile_pe"][i]), vdata.cols) for i in sel}
    label = data.pe_roles(vdata, ct)
    others = {}
    for kind, color in ((KV_ONLY, style.KV_COLOR), (EMPTY, style.EMPTY_COLOR), (HUB, style.HUB_COLOR)):
        pes = np.flatnonzero(label == kind)
        if len(pes):
            others[int(pes[-1])] = (color, placement.cell_center_px(fig, ax, int(pes[-1]), vdata.cols))
    style.save(fig, tmp_path, "ct", ("png",), tight=False)
    img = imread(tmp_path / "ct.png")
    for i in sel:
        pe = int(a["tile_pe"][i])
        x, y = centres[pe]
        role = ROLE_CODES[a["tile_role"][i]].value
        assert _close(img[y, x], style.ROLE_COLORS[role]), (pe, role, img[y, x])
    assert others, "expected unused or KV-only PEs on a tiny model's CT"
    for pe, (color, (x, y)) in others.items():
        assert _close(img[y, x], color), (pe, color, img[y, x])


def test_placement_picks_few_cts_of_a_large_system(vdata, monkeypatch):
    assert data.representative_cts(vdata) == [0, 1, 2]
    picks = data.representative_cts(vdata, limit=1)
    assert picks[0] == 0 and picks[-1] == 2 and len(picks) <= 4  # first CT of layer 0 ... the LM head


def test_link_bytes_count_each_link_once_per_record(vdata):
    """The traffic map walks the legs' routes itself; what it adds up is each record's distinct link rows, the rows
    the executor stores (multicast and reduction trees merged), byte for byte."""
    from primal_compiler.executor.transfers import expand

    rec = vdata.stream.records
    r = vdata.target.router
    tr = expand(vdata.stream, vdata.rp.topo, r.scratchpad_banks * r.scratchpad_bank_width_bits / 8)
    lo, hi = traffic.section_bounds(vdata, "decode:0")
    got = traffic.link_bytes(vdata, lo, hi)
    want = np.zeros(vdata.rp.topo.num_links)
    for i in range(lo, hi):
        links = np.unique(tr.link[tr.link_ptr[i]: tr.link_ptr[i + 1]])
        want[links] += rec["nbytes"][i]
    assert got.tobytes() == want.tobytes()
    assert (rec["op"][lo:hi] == Opcode.BCAST).any() and (rec["op"][lo:hi] == Opcode.REDUCE).any()  # trees there
    assert got[: vdata.rp.topo.d2d_base].sum() > 0 and got[vdata.rp.topo.d2d_base:].sum() > 0


def test_power_windows_cover_decode_and_the_adapter_switch(vdata):
    titles = [w[0] for w in power.windows(vdata)]
    steps = int(step_ends(vdata.stream.records[vdata.rp.section("decode:0")]).sum())
    assert titles[0] == f"decode, {steps} step{'s' if steps != 1 else ''} (decode:0)"  # as many as it shows
    assert titles[1].startswith("adapter switch")


def test_binned_static_power_matches_the_executor(vdata):
    from primal_compiler.executor.power import static_energy_j

    _, w0, w1 = power.windows(vdata)[0]
    p = power.power_series(vdata, w0, w1, bins=97)
    seconds = (w1 - w0) / vdata.clock_hz / 97
    want = sum(v.sum() for v in static_energy_j(vdata.rp.timeline, vdata.target, vdata.rp.topo.pes, w0, w1).values())
    assert p["static"].sum() * seconds == pytest.approx(want, rel=1e-6)
    inside = np.flatnonzero((vdata.rp.start >= w0) & (vdata.rp.finish <= w1))
    dyn = sum(v[inside].sum() for v in vdata.rp.energy_pj.values()) * 1e-12
    assert p["dynamic"].sum() * seconds >= dyn * (1 - 1e-9)


def test_records_json_errors_name_the_file(out_naive, tmp_path):
    import shutil

    from primal_compiler.errors import InputError
    from primal_compiler.viz.command import render_all

    bad = tmp_path / "bad"
    shutil.copytree(out_naive, bad)
    (bad / "records.json").write_text("{not json")
    with pytest.raises(InputError, match="records.json"):
        render_all(bad)
    assert not (bad / "viz").exists()
    with pytest.raises(InputError, match="nowhere"):
        render_all(tmp_path / "nowhere")


def test_a_failing_render_leaves_the_old_output(out_naive, tmp_path, monkeypatch):
    from primal_compiler.viz import breakdown
    from primal_compiler.viz.command import render_all

    dest = tmp_path / "v"
    render_all(out_naive, dest)
    before = {p.name: p.read_bytes() for p in dest.iterdir()}

    def boom(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(breakdown, "render", boom)
    with pytest.raises(RuntimeError):
        render_all(out_naive, dest, force=True)
    assert [p.name for p in tmp_path.iterdir()] == ["v"]
    assert {p.name: p.read_bytes() for p in dest.iterdir()} == before


def test_cli_parser_registers_viz(out_naive, tmp_path, capsys):
    import argparse

    from primal_compiler.viz.command import add_parser

    ap = argparse.ArgumentParser()
    add_parser(ap.add_subparsers(dest="cmd"))
    args = ap.parse_args(["viz", str(out_naive), "-o", str(tmp_path / "o"), "--max-events", "30"])
    args.func(args)
    assert "report.html" in capsys.readouterr().out
    trace = json.loads((tmp_path / "o" / "trace.json").read_text())
    assert sum(e["ph"] == "X" for e in trace["traceEvents"]) <= 30


@pytest.mark.parametrize("fmt", ["svg", "png"])
def test_two_renders_are_byte_identical(out_naive, tmp_path, fmt):
    from primal_compiler.viz.command import render_all

    a = render_all(out_naive, tmp_path / "a", fmt=fmt)
    render_all(out_naive, tmp_path / "b", fmt=fmt)
    assert "report.html" in a["files"]
    for name in a["files"]:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_the_die_map_s_colours_start_at_ambient(vdata):
    """A spread of hundredths of a kelvin between dies is drawn from ambient up, so it looks as small as it is
    (the colours spanned only the dies' own range before)."""
    from primal_compiler.viz import thermal

    lo, hi = thermal.figure(vdata).axes[0].images[0].get_clim()
    assert lo == 0.0 and hi > 0


def test_compare_puts_the_other_run_beside_every_headline_metric(rendered, out_switch, out_naive, tmp_path):
    """--compare OTHER: the page's metrics table gains OTHER's value and the ratio, metric by metric (it compared
    only the hop histogram before); two runs of different models are refused in one line."""
    import re

    from primal_compiler.api import compile_model
    from primal_compiler.compiled import write_compiled
    from primal_compiler.errors import InputError
    from primal_compiler.frontend import load_model
    from primal_compiler.target import load_primal_target
    from primal_compiler.viz.command import render_all

    page = (Path(rendered["dir"]) / "report.html").read_text()
    table = page[page.index("<h2>Metrics</h2>"):page.index("<details>")]
    assert "<th>ratio</th>" in table and str(out_naive) in table
    naive_hops = data.load(out_naive).metrics["max_hops"]
    row = re.search(r"<td>max hops \(decode, on-CT\)</td>(.*?)</tr>", table)[1]
    assert f"<td class=num>{naive_hops}</td>" in row
    other = tmp_path / "other"
    write_compiled(compile_model(load_model("tiny-mistral"), load_primal_target("primal-7nm"),
                                 "lower-tiles,blocking,zcurve-order,kv-ring{context=64},codegen"),
                   load_primal_target("primal-7nm"), other)
    with pytest.raises(InputError, match=r"--compare: compares two runs of one model: .* is tiny-llama, .* is "
                                         r"tiny-mistral"):
        render_all(out_switch, tmp_path / "viz", compare=other)
