"""The PRIMAL accelerator as a hardware target: one frozen dataclass per TOML table.

Each TOML table of a target file maps to one nested frozen dataclass; each key
to one field. A field's metadata carries its unit, a one-line meaning and its
value rules (``ge``/``gt``/``le``/``lt``, ``choices``, ``multiple_of``); the
loader (:mod:`primal_compiler.target.loader`) checks them generically; the field machinery is
in :mod:`.table`, the GPU baseline targets in :mod:`.gpu`. Rules
that tie several fields together live in each table's ``_problems`` method.

Units are in the key names (``_pj``, ``_cycles``, ``_bytes``, ``_hz``, ``_uw``,
``_um2``, ``_bits``, ``_w``); plain counts (``rows``, ``banks``, ``ports``) and
fractions carry none.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from primal_compiler.target.table import (
    MAX_BYTES_PER_S, MAX_CTS, MAX_CYCLES, MAX_MACRO_SIDE, MAX_MESH_SIDE, MAX_PES, MAX_RATE_HZ,
    MAX_SCRATCHPAD_BYTES, SCHEMA_VERSION, Problem, Table, TargetBase,
)
from primal_compiler.target.table import internal_field as _internal
from primal_compiler.target.table import ranges_field
from primal_compiler.target.table import spec_field as _f
from primal_compiler.target.gpu import GpuTarget


# --------------------------------------------------------------------------- PRIMAL


@dataclass(frozen=True)
class SystemSpec(Table):
    """Package level: clock, number and arrangement of compute tiles (CTs), the NMC controller."""

    technology_nm: int = _f("nm", "process node the energy/area figures refer to", ge=1, le=1000)
    clock_hz: int = _f("Hz", "clock of PEs, routers and NMC", gt=0, le=MAX_RATE_HZ)
    num_cts: int = _f("count", "compute tiles in the package; 0 = derived from the model (smallest count that holds every base weight)", ge=0, le=MAX_CTS)
    ct_grid_cols: int = _f("count", "columns of the package-level CT mesh; 0 = near-square grid derived from the CT count", ge=0, le=MAX_CTS)
    d2d_topology: str = _f("enum", "topology of the die-to-die network between CTs", choices=("mesh",))
    control: str = _f("enum", "who dispatches records: a sequencer per CT running its own part of the stream (distributed), or the NMC alone (central)", choices=("distributed", "central"))
    nmc_issue_cycles: int = _f("cycles", "cycles the NMC's sequencer takes to dispatch one instruction record (every record under central control, the controller's own under distributed)", ge=1, le=MAX_CYCLES)
    nmc_issue_energy_pj: float = _f("pJ", "energy of the NMC fetching, decoding and issuing one instruction record", ge=0)
    base_weight_array: str = _f("enum", "what holds a PE's frozen base weights: its RRAM-ACIM macro (PRIMAL), or SRAM-DCIM macros enough for the same tile (the all-digital reference PE; [rram] then gives only the tile's shape)", choices=("rram-acim", "sram-dcim"))


@dataclass(frozen=True)
class CtSpec(Table):
    """One compute tile: a 2D mesh of PEs (the IPCN)."""

    mesh_rows: int = _f("count", "PE rows of the CT mesh", ge=1, le=MAX_MESH_SIDE)
    mesh_cols: int = _f("count", "PE columns of the CT mesh", ge=1, le=MAX_MESH_SIDE)
    routing: str = _f("enum", "dimension-order routing on the PE mesh", choices=("xy", "yx"))
    sequencer_issue_cycles: int = _f("cycles", "cycles the CT's sequencer takes to dispatch one record from its instruction buffer (distributed control)", ge=1, le=MAX_CYCLES)
    instruction_buffer_bytes: int = _f("bytes", "the CT's local instruction buffer: holds the CT's records of one request (adapter load, prefill, one decode step), loaded by the NMC", ge=32, le=1 << 40)

    @property
    def pes(self) -> int:
        """PEs per CT."""
        return self.mesh_rows * self.mesh_cols


@dataclass(frozen=True)
class RramSpec(Table):
    """RRAM-ACIM macro: analog crossbar holding the frozen 4-bit base weights, SAR ADCs on the columns."""

    rows: int = _f("count", "crossbar rows (word lines = input vector length)", ge=1, le=MAX_MACRO_SIDE)
    cols: int = _f("count", "crossbar columns (bit lines)", ge=1, le=MAX_MACRO_SIDE)
    bits_per_cell: int = _f("bits", "bits stored per RRAM cell (conductance levels = 2^bits)", ge=1, le=8)
    weight_bits: int = _f("bits", "bits per base weight; a weight spans weight_bits / bits_per_cell adjacent columns", ge=1, le=16)
    input_bits: int = _f("bits", "activation bits fed to the word lines per MVM", ge=1, le=16)
    input_mode: str = _f("enum", "how inputs are applied: 'bit-serial' (one bit per read pulse) or 'dac' (dac_bits per pulse)", choices=("bit-serial", "dac"))
    dac_bits: int = _f("bits", "input bits applied per read pulse (1 in bit-serial mode)", ge=1, le=8)
    rows_active_per_read: int = _f("count", "word lines driven together in one read pulse (a row group)", ge=1, le=MAX_MACRO_SIDE)
    adcs_per_macro: int = _f("count", "SAR ADCs per macro; each serves cols / adcs_per_macro columns through a mux", ge=1, le=MAX_MACRO_SIDE)
    adc_bits: int = _f("bits", "ADC resolution", ge=1, le=16)
    adc_sample_rate_hz: int = _f("Hz", "conversions per second of one ADC", gt=0, le=MAX_RATE_HZ)
    adc_power_uw: float = _f("uW", "power of one ADC converting at adc_sample_rate_hz", gt=0)
    adc_energy_pj_per_conversion: float = _f("pJ", "energy of one ADC conversion (= adc_power_uw / adc_sample_rate_hz)", gt=0)
    adc_latency_cycles: int = _f("cycles", "clock cycles per conversion of one ADC", ge=1, le=MAX_CYCLES)
    array_read_energy_pj: float = _f("pJ", "crossbar energy per cell per read pulse (one 1-bit-input x weight MAC slice)", gt=0)
    row_driver_energy_pj: float = _f("pJ", "word-line driver energy per activated row per read pulse", ge=0)
    shift_add_energy_pj_per_conversion: float = _f("pJ", "digital shift-and-add of one ADC result into the column accumulator", ge=0)
    mvm_drain_cycles: int = _f("cycles", "cycles after an MVM's last conversion until its result leaves the column accumulators (mvm_latency_cycles = the ADC bound + this)", ge=0, le=MAX_CYCLES)
    leakage_uw: float = _f("uW", "static power of the macro periphery (ADCs, drivers, sample-and-hold); cells are non-volatile", ge=0)
    idle_bias_uw: float = _f("uW", "bias power of the macro's always-on analog periphery (references) while its CT is powered, converting or not; off with the periphery when gated (power_gating.gate_rram_periphery); not scaled with temperature", ge=0)

    @property
    def cells_per_weight(self) -> int:
        return self.weight_bits // self.bits_per_cell

    @property
    def weights_per_macro(self) -> int:
        """Base weights one macro holds (rows x cols / cells_per_weight)."""
        return self.rows * (self.cols // self.cells_per_weight)

    @property
    def pulses_per_mvm(self) -> int:
        """Read pulses of one MVM: input slices x row groups."""
        return (self.input_bits // self.dac_bits) * (self.rows // self.rows_active_per_read)

    @property
    def adc_bound_cycles(self) -> int:
        """Lower bound of an MVM set by the ADCs: every pulse converts every column."""
        return self.pulses_per_mvm * (self.cols // self.adcs_per_macro) * self.adc_latency_cycles

    @property
    def mvm_latency_cycles(self) -> int:
        """Cycles of one full MVM (all input bits, all row groups, all columns): the ADC bound plus the
        accumulator drain, derived so that the MVM time always follows ``adcs_per_macro``."""
        return self.adc_bound_cycles + self.mvm_drain_cycles

    def _problems(self) -> Iterator[Problem]:
        if self.weight_bits % self.bits_per_cell:
            yield "weight_bits", f"{self.weight_bits} is not a multiple of bits_per_cell {self.bits_per_cell}"
        elif self.cols % self.cells_per_weight:
            yield "cols", f"{self.cols} columns do not hold whole {self.weight_bits}-bit weights of {self.cells_per_weight} cells"
        if self.input_mode == "bit-serial" and self.dac_bits != 1:
            yield "dac_bits", f"must be 1 in bit-serial input mode, got {self.dac_bits}"
        if self.input_mode == "dac" and self.dac_bits < 2:
            yield "dac_bits", "must be at least 2 in dac input mode (use input_mode = 'bit-serial' for 1)"
        if self.input_bits % self.dac_bits:
            yield "input_bits", f"{self.input_bits} is not a multiple of dac_bits {self.dac_bits}"
        if self.rows_active_per_read > self.rows or self.rows % self.rows_active_per_read:
            yield "rows_active_per_read", f"{self.rows_active_per_read} does not divide rows {self.rows}"
        if self.adcs_per_macro > self.cols or self.cols % self.adcs_per_macro:
            yield "adcs_per_macro", f"{self.adcs_per_macro} does not divide cols {self.cols}"
        implied = self.adc_power_uw * 1e6 / self.adc_sample_rate_hz  # uW / (1/s) -> pJ
        if not math.isclose(self.adc_energy_pj_per_conversion, implied, rel_tol=0.01):
            yield "adc_energy_pj_per_conversion", (
                f"{self.adc_energy_pj_per_conversion} pJ disagrees with adc_power_uw / adc_sample_rate_hz"
                f" = {implied:.6g} pJ (must match within 1%)"
            )
        if (self.weight_bits % self.bits_per_cell or self.input_bits % self.dac_bits
                or self.rows % self.rows_active_per_read or self.cols % self.adcs_per_macro):
            return
        if self.mvm_latency_cycles > MAX_CYCLES:
            yield "mvm_drain_cycles", (f"the MVM takes {self.mvm_latency_cycles:,} cycles (ADC bound "
                                       f"{self.adc_bound_cycles:,} + drain), more than the {MAX_CYCLES:,} of any operation")


@dataclass(frozen=True)
class SramSpec(Table):
    """SRAM-DCIM macro: 6T cells with a carry-save adder tree holding 8-bit LoRA weights."""

    rows: int = _f("count", "macro rows (input vector length)", ge=1, le=MAX_MACRO_SIDE)
    cols_bits: int = _f("bits", "bit columns of the macro (256x64 bits = a 256x8 slice of 8-bit weights)", ge=1, le=MAX_MACRO_SIDE)
    weight_bits: int = _f("bits", "bits per LoRA weight", ge=1, le=16)
    input_bits: int = _f("bits", "activation bits, fed bit-serially", ge=1, le=16)
    banks: int = _f("count", "column banks that can be reprogrammed and gated independently", ge=1, le=MAX_MACRO_SIDE)
    columns_per_bank: int = _f("count", "bit columns per bank", ge=1, le=MAX_MACRO_SIDE)
    subarrays_per_bank: int = _f("count", "subarrays per bank (column-granular gating)", ge=1, le=MAX_MACRO_SIDE)
    mac_latency_cycles: int = _f("cycles", "cycles of one MVM over the whole macro (bit-serial input + adder-tree pipeline)", ge=1, le=MAX_CYCLES)
    mac_energy_pj: float = _f("pJ", "energy per weight_bits x input_bits MAC, adder tree included", gt=0)
    write_energy_pj_per_bit: float = _f("pJ", "energy to write one weight bit (LoRA reconfiguration)", gt=0)
    reconfig_cycles: int = _f("cycles", "cycles to rewrite the macro's LoRA weights (data already at the PE)", ge=1, le=MAX_CYCLES)
    leakage_uw: float = _f("uW", "static power of the macro (cells + adder trees); SRAM is retained when its CT is gated", ge=0)

    @property
    def weights_per_row(self) -> int:
        return self.cols_bits // self.weight_bits

    @property
    def weights_per_macro(self) -> int:
        return self.rows * self.weights_per_row

    @property
    def bits(self) -> int:
        return self.rows * self.cols_bits

    def _problems(self) -> Iterator[Problem]:
        if self.cols_bits % self.weight_bits:
            yield "cols_bits", f"{self.cols_bits} is not a multiple of weight_bits {self.weight_bits}"
        if self.banks * self.columns_per_bank != self.cols_bits:
            yield "columns_per_bank", f"banks x columns_per_bank = {self.banks * self.columns_per_bank} != cols_bits {self.cols_bits}"
        if self.columns_per_bank % self.subarrays_per_bank:
            yield "subarrays_per_bank", f"{self.subarrays_per_bank} does not divide columns_per_bank {self.columns_per_bank}"
        if self.mac_latency_cycles < self.input_bits:
            yield "mac_latency_cycles", f"{self.mac_latency_cycles} is below input_bits {self.input_bits} (one input bit per cycle)"


@dataclass(frozen=True)
class RouterSpec(Table):
    """Compute router of a PE: 6 AXI-Stream ports, DMAC units, a scratchpad for KV cache and intermediates."""

    ports: int = _f("count", "AXI-Stream ports (4 mesh directions + local)", ge=5, le=64)
    flit_bits: int = _f("bits", "flit width", ge=8, multiple_of=8, le=MAX_MACRO_SIDE)
    link_bits_per_cycle: int = _f("bits", "payload bits a mesh link carries per cycle and direction", ge=1, le=MAX_MACRO_SIDE)
    hop_latency_cycles: int = _f("cycles", "cycles per hop (router pipeline + link traversal)", ge=1, le=MAX_CYCLES)
    injection_cycles: int = _f("cycles", "a PE's injection channel into its router, before the first hop of every transfer it sends (latency; how many transfers inject at once is injection_ports)", ge=0, le=MAX_CYCLES)
    ejection_cycles: int = _f("cycles", "the router's ejection channel into its PE, after the last hop of every transfer it receives", ge=0, le=MAX_CYCLES)
    injection_ports: int = _f("count", "local ports that carry a PE's transfers into its router: a transfer takes one from its head's first PE-mesh hop until its tail has left, so a PE injects at most this many links' worth a cycle", ge=1, le=MAX_MACRO_SIDE)
    ejection_ports: int = _f("count", "local ports that carry transfers from the router into its PE: a transfer takes one from its head's arrival until its tail is delivered, so a PE receives at most this many links' worth a cycle", ge=1, le=MAX_MACRO_SIDE)
    buffer_flits: int = _f("flits", "input buffer of each PE-mesh link at the router it enters (cut-through: a waiting packet sits there; full, it holds back the link)", ge=1, le=MAX_SCRATCHPAD_BYTES)
    link_schedule: str = _f("enum", "how transfers share links: hop by hop, each taking a link's earliest idle window and waiting in the router's buffer until then (cut-through), or the whole route at once in stream order per link (in-order, the executor before cut-through)", choices=("cut-through", "in-order"))
    arbitration: str = _f("enum", "which waiting head gets a link when it frees, under cut-through: the oldest transfer (age: the earliest start, then stream order) or the earliest in the stream (program-order)", choices=("age", "program-order"))
    energy_pj_per_bit_hop: float = _f("pJ", "energy to move one bit across one router and one PE-to-PE link", gt=0)
    dmac_units: int = _f("count", "dynamic MAC units (activation x activation, accumulation, activation functions)", ge=1, le=MAX_MACRO_SIDE)
    dmac_ops_per_cycle: int = _f("count", "MACs per cycle of one DMAC unit", ge=1, le=MAX_MACRO_SIDE)
    dmac_bits: int = _f("bits", "operand width of the DMAC units", ge=1, le=32)
    dmac_lane_buffer_words: int = _f("count", "scratchpad bank words a DMAC lane holds or has asked for at once (its operand buffer: fetching ahead spreads the lanes' reads over more banks)", ge=1, le=MAX_MACRO_SIDE)
    dmac_energy_pj_per_op: float = _f("pJ", "energy of one DMAC multiply-accumulate", gt=0)
    scratchpad_bytes: int = _f("bytes", "scratchpad capacity (KV cache slices, intermediates)", ge=1, le=MAX_SCRATCHPAD_BYTES)
    scratchpad_banks: int = _f("count", "scratchpad banks (adjacent tokens' K/V interleaved over them)", ge=1, le=MAX_MACRO_SIDE)
    scratchpad_bank_width_bits: int = _f("bits", "bits one bank reads or writes per cycle", ge=8, multiple_of=8, le=MAX_MACRO_SIDE)
    scratchpad_energy_pj_per_bit: float = _f("pJ", "energy to read or write one scratchpad bit", gt=0)
    leakage_uw: float = _f("uW", "static power of router logic and DMAC units (gated with the interconnect)", ge=0)
    scratchpad_leakage_uw: float = _f("uW", "static power of the scratchpad (retained when the CT is gated)", ge=0)

    @property
    def buffer_link_cycles(self) -> int:
        """Cycles of link traffic one input buffer holds (its flits at the link's flits per cycle)."""
        return max(1, self.buffer_flits * self.flit_bits // self.link_bits_per_cycle)

    @property
    def dmac_macs_per_cycle(self) -> int:
        """MACs per cycle of all DMAC units of one router."""
        return self.dmac_units * self.dmac_ops_per_cycle

    def _problems(self) -> Iterator[Problem]:
        if self.link_bits_per_cycle % self.flit_bits:
            yield "flit_bits", f"{self.flit_bits} does not divide link_bits_per_cycle {self.link_bits_per_cycle}"
        if self.scratchpad_bytes % self.scratchpad_banks:
            yield "scratchpad_banks", f"{self.scratchpad_banks} does not divide scratchpad_bytes {self.scratchpad_bytes}"
        local = self.ports - 4
        for name, n in (("injection_ports", self.injection_ports), ("ejection_ports", self.ejection_ports)):
            if n > local:
                yield name, f"{n} is more than the router's {local} local ports (ports {self.ports} - 4 mesh directions)"


@dataclass(frozen=True)
class ActSpec(Table):
    """Work of the router's activation path: DMAC operations per element of each ``ACT`` function."""

    embed_ops_per_element: int = _f("count", "controller: embedding-table read and FP16 conversion per element", ge=1, le=1024)
    rmsnorm_ops_per_element: int = _f("count", "a shard's normalization: scale by 1/rms, multiply by the norm weight", ge=1, le=1024)
    layernorm_ops_per_element: int = _f("count", "a shard's normalization: subtract the mean, scale, affine", ge=1, le=1024)
    silu_ops_per_element: int = _f("count", "x * sigmoid(x) by piecewise approximation", ge=1, le=1024)
    gelu_ops_per_element: int = _f("count", "tanh approximation of GELU", ge=1, le=1024)
    relu_ops_per_element: int = _f("count", "max(x, 0)", ge=1, le=1024)
    relu_squared_ops_per_element: int = _f("count", "max(x, 0)^2: a compare and a multiply", ge=1, le=1024)
    clip_ops_per_element: int = _f("count", "a q, k or v element clamped to [-clip, clip]: two compares", ge=1, le=1024)
    qk_norm_ops_per_element: int = _f("count", "a q or k element's head RMSNorm: its square summed, scaled twice", ge=1, le=1024)
    swiglu_ops_per_element: int = _f("count", "silu(gate) * up", ge=1, le=1024)
    rope_ops_per_element: int = _f("count", "rotation: two multiplies and an add against a sin/cos table", ge=1, le=1024)
    softmax_ops_per_element: int = _f("count", "max, exp, sum, divide", ge=1, le=1024)
    attn_softcap_ops_per_element: int = _f("count", "an attention score soft-capped (divide, tanh, multiply), on the QK DMACs", ge=1, le=1024)
    residual_add_ops_per_element: int = _f("count", "one add", ge=1, le=1024)
    argmax_ops_per_element: int = _f("count", "controller: one compare per logit", ge=1, le=1024)
    bias_ops_per_element: int = _f("count", "add the projection bias to a column block", ge=1, le=1024)
    dora_ops_per_element: int = _f("count", "scale a column block by its DoRA adapter's column scale", ge=1, le=1024)
    norm_stats_ops_per_element: int = _f("count", "a hub shard's LayerNorm statistics: sum and sum of squares", ge=1, le=1024)
    rms_stats_ops_per_element: int = _f("count", "a hub shard's RMSNorm statistics: sum of squares", ge=1, le=1024)
    logit_cap_ops_per_element: int = _f("count", "controller: a logit times the model's logit_scale, soft-capped (divide, tanh, multiply)", ge=1, le=1024)


@dataclass(frozen=True)
class D2dSpec(Table):
    """Die-to-die link between neighbouring CTs of the package mesh (per direction)."""

    bandwidth_bytes_per_s: int = _f("bytes/s", "payload bandwidth of one CT-to-CT link per direction", gt=0, le=MAX_BYTES_PER_S)
    latency_cycles: int = _f("cycles", "one-way latency of a CT-to-CT link (PHY + adapter)", ge=1, le=MAX_CYCLES)
    energy_pj_per_bit: float = _f("pJ", "energy per bit crossing one CT-to-CT link", gt=0)
    ports_per_ct: int = _f("count", "PEs where a CT's mesh meets its package router, along its north edge (row 0) at "
                           "columns k x mesh_cols / ports; a transfer between CTs leaves and enters each CT's mesh "
                           "at the port nearest its PE", ge=1, le=MAX_MESH_SIDE)


@dataclass(frozen=True)
class PowerGatingSpec(Table):
    """Per-CT power states (SRPG): what a gated CT switches off, and what waking it costs."""

    gate_rram_periphery: bool = _f("bool", "a gated CT switches off its RRAM-ACIM periphery (ADCs, drivers)")
    gate_router: bool = _f("bool", "a gated CT switches off router logic and DMAC units (the interconnect)")
    retain_sram: bool = _f("bool", "SRAM-DCIM stays powered in a gated CT and keeps its LoRA weights")
    gate_unused_sram: bool = _f("bool", "an SRAM-DCIM macro that holds no LoRA weight of the program is switched off in every state (a header per macro)")
    retain_scratchpad: bool = _f("bool", "scratchpads stay powered in a gated CT and keep their KV-cache slices")
    gate_unused_scratchpad: bool = _f("bool", "a gated CT switches off the scratchpads that hold no KV chunk and no buffer live across the gated window (with retain_scratchpad, only those holding data are kept)")
    gated_leakage_fraction: float = _f("fraction", "residual leakage of a switched-off domain, as a fraction of its leakage", ge=0, le=1)
    retained_leakage_fraction: float = _f("fraction", "leakage of a retained domain while gated, as a fraction of its active leakage", ge=0, le=1)
    wakeup_cycles: int = _f("cycles", "cycles from PG_ON until the CT can compute", ge=0, le=MAX_CYCLES)
    wakeup_energy_pj: float = _f("pJ", "energy to wake one whole CT (recharging its gated rails)", ge=0)


@dataclass(frozen=True)
class AreaSpec(Table):
    """Area of one PE by component."""

    rram_um2: float = _f("um2", "the base-weight array: the RRAM-ACIM macro (crossbar, ADCs, drivers, analog routing), or an all-digital PE's base SRAM-DCIM macros", gt=0)
    sram_um2: float = _f("um2", "SRAM-DCIM macro: cells and adder trees", gt=0)
    router_um2: float = _f("um2", "router logic: ports, buffers, crossbar, control", gt=0)
    dmac_um2: float = _f("um2", "the router's DMAC units", gt=0)
    scratchpad_um2: float = _f("um2", "the router's scratchpad SRAM", gt=0)

    @property
    def pe_um2(self) -> float:
        return self.rram_um2 + self.sram_um2 + self.router_um2 + self.dmac_um2 + self.scratchpad_um2


@dataclass(frozen=True)
class ThermalSpec(Table):
    """The package's heat path (a compact RC model per CT site, docs/thermal.md) and the ADC's drift with it."""

    ambient_c: float = _f("degC", "air temperature at the heat sink's fins", ge=-40, le=125)
    die_thickness_um: float = _f("um", "thickness of a CT die (silicon)", gt=0, le=10_000)
    die_conductivity_w_per_m_k: float = _f("W/(m K)", "thermal conductivity of the die's silicon", gt=0, le=10_000)
    die_heat_capacity_j_per_m3_k: float = _f("J/(m3 K)", "volumetric heat capacity of the die's silicon", gt=0, le=1e8)
    interface_thickness_um: float = _f("um", "thermal interface material between each die and the spreader", gt=0, le=10_000)
    interface_conductivity_w_per_m_k: float = _f("W/(m K)", "thermal conductivity of the interface material", gt=0, le=10_000)
    plate_thickness_um: float = _f("um", "copper over the dies: heat spreader plus heat-sink base, one plate over the package", gt=0, le=100_000)
    plate_conductivity_w_per_m_k: float = _f("W/(m K)", "thermal conductivity of the plate", gt=0, le=10_000)
    plate_heat_capacity_j_per_m3_k: float = _f("J/(m3 K)", "volumetric heat capacity of the plate", gt=0, le=1e8)
    convection_k_mm2_per_w: float = _f("K mm2/W", "fins-to-air resistance of the heat sink per mm2 of package it covers", gt=0, le=1e9)
    convection_capacity_j_per_k_mm2: float = _f("J/(K mm2)", "heat capacity of the fins per mm2 of package", ge=0, le=1e3)
    die_gap_um: float = _f("um", "spacing between neighbouring CT dies on the package", ge=0, le=100_000)
    adc_offset_lsb_per_k: float = _f("LSB/K", "growth of every SAR ADC's offset per kelvin above its calibration temperature", ge=0, le=10)
    adc_calibration_c: float = _f("degC", "temperature at which the ADC offsets are trimmed to zero", ge=-40, le=125)
    model_min_c: float = _f("degC", "lowest die temperature the drift model holds for", ge=-273, le=500)
    model_max_c: float = _f("degC", "highest die temperature the drift and leakage models hold for", ge=-273, le=500)
    leakage_temperature: str = _f("enum", "at which temperature every leakage_uw key counts: each CT die's steady temperature under the replay's mean power (die), or the temperature the keys are stated at (reference)", choices=("die", "reference"))
    leakage_reference_c: float = _f("degC", "temperature at which the target's leakage_uw keys are stated", ge=-273, le=500)
    leakage_doubling_k: float = _f("K", "kelvins over which the devices' leakage doubles (leakage x 2^((T - leakage_reference_c) / this) at die temperature T)", gt=0, le=1000)

    def _problems(self) -> Iterator[Problem]:
        if self.model_min_c >= self.model_max_c:
            yield "model_max_c", f"{self.model_max_c:g} must be above model_min_c ({self.model_min_c:g})"
        for key in ("ambient_c", "adc_calibration_c", "leakage_reference_c"):
            value = getattr(self, key)
            if not self.model_min_c <= value <= self.model_max_c:
                yield key, (f"{value:g} is outside the drift model's range {self.model_min_c:g}.."
                            f"{self.model_max_c:g} degC (model_min_c, model_max_c)")


@dataclass(frozen=True)
class PrimalTarget(TargetBase):
    """A PRIMAL accelerator: system, CT, the PE's macros and router, links, power gating, area."""

    schema_version: int = _f("count", "target file format version", choices=(SCHEMA_VERSION,))
    name: str = _f("text", "target name (bundled targets: the file stem)")
    description: str = _f("text", "one-line description")
    kind: str = _f("enum", "target family", choices=("primal",))
    system: SystemSpec = _f("table", "package level")
    ct: CtSpec = _f("table", "compute tile")
    rram: RramSpec = _f("table", "RRAM-ACIM macro")
    sram: SramSpec = _f("table", "SRAM-DCIM macro")
    router: RouterSpec = _f("table", "compute router")
    act: ActSpec = _f("table", "activation functions on the router's DMAC units")
    d2d: D2dSpec = _f("table", "die-to-die links")
    power_gating: PowerGatingSpec = _f("table", "power states")
    area: AreaSpec = _f("table", "PE area")
    thermal: ThermalSpec = _f("table", "package heat path and ADC drift")
    source: str = _internal("file the target was loaded from (not part of the hash)")
    ranges: dict[str, tuple[float, float]] = ranges_field()

    @property
    def digital_base(self) -> bool:
        """Base weights sit in SRAM-DCIM macros (the all-digital reference PE), not in an RRAM-ACIM crossbar."""
        return self.system.base_weight_array == "sram-dcim"

    @property
    def base_sram_macros(self) -> int:
        """SRAM-DCIM macros per PE holding base weights: enough bits for one RRAM tile's weights
        (``weights_per_macro x weight_bits``) when :attr:`digital_base`, else 0."""
        if not self.digital_base:
            return 0
        return -(-self.rram.weights_per_macro * self.rram.weight_bits // self.sram.bits)

    def _problems(self) -> Iterator[Problem]:
        pes = self.system.num_cts * self.ct.pes
        if pes > MAX_PES:
            yield "system.num_cts", (f"{self.system.num_cts} CTs x {self.ct.pes} PEs = {pes:,} PEs exceeds the "
                                     f"package limit of {MAX_PES:,} PEs")
        base = self.base_sram_macros * self.area.sram_um2
        if self.digital_base and not math.isclose(self.area.rram_um2, base, rel_tol=1e-6):
            yield "area.rram_um2", (f"{self.area.rram_um2:g} is not the all-digital base array's {self.base_sram_macros}"
                                    f" SRAM-DCIM macros x area.sram_um2 = {base:g}")
        if self.d2d.ports_per_ct > self.ct.mesh_cols:
            yield "d2d.ports_per_ct", (f"{self.d2d.ports_per_ct} ports do not fit the {self.ct.mesh_cols} PEs of a "
                                       "CT's north edge (ct.mesh_cols)")
        need = -(-self.system.clock_hz // self.rram.adc_sample_rate_hz)  # ceil
        if self.rram.adc_latency_cycles < need:
            yield "rram.adc_latency_cycles", (
                f"{self.rram.adc_latency_cycles} is too short: an ADC at {self.rram.adc_sample_rate_hz} Hz"
                f" needs {need} cycles of the {self.system.clock_hz} Hz clock per conversion"
            )


# --------------------------------------------------------------------------- GPU


Target = PrimalTarget | GpuTarget

#: Target class by the ``kind`` key of a target file.
KINDS: dict[str, type[PrimalTarget] | type[GpuTarget]] = {"primal": PrimalTarget, "gpu": GpuTarget}
