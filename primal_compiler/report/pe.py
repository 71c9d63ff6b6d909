"""One PE of a target priced from its constants alone, and two targets' PEs compared.

What the seed's PE-level facts are compared with (``docs/reproduce.md``,
"PE level"): the area and power shares of its Table IV, and the all-digital
comparison (89% less static power, 8.7x compute density).

- **Area**: the target's ``[area]`` per component; its share of the PE.
- **Static power**: every power domain's leakage in the active state and in a
  gated CT, the RRAM periphery's bias with it
  (:func:`primal_compiler.executor.power.domain_static_w`, the rule the replay
  integrates, at the reference temperature), SRAM-DCIM with every macro powered.
- **Peak power**: every unit of the PE busy every cycle with its own work,
  priced by the executor's cost rules, plus its domain's active static power (the RRAM
  periphery's bias with its leakage): the
  base array running back-to-back full-tile MVMs
  (:func:`~primal_compiler.executor.costs.base_mvm`), the SRAM-DCIM macro
  back-to-back full-macro MVMs (:func:`~primal_compiler.executor.costs.lora_mvm_pj`),
  the DMAC lanes one attention MAC each per cycle, each reading one KV element
  from the scratchpad (the DMAC rule), and the router forwarding one flit per
  cycle over one hop (the link rule). Scratchpad leakage is counted with the
  router's domain.
- **Density** of the base array: MACs per second per mm2 (compute) and base
  weight bits per mm2 (storage).
"""

from __future__ import annotations

from primal_compiler.executor import power
from primal_compiler.executor.costs import base_mvm, lora_mvm_pj
from primal_compiler.target.spec import PrimalTarget

AREA = ("rram", "sram", "router", "dmac", "scratchpad")


def pe_figures(target: PrimalTarget) -> dict:
    """Area (um2 and shares), static power (uW, active and gated, by domain), peak power (mW, by unit and
    shares) and the base array's densities of one PE of ``target``."""
    t = target
    area = {k: float(getattr(t.area, f"{k}_um2")) for k in AREA}
    leak = power.domain_static_w(t)
    static = {k: float(w[power.ACTIVE]) * 1e6 for k, w in leak.items()}
    gated = {k: float(w[power.GATED]) * 1e6 for k, w in leak.items()}
    base_cols = t.rram.cols // t.rram.cells_per_weight
    cycles, pj, component = base_mvm(t, t.rram.rows, base_cols)
    sram_pj = float(lora_mvm_pj(t, t.sram.rows, t.sram.weights_per_row))
    r = t.router
    dmac_pj = r.dmac_macs_per_cycle * (r.dmac_energy_pj_per_op + r.dmac_bits * r.scratchpad_energy_pj_per_bit)
    ghz = t.system.clock_hz * 1e-9  # pJ per cycle x GHz = mW
    base = "base_dcim" if t.digital_base else "rram_adc"
    peak = {base: float(pj) / cycles * ghz + static[base] * 1e-3,
            "sram_dcim": sram_pj / t.sram.mac_latency_cycles * ghz + static["sram_dcim"] * 1e-3,
            "router_dmac": (dmac_pj + r.flit_bits * r.energy_pj_per_bit_hop) * ghz
            + (static["router_dmac"] + static["scratchpad"]) * 1e-3}
    macs_per_s = t.rram.rows * base_cols / cycles * t.system.clock_hz
    area_mm2 = area["rram"] * 1e-6
    return {"area_um2": area, "area_share": _shares(area),
            "static_uw": static, "static_gated_uw": gated, "static_total_uw": sum(static.values()),
            "peak_mw": peak, "peak_share": _shares(peak), "peak_total_mw": sum(peak.values()),
            "base_macs_per_s_per_mm2": macs_per_s / area_mm2,
            "base_weight_bits_per_mm2": t.rram.weights_per_macro * t.rram.weight_bits / area_mm2}


def compare(target: PrimalTarget, reference: PrimalTarget) -> dict:
    """``target``'s PE against ``reference``'s (the all-digital PE): static power saved (active state, and in a
    gated CT), and the base array's compute and storage density ratios."""
    a, b = pe_figures(target), pe_figures(reference)
    gated = sum(a["static_gated_uw"].values()) / sum(b["static_gated_uw"].values())
    return {"static_saving": 1 - a["static_total_uw"] / b["static_total_uw"], "static_saving_gated": 1 - gated,
            "compute_density_ratio": a["base_macs_per_s_per_mm2"] / b["base_macs_per_s_per_mm2"],
            "storage_density_ratio": a["base_weight_bits_per_mm2"] / b["base_weight_bits_per_mm2"],
            "target": a, "reference": b}


def _shares(parts: dict[str, float]) -> dict[str, float]:
    total = sum(parts.values())
    return {k: v / total for k, v in parts.items()}
