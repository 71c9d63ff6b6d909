"""Hop histograms of every transfer leg of a program, and of a second program beside it.

Legs are the executor's (:class:`~primal_compiler.executor.transfers.Transfers`)
over the whole stream: on-CT legs by PE-mesh hops, legs between CTs by
package (die-to-die) hops; controller legs count in the package panel.
Bars are the share of legs per hop count, so programs with different leg
counts compare; the legend gives leg count, mean and max.
"""

from __future__ import annotations

import textwrap

import numpy as np

from primal_compiler.isa.opcodes import CONTROLLER
from primal_compiler.viz import style
from primal_compiler.viz.data import VizData


def leg_hops(d: VizData) -> dict[str, np.ndarray]:
    """{"mesh": PE-mesh hops of on-CT legs, "package": package hops of legs leaving their CT}."""
    tr = d.rp.transfers
    ctl = (tr.src_ct == CONTROLLER) | (tr.dst_ct == CONTROLLER)
    same = (tr.src_ct == tr.dst_ct) & ~ctl
    return {"mesh": tr.routes.mesh_hops[same], "package": tr.routes.pkg_hops[~same]}


def _label(d: VizData) -> str:
    return textwrap.fill(f"{d.out.name}/ ({d.meta.get('model')}): {d.meta.get('pipeline')}", 110)


def figure(runs: list[VizData]):
    fig = style.figure(12.0, 4.2)
    hops = [leg_hops(d) for d in runs]
    for k, kind in enumerate(("mesh", "package")):
        ax = fig.add_subplot(1, 2, k + 1)
        top = max([int(h[kind].max()) if len(h[kind]) else 0 for h in hops] + [1])
        width = 0.8 / len(runs)
        for i, (d, h) in enumerate(zip(runs, hops)):
            v = h[kind]
            share = np.bincount(v, minlength=top + 1) / max(1, len(v))
            x = np.arange(top + 1) + (i - (len(runs) - 1) / 2) * width
            stats = f"{len(v):,} legs, mean {v.mean():.2f}, max {v.max()}" if len(v) else "no legs"
            ax.bar(x, share, width=width, label=stats, color=("#1f77b4", "#ff7f0e")[i % 2])
        ax.set_xlabel("PE-mesh hops (legs within one CT)" if kind == "mesh" else
                      "package hops (legs between CTs or to the controller)")
        ax.set_ylabel("share of legs")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.legend(fontsize=7, frameon=False, loc="upper right")
    fig.suptitle("Hop histogram of every transfer leg" + (" (side by side)" if len(runs) > 1 else ""), fontsize=10)
    handles = [style.plt.Rectangle((0, 0), 1, 1, color=("#1f77b4", "#ff7f0e")[i % 2]) for i in range(len(runs))]
    fig.tight_layout(rect=(0, 0.06 + 0.05 * len(runs), 1, 1))
    fig.legend(handles, [_label(d) for d in runs], loc="lower left", fontsize=7, frameon=False)
    return fig


def render(runs: list[VizData], out, formats: tuple[str, ...]) -> list[str]:
    return style.save(figure(runs), out, "hops", formats)
