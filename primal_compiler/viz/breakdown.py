"""Energy and area breakdowns as stacked bars, PRIMAL next to the H100 baseline.

Energy per generated token by component is the decode window's
``power_breakdown_w`` divided by ``tokens_per_s`` (so the stack sums to
``energy_per_token_j``, docs/executor.md). The H100's energy per token
(board power x ITL / batch, docs/baselines.md) splits by decode time into the
base forward pass and the serial LoRA kernels. Totals are drawn on a log
scale (they differ by orders of magnitude); the stacks as shares of each
bar's total, so both stay readable. Area is PE component area x PEs x CTs.
"""

from __future__ import annotations

from primal_compiler.errors import InputError
from primal_compiler.executor.metrics import COMPONENT_KEYS
from primal_compiler.viz import style
from primal_compiler.viz.data import VizData

AREA_KEYS = ("rram", "sram", "router", "dmac", "scratchpad")


def primal_energy(d: VizData) -> dict[str, float]:
    """Joules per generated token by component."""
    m = d.metrics
    return {k: m["power_breakdown_w"].get(k, 0.0) / m["tokens_per_s"] for k in COMPONENT_KEYS}


def h100_energy(d: VizData) -> dict[str, float] | None:
    """H100 joules per token: base forward pass and LoRA kernels (None without a baseline)."""
    g = d.h100
    if not g or "error" in g:
        return None
    total = g["energy_per_token_j"]
    lora = 0.0
    try:
        from primal_compiler.baselines.h100 import gpu_costs
        from primal_compiler.ir.model_json import model_from_dict
        from primal_compiler.target import load_gpu_target

        m = d.metrics
        c = gpu_costs(model_from_dict(d.meta["model_ir"]), load_gpu_target("h100", "h100"), m["batch"], m["context"],
                      prompt=m.get("prompt_tokens"))
        lora = total * c.details["lora_overhead_s"] / c.itl_s
    except (InputError, KeyError, ZeroDivisionError):  # the split is decoration: the total is the baseline's
        lora = 0.0
    return {"h100_base": total - lora, "h100_lora": lora}


def _stack(ax, x, parts: dict[str, float], width=0.6, labels=True):
    bottom = 0.0
    for k, v in parts.items():
        if v <= 0:
            continue
        ax.bar(x, v, width=width, bottom=bottom, color=style.COMPONENT_COLORS[k], label=k if labels else None,
               edgecolor="white", linewidth=0.4)
        bottom += v
    return bottom


def _j(v: float) -> str:
    for scale, unit in ((1, "J"), (1e-3, "mJ"), (1e-6, "uJ"), (1e-9, "nJ")):
        if v >= scale:
            return f"{v / scale:.3g} {unit}"
    return f"{v / 1e-12:.3g} pJ"


def figure(d: VizData):
    fig = style.figure(13.0, 4.6)
    p = primal_energy(d)
    g = h100_energy(d)
    tot_p = sum(p.values())
    tot_g = sum(g.values()) if g else 0.0  # read only when there is a baseline
    ax = fig.add_subplot(1, 3, 1)
    names = ["PRIMAL"] + (["H100"] if g else [])
    totals = [tot_p] + ([tot_g] if g else [])
    ax.bar(range(len(names)), totals, width=0.6, color=["#1f77b4", "#444444"][: len(names)])
    for x, v in enumerate(totals):
        ax.annotate(_j(v), (x, v), ha="center", va="bottom", fontsize=8, xytext=(0, 2), textcoords="offset points")
    ax.set_yscale("log")
    ax.set_ylim(min(totals) / 5, max(totals) * 8)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names)
    ax.set_ylabel("J per generated token (log)")
    ratio = f": H100 / PRIMAL = {tot_g / tot_p:.1f}x" if g else " (no H100 baseline)"
    ax.set_title(f"energy per token, decode{ratio}", fontsize=9)
    ax = fig.add_subplot(1, 3, 2)
    _stack(ax, 0, {k: 100 * v / tot_p for k, v in p.items()})
    if g:
        _stack(ax, 1, {k: 100 * v / tot_g for k, v in g.items()})
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels([f"{n}\n{_j(v)}" for n, v in zip(names, totals)])
    ax.set_ylabel("share of energy per token (%)")
    ax.set_ylim(0, 100)
    ax.set_xlim(-0.6, len(names) + 0.9)
    ax.legend(fontsize=7, frameon=False, loc="upper right")
    ax.set_title("energy per token by component", fontsize=9)
    ax = fig.add_subplot(1, 3, 3)
    a = d.metrics["area_mm2"]
    _stack(ax, 0, {k: a[k] for k in AREA_KEYS})
    ax.set_xticks([0])
    ax.set_xticklabels([f"PRIMAL, {d.num_cts} CTs"])
    ax.set_ylabel("mm2")
    ax.set_xlim(-0.6, 1.6)
    ax.set_title(f"area by PE component: {a['total']:,.0f} mm2 "
                 f"(RRAM {100 * a['rram'] / a['total']:.0f}%)", fontsize=9)
    ax.legend(fontsize=7, frameon=False, loc="upper right")
    fig.suptitle(f"Energy and area of {d.meta.get('model')} (batch {d.metrics['batch']}, context "
                 f"{d.metrics['context']})", fontsize=10)
    fig.tight_layout()
    return fig


def render(d: VizData, out, formats: tuple[str, ...]) -> list[str]:
    return style.save(figure(d), out, "breakdown", formats)
