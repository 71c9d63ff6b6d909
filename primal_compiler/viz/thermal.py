"""The package's temperature: every CT die's steady temperature under sustained decode, and how the hottest
one warms up from ambient (``primal thermal``'s report, :mod:`primal_compiler.thermal.report`).

Sites sit where the executor's topology puts the CTs (snake order on the
package grid); an empty site of the last row is left blank. Colour is the
die's rise over ambient in kelvin, so a cool package still shows where its
heat is.
"""

from __future__ import annotations

import numpy as np

from primal_compiler.executor.metrics import decode_steady
from primal_compiler.report.collect import planned_generation
from primal_compiler.thermal.report import thermal_report
from primal_compiler.viz import style
from primal_compiler.viz.data import VizData


def figure(d: VizData):
    rep = thermal_report(d.rp, "decode", steady=decode_steady(d.rp, 0, planned_generation(d.meta)))  # as primal run
    topo = d.rp.topo
    x, y = topo.ct_xy(np.arange(topo.num_cts))
    grid = np.full((int(y.max()) + 1, topo.package_cols), np.nan)
    rise = np.array(rep["per_ct"]["die_c"]) - rep["ambient_c"]
    grid[y, x] = rise
    fig = style.figure(11.0, 4.4)
    ax = fig.add_subplot(1, 2, 1)
    # from ambient (0) up: a spread of hundredths of a kelvin between dies looks as small as it is
    im = ax.imshow(grid, cmap="inferno", origin="upper", interpolation="nearest", vmin=0.0,
                   vmax=max(float(np.nanmax(grid)), 1e-9))
    hot = rep["hottest_ct"]
    ax.plot(x[hot], y[hot], marker="o", markersize=9, markerfacecolor="none", markeredgecolor="#00bfff")
    ax.set_xticks([])
    ax.set_yticks([])
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04).set_label("die rise over ambient (K)")
    blank = " (blank: no CT)" if np.isnan(grid).any() else ""
    ax.set_title(f"die temperature, decode sustained: max {rep['die_c']['max']:.3f} \u00b0C (CT {hot}),\n"
                 f"ambient {rep['ambient_c']:g} \u00b0C, {rep['power_w']:.3g} W on {rep['num_cts']} CTs{blank}",
                 fontsize=9)
    ax = fig.add_subplot(1, 2, 2)
    t = np.array(rep["warmup"]["t_s"])
    ax.plot(t, np.array(rep["warmup"]["hottest_die_c"]) - rep["ambient_c"], color="#d62728")
    ax.set_xscale("log")
    ax.set_xlabel("time from ambient (s, log)")
    ax.set_ylabel("hottest die's rise over ambient (K)")
    tc = rep["time_constants_s"]
    ax.set_title(f"warm-up of CT {hot}: time constants {tc['fastest']:.3g} s .. {tc['slowest']:.3g} s", fontsize=9)
    fig.suptitle(f"Temperature of {d.meta.get('model')} (ADC offset {rep['adc_offset_lsb']['max']:.2f} LSB at the "
                 f"hottest die)", fontsize=10)
    fig.tight_layout()
    return fig


def render(d: VizData, out, formats: tuple[str, ...]) -> list[str]:
    return style.save(figure(d), out, "thermal", formats)
