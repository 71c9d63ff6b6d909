"""Hardware targets: bundled files load, hash is stable, every bad input is a one-line InputError."""

from __future__ import annotations

import dataclasses
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from primal_compiler.errors import InputError
from primal_compiler.target import (
    GpuTarget,
    PrimalTarget,
    bundled_targets,
    load_target,
    parse_override,
    schema,
    validate_all,
    with_overrides,
)
from primal_compiler.target.table import UNITLESS

REPO = Path(__file__).resolve().parents[2]
SEVEN = bundled_targets()["primal-7nm"]
SEVEN_TEXT = SEVEN.read_text(encoding="utf-8")


def _error(target_ref) -> InputError:
    with pytest.raises(InputError) as info:
        load_target(target_ref)
    return info.value


def _assert_one_line(err: InputError, path: Path | str, key: str | None) -> None:
    msg = str(err)
    assert "\n" not in msg
    assert str(path) in msg, msg
    assert err.where == str(path)
    if key is not None:
        assert err.problem.startswith(f"{key}: "), msg


def _variant(tmp_path: Path, text: str, name: str = "bad.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _replace_line(text: str, key: str, new: str | None, table: str) -> str:
    """Replace (or drop, new=None) the ``key = ...`` line inside ``[table]``."""
    out, current, done = [], "", False
    for line in text.splitlines():
        header = re.match(r"^\[(\w+)\]", line)
        if header:
            current = header.group(1)
        if not done and current == table and re.match(rf"^{re.escape(key)}\s*=", line):
            done = True
            if new is not None:
                out.append(new)
            continue
        out.append(line)
    assert done, f"{table}.{key} not found"
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- bundled


def test_bundled_targets_present():
    assert {"primal-7nm", "primal-5nm", "h100"} <= set(bundled_targets())


@pytest.mark.parametrize("name", sorted(bundled_targets()))
def test_bundled_target_loads_by_name_and_path(name):
    by_name = load_target(name)
    by_path = load_target(bundled_targets()[name])
    assert by_name == by_path
    assert by_name.name == name
    assert by_name.source == str(bundled_targets()[name])
    assert isinstance(by_name, GpuTarget if by_name.kind == "gpu" else PrimalTarget)


def test_validate_all_is_green():
    results = validate_all()
    assert [r[0] for r in results] == sorted(bundled_targets())
    assert all(ok for _, ok, _ in results), results


def test_validate_all_reports_a_name_mismatch(tmp_path, monkeypatch):
    bad = _variant(tmp_path, SEVEN_TEXT, "renamed.toml")
    monkeypatch.setattr("primal_compiler.target.loader.bundled_targets", lambda: {"renamed": bad})
    [(name, ok, message)] = validate_all()
    assert (name, ok) == ("renamed", False)
    assert "does not match the file name" in message


def test_seed_constants_of_the_default_target():
    t = load_target("primal-7nm")
    assert t.system.clock_hz == 1_000_000_000
    assert (t.ct.mesh_rows, t.ct.mesh_cols, t.ct.routing, t.ct.pes) == (32, 32, "xy", 1024)
    assert (t.rram.rows, t.rram.cols, t.rram.bits_per_cell, t.rram.weight_bits) == (256, 256, 4, 4)
    assert t.rram.adc_power_uw == 120.0
    assert (t.sram.rows, t.sram.cols_bits, t.sram.weight_bits) == (256, 64, 8)
    assert (t.sram.reconfig_cycles, t.sram.banks, t.sram.weights_per_row) == (12, 8, 8)
    assert (t.router.ports, t.router.dmac_units) == (6, 16)
    assert t.power_gating.gate_rram_periphery and t.power_gating.gate_router and t.power_gating.retain_sram


def test_default_target_is_internally_consistent():
    t = load_target("primal-7nm")
    # 120 uW at 1 GS/s is 0.12 pJ per conversion.
    assert math.isclose(t.rram.adc_energy_pj_per_conversion, t.rram.adc_power_uw * 1e6 / t.rram.adc_sample_rate_hz)
    # The MVM time is derived from the ADCs (8 input bits x 4 row groups x 8 columns per ADC) plus the drain.
    assert (t.rram.adc_bound_cycles, t.rram.mvm_latency_cycles) == (256, 260)
    # Seed: RRAM-ACIM is 65.2% and SRAM-DCIM 15.8% of PE area.
    assert t.area.rram_um2 / t.area.pe_um2 == pytest.approx(0.652, abs=5e-4)
    assert t.area.sram_um2 / t.area.pe_um2 == pytest.approx(0.158, abs=5e-4)


def test_5nm_scales_rram_by_2_1_and_sram_by_1_3_and_nothing_else():
    t7, t5 = load_target("primal-7nm"), load_target("primal-5nm")
    scaled = {"rram": 2.1, "sram": 1.3}
    compared = 0
    for info in schema(PrimalTarget):
        table, key = info.key.split(".", 1) if "." in info.key else ("", info.key)
        v7, v5 = _get(t7, info.key), _get(t5, info.key)
        if table in scaled and info.unit in ("pJ", "uW"):
            assert v5 == pytest.approx(v7 / scaled[table], rel=1e-6), info.key
            compared += 1
        elif info.key not in ("name", "description", "system.technology_nm"):
            assert v5 == v7, info.key
    assert compared == 10  # every RRAM and SRAM energy and static-power key
    assert t5.system.technology_nm == 5


def _get(obj, dotted):
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def test_h100_constants():
    g = load_target("h100")
    assert isinstance(g, GpuTarget)
    assert g.memory.hbm_bandwidth_bytes_per_s == 3_350_000_000_000
    assert g.compute.fp16_dense_flop_per_s == pytest.approx(989.4e12)
    assert g.power.tdp_w == 700.0
    assert 0 < g.efficiency.decode_bandwidth_fraction <= 1


# --------------------------------------------------------------------------- hash, dict


def test_content_hash_is_stable_within_and_across_processes():
    t = load_target("primal-7nm")
    assert re.fullmatch(r"[0-9a-f]{64}", t.content_hash)
    assert load_target("primal-7nm").content_hash == t.content_hash
    code = "from primal_compiler.target import load_target; print(load_target('primal-7nm').content_hash)"
    for seed in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-c", code],
            cwd=REPO,
            env={"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            check=True,
        )
        assert out.stdout.strip() == t.content_hash


def test_content_hash_ignores_the_source_path(tmp_path):
    copy = _variant(tmp_path, SEVEN_TEXT, "copy.toml")
    assert load_target(copy).content_hash == load_target("primal-7nm").content_hash


def test_distinct_targets_have_distinct_hashes():
    hashes = {load_target(n).content_hash for n in bundled_targets()}
    assert len(hashes) == len(bundled_targets())


def test_to_dict_round_trips_through_toml(tmp_path):
    t = load_target("primal-7nm")
    d = t.to_dict()
    assert "source" not in d and d["rram"]["rows"] == 256
    lines = []
    for k, v in d.items():
        if not isinstance(v, dict):
            lines.append(f"{k} = {_toml(v)}")
    for k, v in d.items():
        if isinstance(v, dict):
            lines.append(f"[{k}]")
            lines += [f"{kk} = {_toml(vv)}" for kk, vv in v.items()]
    again = load_target(_variant(tmp_path, "\n".join(lines) + "\n", "round.toml"))
    assert again == t and again.content_hash == t.content_hash


def _toml(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    return repr(v)


def test_targets_are_frozen():
    t = load_target("primal-7nm")
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.rram.rows = 128  # type: ignore[misc]


# --------------------------------------------------------------------------- error classes


def test_missing_key(tmp_path):
    path = _variant(tmp_path, _replace_line(SEVEN_TEXT, "adc_bits", None, "rram"))
    _assert_one_line(_error(path), path, "rram.adc_bits")
    assert "missing key" in str(_error(path))


def test_missing_table(tmp_path):
    text = SEVEN_TEXT.split("[area]")[0]
    path = _variant(tmp_path, text)
    _assert_one_line(_error(path), path, "area")


def test_unknown_key_suggests_the_close_one(tmp_path):
    path = _variant(tmp_path, SEVEN_TEXT.replace("[rram]\n", "[rram]\nadc_bitz = 6\n"))
    err = _error(path)
    _assert_one_line(err, path, "rram.adc_bitz")
    assert "unknown key" in str(err) and "adc_bits" in str(err)


def test_unknown_table(tmp_path):
    path = _variant(tmp_path, SEVEN_TEXT + "\n[hbm]\nbandwidth = 1\n")
    _assert_one_line(_error(path), path, "hbm")


@pytest.mark.parametrize(
    ("table", "key", "line", "expected"),
    [
        ("rram", "adc_bits", 'adc_bits = "6"', 'expected an integer, got string "6"'),
        ("rram", "rows", "rows = true", "expected an integer, got boolean true"),
        ("rram", "rows", "rows = 256.0", "expected an integer, got float 256.0"),
        ("rram", "adc_power_uw", "adc_power_uw = false", "expected a number, got boolean false"),
        ("power_gating", "retain_sram", "retain_sram = 1", "expected a boolean, got integer 1"),
        ("ct", "routing", "routing = 7", "expected a string, got integer 7"),
        ("rram", "leakage_uw", "leakage_uw = nan", "must be finite"),
    ],
)
def test_wrong_type(tmp_path, table, key, line, expected):
    path = _variant(tmp_path, _replace_line(SEVEN_TEXT, key, line, table))
    err = _error(path)
    _assert_one_line(err, path, f"{table}.{key}")
    assert expected in err.problem


def test_wrong_type_at_top_level(tmp_path):
    path = _variant(tmp_path, SEVEN_TEXT.replace('name = "primal-7nm"', "name = 7"))
    _assert_one_line(_error(path), path, "name")


def test_a_table_given_as_a_value(tmp_path):
    path = _variant(tmp_path, SEVEN_TEXT.replace('kind = "primal"', 'kind = "primal"\nct = 3'))
    # ct is then both a value and a table: TOML itself rejects the file.
    _assert_one_line(_error(path), path, None)


@pytest.mark.parametrize(
    ("table", "key", "line", "expected"),
    [
        ("rram", "array_read_energy_pj", "array_read_energy_pj = -0.0004", "must be > 0"),
        ("ct", "mesh_rows", "mesh_rows = 0", "must be >= 1"),
        ("rram", "weight_bits", "weight_bits = 6", "not a multiple of bits_per_cell 4"),
        ("rram", "input_mode", 'input_mode = "analog"', "must be one of 'bit-serial', 'dac'"),
        ("rram", "dac_bits", "dac_bits = 2", "must be 1 in bit-serial input mode"),
        ("rram", "adcs_per_macro", "adcs_per_macro = 48", "does not divide cols 256"),
        ("rram", "adc_energy_pj_per_conversion", "adc_energy_pj_per_conversion = 0.2", "disagrees with adc_power_uw"),
        ("rram", "adc_latency_cycles", "adc_latency_cycles = 0", "must be >= 1"),
        ("sram", "columns_per_bank", "columns_per_bank = 4", "!= cols_bits 64"),
        ("router", "ports", "ports = 4", "must be >= 5"),
        ("router", "flit_bits", "flit_bits = 100", "multiple of 8"),
        ("power_gating", "gated_leakage_fraction", "gated_leakage_fraction = 1.5", "must be <= 1"),
        ("d2d", "energy_pj_per_bit", "energy_pj_per_bit = 0", "must be > 0"),
    ],
)
def test_impossible_value(tmp_path, table, key, line, expected):
    path = _variant(tmp_path, _replace_line(SEVEN_TEXT, key, line, table))
    err = _error(path)
    _assert_one_line(err, path, f"{table}.{key}")
    assert expected in err.problem


def test_cross_table_rule_names_the_key(tmp_path):
    # A 0.5 GS/s ADC needs two cycles of the 1 GHz clock per conversion.
    text = _replace_line(SEVEN_TEXT, "adc_sample_rate_hz", "adc_sample_rate_hz = 500_000_000", "rram")
    text = _replace_line(text, "adc_energy_pj_per_conversion", "adc_energy_pj_per_conversion = 0.24", "rram")
    path = _variant(tmp_path, text)
    err = _error(path)
    _assert_one_line(err, path, "rram.adc_latency_cycles")


def test_gpu_rules(tmp_path):
    text = bundled_targets()["h100"].read_text(encoding="utf-8")
    path = _variant(tmp_path, _replace_line(text, "idle_w", "idle_w = 800.0", "power"))
    _assert_one_line(_error(path), path, "power.idle_w")
    path = _variant(tmp_path, _replace_line(text, "decode_bandwidth_fraction", "decode_bandwidth_fraction = 1.2", "efficiency"))
    _assert_one_line(_error(path), path, "efficiency.decode_bandwidth_fraction")


def test_bad_or_missing_kind(tmp_path):
    path = _variant(tmp_path, SEVEN_TEXT.replace('kind = "primal"', 'kind = "tpu"'))
    err = _error(path)
    _assert_one_line(err, path, "kind")
    assert "'primal', 'gpu'" in err.problem
    path = _variant(tmp_path, SEVEN_TEXT.replace('kind = "primal"\n', ""))
    _assert_one_line(_error(path), path, "kind")


def test_wrong_schema_version(tmp_path):
    path = _variant(tmp_path, SEVEN_TEXT.replace("schema_version = 1", "schema_version = 2"))
    _assert_one_line(_error(path), path, "schema_version")


def test_bad_toml_syntax(tmp_path):
    path = _variant(tmp_path, SEVEN_TEXT.replace("rows = 256", "rows = = 256", 1))
    err = _error(path)
    _assert_one_line(err, path, None)
    assert err.problem.startswith("invalid TOML:") and "line" in err.problem


def test_missing_file(tmp_path):
    path = tmp_path / "nowhere.toml"
    err = _error(path)
    _assert_one_line(err, path, None)
    assert err.problem == "no such target file"


def test_unknown_bundled_name_lists_the_bundled_ones():
    err = _error("primal-3nm")
    assert "\n" not in str(err)
    assert err.where == "primal-3nm"
    for name in bundled_targets():
        assert name in err.problem


# --------------------------------------------------------------------------- extends


def test_extends_overrides_and_inherits(tmp_path):
    path = _variant(
        tmp_path,
        'extends = "primal-7nm"\nname = "mine"\n[rram]\nadc_bits = 8\n',
        "mine.toml",
    )
    t = load_target(path)
    base = load_target("primal-7nm")
    assert (t.name, t.rram.adc_bits, t.description) == ("mine", 8, base.description)
    assert t.rram.rows == base.rram.rows and t.area == base.area


def test_extends_by_relative_path_and_chain(tmp_path):
    _variant(tmp_path, 'extends = "primal-7nm"\nname = "a"\n[ct]\nmesh_rows = 16\n', "a.toml")
    b = _variant(tmp_path, 'extends = "a.toml"\nname = "b"\n[ct]\nmesh_cols = 8\n', "b.toml")
    t = load_target(b)
    assert (t.ct.mesh_rows, t.ct.mesh_cols) == (16, 8)
    sibling = _variant(tmp_path, 'extends = "a"\nname = "c"\n', "c.toml")  # bare name: sibling file first
    assert load_target(sibling).ct.mesh_rows == 16


def test_extending_file_may_not_add_unknown_keys(tmp_path):
    path = _variant(tmp_path, 'extends = "primal-7nm"\nname = "x"\n[rram]\nadc_bitz = 8\n', "x.toml")
    err = _error(path)
    _assert_one_line(err, path, "rram.adc_bitz")


def test_bad_value_in_extending_file_names_that_file(tmp_path):
    path = _variant(tmp_path, 'extends = "primal-7nm"\nname = "x"\n[rram]\nadc_bits = "8"\n', "x.toml")
    _assert_one_line(_error(path), path, "rram.adc_bits")


def test_bad_value_in_base_file_names_the_base(tmp_path):
    base = _variant(tmp_path, _replace_line(SEVEN_TEXT, "rows", "rows = -1", "rram"), "base.toml")
    child = _variant(tmp_path, 'extends = "base.toml"\nname = "child"\n', "child.toml")
    _assert_one_line(_error(child), base, "rram.rows")


def test_extends_errors(tmp_path):
    cyc = _variant(tmp_path, 'extends = "cyc.toml"\nname = "cyc"\n', "cyc.toml")
    err = _error(cyc)
    _assert_one_line(err, cyc, "extends")
    assert "cycle" in err.problem
    nowhere = _variant(tmp_path, 'extends = "primal-1nm"\nname = "n"\n', "n.toml")
    err = _error(nowhere)
    assert str(nowhere) in str(err) and "primal-7nm" in str(err) and "\n" not in str(err)
    unnamed = _variant(tmp_path, 'extends = "primal-7nm"\n', "u.toml")
    _assert_one_line(_error(unnamed), unnamed, "name")
    typed = _variant(tmp_path, 'extends = 7\nname = "t"\n', "t.toml")
    _assert_one_line(_error(typed), typed, "extends")
    nested = _variant(tmp_path, 'extends = "primal-7nm"\nname = "z"\n[rram]\nextends = "h100"\n', "z.toml")
    _assert_one_line(_error(nested), nested, "rram.extends")


# --------------------------------------------------------------------------- overrides


def test_overrides_change_values_and_hash_but_not_the_original():
    t = load_target("primal-7nm")
    t2 = with_overrides(t, {"rram.adc_bits": 8, "ct.routing": "yx", "power_gating.wakeup_cycles": 50})
    assert (t2.rram.adc_bits, t2.ct.routing, t2.power_gating.wakeup_cycles) == (8, "yx", 50)
    assert t.rram.adc_bits == 6
    assert t2.content_hash != t.content_hash
    assert with_overrides(t, {}).content_hash == t.content_hash
    assert isinstance(t2.rram.adc_power_uw, float)
    assert isinstance(with_overrides(t, {"rram.adc_power_uw": 240, "rram.adc_energy_pj_per_conversion": 0.24}).rram.adc_power_uw, float)


@pytest.mark.parametrize(
    ("overrides", "key", "expected"),
    [
        ({"rram.adc_bitz": 6}, "rram.adc_bitz", "unknown key (did you mean 'adc_bits'?)"),
        ({"hbm.bandwidth": 1}, "hbm", "unknown key"),
        ({"rram": {}}, "rram", "is a table"),
        ({"rram.rows.x": 1}, "rram.rows", "is a value, not a table"),
        ({"rram.adc_bits": "6"}, "rram.adc_bits", "expected an integer"),
        ({"rram.adc_bits": 6.0}, "rram.adc_bits", "expected an integer"),
        ({"ct.mesh_rows": 0}, "ct.mesh_rows", "must be >= 1"),
        ({"sram.mac_energy_pj": -1.0}, "sram.mac_energy_pj", "must be > 0"),
        ({"rram.adc_power_uw": 240.0}, "rram.adc_energy_pj_per_conversion", "disagrees"),
        ({"router.buffer_flits": 0}, "router.buffer_flits", "must be >= 1"),
        ({"router.link_schedule": "round-robin"}, "router.link_schedule", "cut-through"),
        ({"router.arbitration": "round-robin"}, "router.arbitration", "age"),
        ({"router.flit_bits": 96}, "router.flit_bits", "does not divide link_bits_per_cycle 128"),
        ({"router.ejection_ports": 3}, "router.ejection_ports", "more than the router's 2 local ports"),
        ({"router.injection_ports": 0}, "router.injection_ports", "must be >= 1"),
        ({"d2d.ports_per_ct": 33}, "d2d.ports_per_ct", "33 ports do not fit the 32 PEs of a CT's north edge"),
    ],
)
def test_bad_overrides(overrides, key, expected):
    t = load_target("primal-7nm")
    with pytest.raises(InputError) as info:
        with_overrides(t, overrides)
    err = info.value
    assert err.where == "override of primal-7nm"
    assert err.problem.startswith(f"{key}: ") and expected in err.problem, str(err)
    assert "\n" not in str(err)


def test_overrides_on_a_gpu_target():
    g = with_overrides(load_target("h100"), {"efficiency.decode_bandwidth_fraction": 0.8})
    assert isinstance(g, GpuTarget) and g.efficiency.decode_bandwidth_fraction == 0.8


def test_parse_override():
    assert parse_override("rram.adc_bits=6") == ("rram.adc_bits", 6)
    assert parse_override(" sram.mac_energy_pj = 0.05 ") == ("sram.mac_energy_pj", 0.05)
    assert parse_override("ct.routing=yx") == ("ct.routing", "yx")
    assert parse_override('ct.routing="yx"') == ("ct.routing", "yx")
    assert parse_override("power_gating.retain_sram=false") == ("power_gating.retain_sram", False)
    with pytest.raises(InputError):
        parse_override("rram.adc_bits")


# --------------------------------------------------------------------------- house style


_SOURCE = re.compile(r"\b(seed|assumed|derived|datasheet|whitepaper)\b|\b(19|20)\d\d\b", re.IGNORECASE)


@pytest.mark.parametrize("name", sorted(bundled_targets()))
def test_every_value_has_a_source_comment(name):
    for number, line in enumerate(bundled_targets()[name].read_text(encoding="utf-8").splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", "[")):
            continue
        key = stripped.split("=", 1)[0].strip()
        if key in ("schema_version", "name", "description", "kind", "extends"):
            continue
        assert "#" in line, f"{name}.toml:{number}: {key} has no source comment"
        assert _SOURCE.search(line.split("#", 1)[1]), f"{name}.toml:{number}: {key}: comment names no source"


@pytest.mark.parametrize("cls", [PrimalTarget, GpuTarget])
def test_units_are_in_key_names(cls):
    suffix = {"pJ": "pj", "uW": "uw", "um2": "um2", "cycles": "cycles", "bytes": "bytes", "bytes/s": "bytes_per_s",
              "Hz": "hz", "bits": "bits", "flits": "flits", "nm": "nm", "W": "w", "FLOP/s": "flop_per_s", "OP/s": "op_per_s",
              "degC": "c", "um": "um", "W/(m K)": "w_per_m_k", "J/(m3 K)": "j_per_m3_k", "K mm2/W": "k_mm2_per_w",
              "J/(K mm2)": "j_per_k_mm2", "LSB/K": "lsb_per_k", "K": "k"}
    for info in schema(cls):
        if info.unit in UNITLESS:
            continue
        assert info.unit in suffix, f"{info.key}: unit {info.unit} has no key suffix rule"
        tokens = info.key.rsplit(".", 1)[-1].split("_")
        assert suffix[info.unit] in "_".join(tokens) and set(suffix[info.unit].split("_")) <= set(tokens), info.key


@pytest.mark.parametrize("cls", [PrimalTarget, GpuTarget])
def test_every_key_is_documented(cls):
    doc = (REPO / "docs" / "targets.md").read_text(encoding="utf-8")
    for info in schema(cls):
        assert f"`{info.key}`" in doc, f"{info.key} missing from docs/targets.md"


# --------------------------------------------------------------------------- sizes and files


@pytest.mark.parametrize("cls", [PrimalTarget, GpuTarget])
def test_every_integer_key_has_an_upper_bound(cls):
    for info in schema(cls):
        if info.type is int:
            assert "le" in info.rules or "choices" in info.rules, f"{info.key} has no upper bound"


@pytest.mark.parametrize(
    ("table", "key", "line", "expected"),
    [
        ("ct", "mesh_cols", "mesh_cols = 100000", "must be <= 255, got 100000"),
        ("ct", "mesh_rows", "mesh_rows = 256", "must be <= 255, got 256"),
        ("system", "num_cts", "num_cts = 1_000_000_000", "must be <= 65534"),
        ("system", "ct_grid_cols", "ct_grid_cols = 70000", "must be <= 65534"),
        ("system", "num_cts", "num_cts = 60000", "60000 CTs x 1024 PEs = 61,440,000 PEs exceeds the package limit"),
        ("rram", "rows", "rows = 1_000_000", "must be <= 4096"),
        ("rram", "adc_sample_rate_hz", "adc_sample_rate_hz = 1" + "0" * 400, "must be <= 1000000000000"),
        ("router", "scratchpad_bytes", "scratchpad_bytes = 1_099_511_627_776", "must be <= 16777216"),
        ("rram", "mvm_drain_cycles", "mvm_drain_cycles = 9_223_372_036_854_775_807", "must be <= 1000000"),
    ],
)
def test_sizes_are_bounded_up_front(tmp_path, table, key, line, expected):
    path = _variant(tmp_path, _replace_line(SEVEN_TEXT, key, line, table))
    err = _error(path)
    _assert_one_line(err, path, f"{table}.{key}")
    assert expected in err.problem


def test_the_largest_allowed_sizes_load():
    t = with_overrides(load_target("primal-7nm"), {"ct.mesh_rows": 255, "ct.mesh_cols": 255, "system.num_cts": 258})
    assert t.ct.pes == 65_025 and t.system.num_cts * t.ct.pes <= 1 << 24


def test_a_model_too_large_for_any_package_is_refused_before_lowering(tmp_path):
    from primal_compiler.api import compile_model
    from primal_compiler.frontend import load_model

    path = _variant(tmp_path, 'extends = "primal-7nm"\nname = "dot"\n[rram]\nrows = 1\ncols = 1\n'
                              "rows_active_per_read = 1\nrows_active_per_read_range = [1, 1]\nadcs_per_macro = 1\n", "dot.toml")
    with pytest.raises(InputError, match=r"llama2-70b: needs 69,499,617,280 PEs .* more than the 16,777,216 PEs"):
        compile_model(load_model("llama2-70b"), load_target(path), "lower-tiles")


def test_target_files_are_read_as_regular_utf8_files(tmp_path):
    import os

    bad = _variant(tmp_path, "")
    bad.write_bytes(SEVEN_TEXT.encode("utf-8").replace(b"seed: 256x256", b"seed: \xff"))
    err = _error(bad)
    _assert_one_line(err, bad, None)
    assert err.problem.startswith("is not UTF-8 text")
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    assert "is a FIFO" in _error(fifo).problem  # refused by stat, never opened (which would block)
    (tmp_path / "dir.toml").mkdir()
    assert "is a directory" in _error(tmp_path / "dir.toml").problem
    deep = _variant(tmp_path, "a = " + "[" * 5000 + "]" * 5000 + "\n", "deep.toml")
    assert "nested too deeply" in _error(deep).problem
    nul = _variant(tmp_path, 'extends = "primal\\u0000x"\nname = "n"\n', "nul.toml")
    assert "NUL" in str(_error(nul))


def test_a_gpu_target_is_refused_where_a_primal_target_is_needed():
    from primal_compiler.target import load_primal_target, require_primal

    assert isinstance(load_primal_target("primal-5nm"), PrimalTarget)
    with pytest.raises(InputError) as info:
        load_primal_target("h100")
    assert info.value.where == "h100" and "is a gpu target" in info.value.problem
    assert "primal-7nm" in info.value.problem and "\n" not in str(info.value)
    with pytest.raises(InputError, match="here: is a gpu target"):
        require_primal(load_target("h100"), "here")


# --------------------------------------------------------------------------- stated ranges


def test_a_stated_range_is_loaded_beside_its_value_and_changes_no_hash(tmp_path):
    t = load_target("primal-7nm")
    assert t.ranges["sram.leakage_uw"] == (0.5, 10.0) and t.sram.leakage_uw == 3.2
    bare = _variant(tmp_path, _replace_line(SEVEN_TEXT, "leakage_uw_range", None, "sram"), "bare.toml")
    assert "sram.leakage_uw" not in load_target(bare).ranges
    assert load_target(bare).content_hash == t.content_hash
    moved = with_overrides(t, {"sram.leakage_uw": 20.0})  # an override leaves its range, keeps the others
    assert "sram.leakage_uw" not in moved.ranges and moved.ranges["router.injection_cycles"] == (0.0, 3.0)


@pytest.mark.parametrize("line,message", [
    ("leakage_uw_range = [4.0, 10.0]", "sram.leakage_uw: 3.2 is outside its stated range 4.0..10.0"),
    ("leakage_uw_range = [0.5]", "sram.leakage_uw_range: expected [low, high]"),
    ("leakage_uw_range = [-1.0, 10.0]", "sram.leakage_uw_range: "),
    ('leakage_uw_range = ["low", 10.0]', "sram.leakage_uw_range: expected a number"),
    ("leakage_uw_range = [10.0, 0.5]", "sram.leakage_uw_range: its low end 10.0 is above its high end 0.5"),
])
def test_a_bad_stated_range_is_one_line_naming_the_key(tmp_path, line, message):
    path = _variant(tmp_path, _replace_line(SEVEN_TEXT, "leakage_uw_range", line, "sram"))
    err = _error(path)
    _assert_one_line(err, path, None)
    assert message in err.problem, err.problem


def test_only_a_number_states_a_range(tmp_path):
    path = _variant(tmp_path, SEVEN_TEXT.replace("[ct]\n", '[ct]\nrouting_range = ["xy", "yx"]\n'))
    _assert_one_line(_error(path), path, "ct.routing_range")
    assert "unknown key" in str(_error(path))


def test_an_extending_file_that_moves_a_value_out_of_its_inherited_range_is_named(tmp_path):
    path = _variant(tmp_path, 'extends = "primal-7nm"\nname = "x"\n[router]\nleakage_uw = 50.0\n', "x.toml")
    err = _error(path)
    _assert_one_line(err, path, "router.leakage_uw")
    assert "outside its stated range 0.15..6.0 (router.leakage_uw_range of" in err.problem


def test_the_all_digital_reference_holds_the_base_tile_in_sram_macros():
    digital = load_target("digital-7nm")
    assert digital.digital_base and digital.base_sram_macros == 256 * 256 * 4 // (256 * 64)
    assert not load_target("primal-7nm").digital_base and load_target("primal-7nm").base_sram_macros == 0
    assert digital.area.rram_um2 == digital.base_sram_macros * digital.area.sram_um2


def test_an_all_digital_base_array_of_the_wrong_area_is_refused(tmp_path):
    path = _variant(tmp_path, 'extends = "digital-7nm"\nname = "x"\n[area]\nrram_um2 = 39120.0\n', "x.toml")
    _assert_one_line(_error(path), path, "area.rram_um2")


def test_the_mvm_time_follows_the_adcs_per_macro():
    """One ADC per crossbar converts all 256 columns of every pulse itself: 32x the ADC bound of 32 ADCs."""
    t = load_target("primal-7nm")
    one = with_overrides(t, {"rram.adcs_per_macro": 1})
    assert one.rram.mvm_latency_cycles == 8 * 4 * 256 + 4
    assert with_overrides(t, {"rram.mvm_drain_cycles": 0}).rram.mvm_latency_cycles == 256


def test_a_typed_mvm_time_is_refused_since_it_is_derived(tmp_path):
    path = _variant(tmp_path, SEVEN_TEXT.replace("[rram]\n", "[rram]\nmvm_latency_cycles = 260\n"))
    _assert_one_line(_error(path), path, "rram.mvm_latency_cycles")


def test_every_structural_assumption_states_a_range():
    """Issue 49: the constants that decide the result carry a stated range, so ``--solve`` can try them."""
    t = load_target("primal-7nm")
    for key in ("system.clock_hz", "system.nmc_issue_cycles", "ct.sequencer_issue_cycles",
                "rram.rows_active_per_read", "rram.adcs_per_macro", "rram.mvm_drain_cycles", "sram.mac_latency_cycles",
                "router.link_bits_per_cycle", "router.hop_latency_cycles", "router.dmac_ops_per_cycle",
                "router.scratchpad_bytes", "d2d.bandwidth_bytes_per_s", "d2d.latency_cycles", "d2d.ports_per_ct",
                "act.rmsnorm_ops_per_element", "act.softmax_ops_per_element", "act.silu_ops_per_element",
                "thermal.leakage_doubling_k"):
        low, high = t.ranges[key]
        assert low <= high, key
