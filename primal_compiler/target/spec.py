"""Hardware targets as frozen dataclasses: the PRIMAL accelerator and the GPU baseline.

Each TOML table of a target file maps to one nested frozen dataclass; each key
to one field. A field's metadata carries its unit, a one-line meaning and its
value rules (``ge``/``gt``/``le``/``lt``, ``choices``, ``multiple_of``); the
loader (:mod:`primal_compiler.target.loader`) checks them generically. Rules
that tie several fields together live in each table's ``_problems`` method.

Units are in the key names (``_pj``, ``_cycles``, ``_bytes``, ``_hz``, ``_uw``,
``_um2``, ``_bits``, ``_w``); plain counts (``rows``, ``banks``, ``ports``) and
fractions carry none.
"""

from __future__ import annotations

import hashlib
import json
import math
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, is_dataclass
from functools import cached_property
from typing import Any

SCHEMA_VERSION = 1

#: Metadata keys that constrain a value (checked by the loader in this order).
RULE_KEYS = ("choices", "ge", "gt", "le", "lt", "multiple_of")

# Upper bounds (``le`` rules) of what a target may declare: every count that sizes an array or fills a
# fixed-width field of the instruction stream is bounded, so an absurd target is refused when it is
# loaded instead of overflowing a field or exhausting memory later. Each admits the bundled targets
# with a wide margin.
#: CTs of a package: the stream's 16-bit CT field reserves 0xFFFE (the controller) and 0xFFFF (none).
MAX_CTS = 0xFFFE
#: PE rows or columns of a CT: the 16-bit PE field reserves 0xFFFF (all PEs); 255 x 255 = 65,025 fit below it.
MAX_MESH_SIDE = 255
#: PEs of a package (CTs x PEs per CT): 16.8 M, 15x the 1.1 M Llama-2-70B takes on primal-7nm; the executor
#: keeps several counters per PE, so this also bounds its memory (checked for num_cts here, for a derived
#: CT count by the blocking pass).
MAX_PES = 1 << 24
#: Rows, columns and banks of a macro, widths of flits, links and banks: 16x the bundled 256 x 256 crossbar.
MAX_MACRO_SIDE = 4096
#: Cycles of one operation: 1 ms at 1 GHz, far beyond any macro, router or link.
MAX_CYCLES = 10**6
#: Clock, ADC and kernel rates: 1 THz.
MAX_RATE_HZ = 10**12
#: Link and memory bandwidth: 1 PB/s, 300x an H100's HBM.
MAX_BYTES_PER_S = 10**15
#: Tensor-core peaks: 10^18 op/s, 500x an H100's dense FP8 peak.
MAX_OPS_PER_S = 10**18
#: A router scratchpad: 16 MiB, 1024x the bundled 16 KiB.
MAX_SCRATCHPAD_BYTES = 1 << 24

# Units that need no suffix in the key name.
UNITLESS = frozenset({"count", "fraction", "bool", "text", "enum"})


def _f(unit: str, doc: str, **rules: Any) -> Any:
    """A dataclass field with its unit, meaning and value rules as metadata."""
    unknown = set(rules) - set(RULE_KEYS)
    if unknown:  # pragma: no cover - programming error
        raise TypeError(f"unknown field rules {sorted(unknown)}")
    return field(metadata={"unit": unit, "doc": doc, **rules})


def _internal(doc: str) -> Any:
    """A field that is not part of the TOML schema (not loaded, not hashed)."""
    return field(default="", compare=False, repr=False, metadata={"internal": True, "doc": doc})


Problem = tuple[str, str]  # (field name relative to the table, what is wrong)


class _Table:
    """Base of every table dataclass: cross-field rules and plain-data export."""

    def _problems(self) -> Iterator[Problem]:
        """Cross-field consistency problems as (field, message); none by default."""
        return iter(())

    def to_dict(self) -> dict[str, Any]:
        """Nested plain dict of the schema fields (TOML/JSON-compatible values)."""
        out: dict[str, Any] = {}
        for f in fields(self):  # type: ignore[arg-type]
            if f.metadata.get("internal"):
                continue
            value = getattr(self, f.name)
            out[f.name] = value.to_dict() if isinstance(value, _Table) else value
        return out


class _Target(_Table):
    """Root of a target: identity, canonical hash."""

    source: str

    @cached_property
    def content_hash(self) -> str:
        """sha256 hex of the canonical JSON of every value (stable across runs and hosts)."""
        canonical = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), allow_nan=False)
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


# --------------------------------------------------------------------------- PRIMAL


@dataclass(frozen=True)
class SystemSpec(_Table):
    """Package level: clock, number and arrangement of compute tiles (CTs), the NMC controller."""

    technology_nm: int = _f("nm", "process node the energy/area figures refer to", ge=1, le=1000)
    clock_hz: int = _f("Hz", "clock of PEs, routers and NMC", gt=0, le=MAX_RATE_HZ)
    num_cts: int = _f("count", "compute tiles in the package; 0 = derived from the model (smallest count that holds every base weight)", ge=0, le=MAX_CTS)
    ct_grid_cols: int = _f("count", "columns of the package-level CT mesh; 0 = near-square grid derived from the CT count", ge=0, le=MAX_CTS)
    d2d_topology: str = _f("enum", "topology of the die-to-die network between CTs", choices=("mesh",))
    control: str = _f("enum", "who dispatches records: a sequencer per CT running its own part of the stream (distributed), or the NMC alone (central)", choices=("distributed", "central"))
    nmc_issue_cycles: int = _f("cycles", "cycles the NMC's sequencer takes to dispatch one instruction record (every record under central control, the controller's own under distributed)", ge=1, le=MAX_CYCLES)
    nmc_issue_energy_pj: float = _f("pJ", "energy of the NMC fetching, decoding and issuing one instruction record", ge=0)


@dataclass(frozen=True)
class CtSpec(_Table):
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
class RramSpec(_Table):
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
    mvm_latency_cycles: int = _f("cycles", "cycles of one full MVM (all input bits, all row groups, all columns)", ge=1, le=MAX_CYCLES)
    leakage_uw: float = _f("uW", "static power of the macro periphery (ADCs, drivers, sample-and-hold); cells are non-volatile", ge=0)

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
        if not (self.weight_bits % self.bits_per_cell or self.input_bits % self.dac_bits
                or self.rows % self.rows_active_per_read or self.cols % self.adcs_per_macro):
            if self.mvm_latency_cycles < self.adc_bound_cycles:
                yield "mvm_latency_cycles", (
                    f"{self.mvm_latency_cycles} is below the ADC bound {self.adc_bound_cycles}"
                    " (pulses x columns per ADC x adc_latency_cycles)"
                )


@dataclass(frozen=True)
class SramSpec(_Table):
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
class RouterSpec(_Table):
    """Compute router of a PE: 6 AXI-Stream ports, DMAC units, a scratchpad for KV cache and intermediates."""

    ports: int = _f("count", "AXI-Stream ports (4 mesh directions + local)", ge=5, le=64)
    flit_bits: int = _f("bits", "flit width", ge=8, multiple_of=8, le=MAX_MACRO_SIDE)
    link_bits_per_cycle: int = _f("bits", "payload bits a mesh link carries per cycle and direction", ge=1, le=MAX_MACRO_SIDE)
    hop_latency_cycles: int = _f("cycles", "cycles per hop (router pipeline + link traversal)", ge=1, le=MAX_CYCLES)
    energy_pj_per_bit_hop: float = _f("pJ", "energy to move one bit across one router and one PE-to-PE link", gt=0)
    dmac_units: int = _f("count", "dynamic MAC units (activation x activation, accumulation, activation functions)", ge=1, le=MAX_MACRO_SIDE)
    dmac_ops_per_cycle: int = _f("count", "MACs per cycle of one DMAC unit", ge=1, le=MAX_MACRO_SIDE)
    dmac_bits: int = _f("bits", "operand width of the DMAC units", ge=1, le=32)
    dmac_energy_pj_per_op: float = _f("pJ", "energy of one DMAC multiply-accumulate", gt=0)
    scratchpad_bytes: int = _f("bytes", "scratchpad capacity (KV cache slices, intermediates)", ge=1, le=MAX_SCRATCHPAD_BYTES)
    scratchpad_banks: int = _f("count", "scratchpad banks (adjacent tokens' K/V interleaved over them)", ge=1, le=MAX_MACRO_SIDE)
    scratchpad_bank_width_bits: int = _f("bits", "bits one bank reads or writes per cycle", ge=8, multiple_of=8, le=MAX_MACRO_SIDE)
    scratchpad_energy_pj_per_bit: float = _f("pJ", "energy to read or write one scratchpad bit", gt=0)
    leakage_uw: float = _f("uW", "static power of router logic and DMAC units (gated with the interconnect)", ge=0)
    scratchpad_leakage_uw: float = _f("uW", "static power of the scratchpad (retained when the CT is gated)", ge=0)

    @property
    def dmac_macs_per_cycle(self) -> int:
        """MACs per cycle of all DMAC units of one router."""
        return self.dmac_units * self.dmac_ops_per_cycle

    def _problems(self) -> Iterator[Problem]:
        if self.scratchpad_bytes % self.scratchpad_banks:
            yield "scratchpad_banks", f"{self.scratchpad_banks} does not divide scratchpad_bytes {self.scratchpad_bytes}"


@dataclass(frozen=True)
class ActSpec(_Table):
    """Work of the router's activation path: DMAC operations per element of each ``ACT`` function."""

    embed_ops_per_element: int = _f("count", "controller: embedding-table read and FP16 conversion per element", ge=1, le=1024)
    rmsnorm_ops_per_element: int = _f("count", "square-accumulate, scale, multiply by the norm weight", ge=1, le=1024)
    layernorm_ops_per_element: int = _f("count", "mean, variance, normalize, affine", ge=1, le=1024)
    silu_ops_per_element: int = _f("count", "x * sigmoid(x) by piecewise approximation", ge=1, le=1024)
    gelu_ops_per_element: int = _f("count", "tanh approximation of GELU", ge=1, le=1024)
    relu_ops_per_element: int = _f("count", "max(x, 0)", ge=1, le=1024)
    swiglu_ops_per_element: int = _f("count", "silu(gate) * up", ge=1, le=1024)
    rope_ops_per_element: int = _f("count", "rotation: two multiplies and an add against a sin/cos table", ge=1, le=1024)
    softmax_ops_per_element: int = _f("count", "max, exp, sum, divide", ge=1, le=1024)
    residual_add_ops_per_element: int = _f("count", "one add", ge=1, le=1024)
    argmax_ops_per_element: int = _f("count", "controller: one compare per logit", ge=1, le=1024)
    bias_ops_per_element: int = _f("count", "add the projection bias to a column block", ge=1, le=1024)


@dataclass(frozen=True)
class D2dSpec(_Table):
    """Die-to-die link between neighbouring CTs of the package mesh (per direction)."""

    bandwidth_bytes_per_s: int = _f("bytes/s", "payload bandwidth of one CT-to-CT link per direction", gt=0, le=MAX_BYTES_PER_S)
    latency_cycles: int = _f("cycles", "one-way latency of a CT-to-CT link (PHY + adapter)", ge=1, le=MAX_CYCLES)
    energy_pj_per_bit: float = _f("pJ", "energy per bit crossing one CT-to-CT link", gt=0)


@dataclass(frozen=True)
class PowerGatingSpec(_Table):
    """Per-CT power states (SRPG): what a gated CT switches off, and what waking it costs."""

    gate_rram_periphery: bool = _f("bool", "a gated CT switches off its RRAM-ACIM periphery (ADCs, drivers)")
    gate_router: bool = _f("bool", "a gated CT switches off router logic and DMAC units (the interconnect)")
    retain_sram: bool = _f("bool", "SRAM-DCIM stays powered in a gated CT and keeps its LoRA weights")
    retain_scratchpad: bool = _f("bool", "scratchpads stay powered in a gated CT and keep their KV-cache slices")
    gated_leakage_fraction: float = _f("fraction", "residual leakage of a switched-off domain, as a fraction of its leakage", ge=0, le=1)
    retained_leakage_fraction: float = _f("fraction", "leakage of a retained domain while gated, as a fraction of its active leakage", ge=0, le=1)
    wakeup_cycles: int = _f("cycles", "cycles from PG_ON until the CT can compute", ge=0, le=MAX_CYCLES)
    wakeup_energy_pj: float = _f("pJ", "energy to wake one whole CT (recharging its gated rails)", ge=0)


@dataclass(frozen=True)
class AreaSpec(_Table):
    """Area of one PE by component."""

    rram_um2: float = _f("um2", "RRAM-ACIM macro: crossbar, ADCs, drivers, analog routing", gt=0)
    sram_um2: float = _f("um2", "SRAM-DCIM macro: cells and adder trees", gt=0)
    router_um2: float = _f("um2", "router logic: ports, buffers, crossbar, control", gt=0)
    dmac_um2: float = _f("um2", "the router's DMAC units", gt=0)
    scratchpad_um2: float = _f("um2", "the router's scratchpad SRAM", gt=0)

    @property
    def pe_um2(self) -> float:
        return self.rram_um2 + self.sram_um2 + self.router_um2 + self.dmac_um2 + self.scratchpad_um2


@dataclass(frozen=True)
class PrimalTarget(_Target):
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
    source: str = _internal("file the target was loaded from (not part of the hash)")

    def _problems(self) -> Iterator[Problem]:
        pes = self.system.num_cts * self.ct.pes
        if pes > MAX_PES:
            yield "system.num_cts", (f"{self.system.num_cts} CTs x {self.ct.pes} PEs = {pes:,} PEs exceeds the "
                                     f"package limit of {MAX_PES:,} PEs")
        need = -(-self.system.clock_hz // self.rram.adc_sample_rate_hz)  # ceil
        if self.rram.adc_latency_cycles < need:
            yield "rram.adc_latency_cycles", (
                f"{self.rram.adc_latency_cycles} is too short: an ADC at {self.rram.adc_sample_rate_hz} Hz"
                f" needs {need} cycles of the {self.system.clock_hz} Hz clock per conversion"
            )


# --------------------------------------------------------------------------- GPU


@dataclass(frozen=True)
class GpuMemorySpec(_Table):
    """HBM: capacity, peak bandwidth and the share a serving engine may fill."""

    hbm_capacity_bytes: int = _f("bytes", "HBM capacity", gt=0, le=1 << 50)
    hbm_bandwidth_bytes_per_s: int = _f("bytes/s", "peak HBM bandwidth", gt=0, le=MAX_BYTES_PER_S)
    usable_fraction: float = _f("fraction", "share of HBM the serving engine may fill with weights, adapters and KV cache", gt=0, le=1)
    stream_bandwidth_fraction: float = _f("fraction", "best achieved / peak HBM bandwidth of a large streaming kernel (the engine-profile model's memory roof)", gt=0, le=1)


@dataclass(frozen=True)
class GpuComputeSpec(_Table):
    """Dense tensor-core peaks (no 2:4 structured sparsity)."""

    fp16_dense_flop_per_s: int = _f("FLOP/s", "dense FP16 tensor-core peak (no structured sparsity)", gt=0, le=MAX_OPS_PER_S)
    bf16_dense_flop_per_s: int = _f("FLOP/s", "dense BF16 tensor-core peak", gt=0, le=MAX_OPS_PER_S)
    fp8_dense_flop_per_s: int = _f("FLOP/s", "dense FP8 tensor-core peak; 0 = no FP8 tensor cores (no FP8 or W4A8 kernels)", ge=0, le=MAX_OPS_PER_S)
    int8_dense_op_per_s: int = _f("OP/s", "dense INT8 tensor-core peak", gt=0, le=MAX_OPS_PER_S)
    sm_count: int = _f("count", "streaming multiprocessors", ge=1, le=100_000)


@dataclass(frozen=True)
class GpuPowerSpec(_Table):
    """Board power by phase."""

    tdp_w: float = _f("W", "board power limit (TDP)", gt=0)
    idle_w: float = _f("W", "board power idle with a model resident (CUDA context held)", ge=0)
    decode_power_w: float = _f("W", "average board power during memory-bound decode", gt=0)
    prefill_power_w: float = _f("W", "average board power during compute-bound prefill", gt=0)
    memory_dynamic_w: float = _f("W", "board power above idle per unit of HBM utilisation (achieved / peak bandwidth); engine-profile model", ge=0)
    compute_dynamic_w: float = _f("W", "board power above idle per unit of tensor-core utilisation (achieved / dense peak of the data type); engine-profile model", ge=0)

    def _problems(self) -> Iterator[Problem]:
        if self.idle_w >= self.tdp_w:
            yield "idle_w", f"{self.idle_w} W is not below tdp_w {self.tdp_w} W"
        for name in ("decode_power_w", "prefill_power_w"):
            value = getattr(self, name)
            if not self.idle_w <= value <= self.tdp_w:
                yield name, f"{value} W is outside [idle_w, tdp_w] = [{self.idle_w}, {self.tdp_w}] W"


@dataclass(frozen=True)
class GpuEfficiencySpec(_Table):
    """Achieved fractions of peak, calibrated on published end-to-end serving measurements."""

    decode_bandwidth_fraction: float = _f("fraction", "achieved / peak HBM bandwidth in decode (MBU)", gt=0, le=1)
    prefill_compute_fraction: float = _f("fraction", "achieved / peak dense tensor throughput in prefill (MFU); also used for any compute-bound decode", gt=0, le=1)


@dataclass(frozen=True)
class GpuServingSpec(_Table):
    """Data types the GPU serves the model in (not PRIMAL's 4/8-bit precision)."""

    weight_bits: int = _f("bits", "bits per base weight in HBM (16 = FP16; 8 = FP8)", choices=(8, 16))
    lora_weight_bits: int = _f("bits", "bits per LoRA A/B weight in HBM", choices=(8, 16))
    kv_bits: int = _f("bits", "bits per K/V cache entry in HBM", choices=(8, 16))
    activation_bits: int = _f("bits", "bits per activation; GEMMs run on FP8 tensor cores only when weights and activations are both 8-bit", choices=(8, 16))


@dataclass(frozen=True)
class GpuKernelSpec(_Table):
    """Fixed per-kernel cost: small dependent kernels take a fixed time however little they move."""

    serial_rate_hz: int = _f("Hz", "small dependent kernels completed per second back to back (1 / fixed time of one kernel)", gt=0, le=MAX_RATE_HZ)
    per_layer: int = _f("count", "kernels one decoder layer of the base model launches per forward pass (sets a step-time floor)", ge=1, le=10_000)
    per_lora_projection: int = _f("count", "extra kernels per projection carrying an unmerged LoRA adapter (shrink x@A, expand (xA)@B)", ge=1, le=10_000)


@dataclass(frozen=True)
class GpuTarget(_Target):
    """A GPU baseline for a roofline model: peaks, power, achieved-efficiency factors, serving data types, kernel costs."""

    schema_version: int = _f("count", "target file format version", choices=(SCHEMA_VERSION,))
    name: str = _f("text", "target name (bundled targets: the file stem)")
    description: str = _f("text", "one-line description")
    kind: str = _f("enum", "target family", choices=("gpu",))
    memory: GpuMemorySpec = _f("table", "memory")
    compute: GpuComputeSpec = _f("table", "compute peaks")
    power: GpuPowerSpec = _f("table", "board power")
    efficiency: GpuEfficiencySpec = _f("table", "achieved fractions of peak")
    serving: GpuServingSpec = _f("table", "data types as served")
    kernels: GpuKernelSpec = _f("table", "fixed per-kernel costs")
    source: str = _internal("file the target was loaded from (not part of the hash)")


Target = PrimalTarget | GpuTarget

#: Target class by the ``kind`` key of a target file.
KINDS: dict[str, type[PrimalTarget] | type[GpuTarget]] = {"primal": PrimalTarget, "gpu": GpuTarget}


# --------------------------------------------------------------------------- introspection


@dataclass(frozen=True)
class FieldInfo:
    """One key of the schema, for docs and tooling."""

    key: str  # dotted, e.g. "rram.adc_bits"
    type: type
    unit: str
    doc: str
    rules: dict[str, Any]


def type_hints(cls: type) -> dict[str, Any]:
    """Resolved field annotations of a spec dataclass (cached per class)."""
    cached = _HINTS.get(cls)
    if cached is None:
        cached = _HINTS[cls] = typing.get_type_hints(cls)
    return cached


_HINTS: dict[type, dict[str, Any]] = {}


def schema(cls: type, prefix: str = "") -> list[FieldInfo]:
    """Every leaf key of a target class, depth-first in declaration order."""
    out: list[FieldInfo] = []
    hints = type_hints(cls)
    for f in fields(cls):
        if f.metadata.get("internal"):
            continue
        typ = hints[f.name]
        if is_dataclass(typ):
            out.extend(schema(typ, f"{prefix}{f.name}."))
        else:
            rules = {k: f.metadata[k] for k in RULE_KEYS if k in f.metadata}
            out.append(FieldInfo(prefix + f.name, typ, f.metadata["unit"], f.metadata["doc"], rules))
    return out
