"""A mixed-adapter batch's reprogramming timeline: per layer, when each adapter's LoRA weights are written and
when they are used.

Drawn only for a program that rewrites LoRA weights within a request (a batch on more adapters than the
SRAM-DCIM slots hold, or ``lora_residency=per-token``: a slot written twice within request 0). The window
is the first decode step of ``decode:0``: from the prefill's last ARGMAX to the step's last ARGMAX (the
``batch``-th when each pass carries one sequence, else the first). Each layer's row shows, per pass, the
span of its LoRA products (SMAC_SRAM, first start to last finish) in the colour of the adapter the slot
they read holds, and over it, hatched, the span of the CONFIG records writing that layer's slots, in the
colour of the adapter written. The adapter of a product is the one the last earlier CONFIG into its
layer's slot wrote (stream order, as the dependency tracker orders them).
"""

from __future__ import annotations

import numpy as np
from matplotlib.patches import Patch

from primal_compiler.codegen.check import last_before
from primal_compiler.isa.opcodes import ARG_ENUM_MASK, NONE16, ActFn, Flag, Opcode
from primal_compiler.report.text import human_time
from primal_compiler.viz import style
from primal_compiler.viz.data import VizData

PALETTE = ("#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#666666")


def rewrites(d: VizData) -> bool:
    """Whether the program rewrites LoRA weights within request 0: a slot of a PE written twice in its sections
    (its first load, which ``srpg`` moves into the prefill, is written once)."""
    r, names = d.stream.records, d.section_names()
    idx = np.concatenate([d.rp.section(s) for s in ("adapter:0", "prefill:0", "decode:0") if s in names])
    cfg = idx[r["op"][idx] == Opcode.CONFIG]
    key = (r["dst_ct"][cfg].astype(np.int64) << 16 | r["dst_pe"][cfg]) << 16 | r["arg"][cfg] & 0xFFFF
    return len(np.unique(key)) < len(key)


def window(d: VizData) -> tuple[int, int, int, int]:
    """(first record, end record, first cycle, end cycle) of decode:0's first step (module docstring)."""
    rp, r = d.rp, d.stream.records
    pre, dec = rp.section("prefill:0"), rp.section("decode:0")
    argmax = dec[(r["op"][dec] == Opcode.ACT) & (r["arg"][dec] == ActFn.ARGMAX)]
    embed = dec[(r["op"][dec] == Opcode.ACT) & ((r["arg"][dec] & ARG_ENUM_MASK[Opcode.ACT]) == ActFn.EMBED)]
    one = int(d.meta.get("model_ir", {}).get("hidden_size", 0))  # a pipelined step embeds one sequence a pass, ``batch`` passes
    passes = int(d.meta.get("kv", {}).get("batch", 1)) if len(embed) and int(r["count"][embed[0]]) == one else 1
    last = argmax[min(passes, len(argmax)) - 1]
    pre_end = pre[(r["op"][pre] == Opcode.ACT) & (r["arg"][pre] == ActFn.ARGMAX)]
    begin = int(rp.finish[pre_end].max()) if len(pre_end) else int(rp.start[dec].min())
    return int(dec[0]), int(last) + 1, begin, int(rp.finish[last])


def adapter_of_products(r: np.ndarray, smac: np.ndarray, cfg: np.ndarray) -> np.ndarray:
    """Per SMAC_SRAM record of ``smac``, the adapter the last earlier CONFIG of ``cfg`` into its layer and slot
    wrote (-1: none)."""
    key = lambda k: r["layer"][k].astype(np.int64) << 16 | r["arg"][k].astype(np.int64) & 0xFFFF  # noqa: E731
    at = last_before(key(cfg), cfg, key(smac), smac)
    return np.where(at >= 0, (r["arg"][cfg[np.maximum(at, 0)]] >> 16).astype(np.int64), -1)


def figure(d: VizData):
    rp, r = d.rp, d.stream.records
    lo, hi, w0, w1 = window(d)
    idx = np.arange(lo, hi)
    cfg_all = np.flatnonzero(r["op"][:hi] == Opcode.CONFIG)
    smac = idx[(r["op"][idx] == Opcode.SMAC_SRAM) & ((r["flags"][idx] & Flag.SKIPPED) == 0)]
    cfg = idx[r["op"][idx] == Opcode.CONFIG]
    owner = adapter_of_products(r, smac, cfg_all)
    passes = np.cumsum((r["op"][idx] == Opcode.ACT) & (r["arg"][idx] == ActFn.ARGMAX))
    layers = int(d.num_layers)
    scale = d.clock_hz / 1e6  # microseconds
    fig = style.figure(8.0, float(np.clip(0.18 * layers + 1.8, 2.4, 9.0)))
    ax = fig.add_subplot(1, 1, 1)
    colour = lambda a: PALETTE[int(a) % len(PALETTE)]  # noqa: E731
    pass_of = passes[smac - lo]
    layer = r["layer"][smac].astype(np.int64)
    for key in np.unique((pass_of << 16) | layer):
        sel = ((pass_of << 16) | layer) == key
        b, e = int(rp.start[smac[sel]].min()), int(rp.finish[smac[sel]].max())
        style.rects(ax, np.array([(b - w0) / scale]), np.array([(e - b) / scale]), np.array([key & 0xFFFF]) - 0.35,
                    0.7, colour(owner[sel][0]))
    written = set()
    cl = r["layer"][cfg].astype(np.int64)
    adapter = (r["arg"][cfg] >> 16).astype(np.int64)
    for key in np.unique(cl[cl != NONE16] << 20 | adapter[cl != NONE16]):
        sel = (cl << 20 | adapter) == key
        b, e = int(rp.start[cfg[sel]].min()), int(rp.finish[cfg[sel]].max())
        a = int(key & 0xFFFFF)
        written.add(a)
        ax.add_patch(_hatched((b - w0) / scale, int(key >> 20), (e - b) / scale, colour(a)))
    ax.set_xlim(0, (w1 - w0) / scale)
    ax.set_ylim(layers - 0.5, -0.5)
    ax.set_xlabel("time in the first decode step (us)")
    ax.set_ylabel("layer")
    used = sorted(set(owner.tolist()) | written)
    handles = [Patch(color=colour(a), label=f"adapter {a}") for a in used if a >= 0]
    handles.append(Patch(facecolor="white", edgecolor="black", hatch="////", label="CONFIG (writing)"))
    ax.legend(handles=handles, fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.set_title(f"{d.meta.get('model')}: LoRA products per pass (solid) and adapter writes (hatched) over the "
                 f"first decode step, {human_time((w1 - w0) / d.clock_hz)}; {len(cfg):,} CONFIG records",
                 fontsize=9)
    return fig


def _hatched(x: float, layer: int, width: float, colour: str):
    from matplotlib.patches import Rectangle

    return Rectangle((x, layer - 0.45), max(width, 1e-9), 0.9, facecolor="none", edgecolor=colour, hatch="////",
                     linewidth=0.6)


def render(d: VizData, out, formats: tuple[str, ...]) -> list[str]:
    """The picture's files, or none for a program that keeps its adapters resident (module docstring)."""
    if not rewrites(d) or "decode:0" not in d.section_names():
        return []
    return style.save(figure(d), out, "adapters", formats)
