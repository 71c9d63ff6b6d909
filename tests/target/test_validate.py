"""target.validate: the pydantic model of a table class, the first problem in reading order, in the loader's words."""

from __future__ import annotations

from primal_compiler.target import load_target
from primal_compiler.target.spec import PrimalTarget
from primal_compiler.target.validate import leaf, model, validated


def _raw() -> dict:
    return load_target("primal-7nm").to_dict()


def test_the_bundled_target_validates_and_its_model_is_built_once():
    valid, problem = validated(PrimalTarget, _raw())
    assert problem is None and valid.rram.adc_bits == load_target("primal-7nm").rram.adc_bits
    assert model(PrimalTarget) is model(PrimalTarget)


def test_the_first_problem_is_the_one_a_reader_meets_first():
    """Unknown keys of a table come before its fields, fields in declaration order, nested tables depth first;
    all in the loader's words."""
    raw = _raw()
    raw["rram"]["adc_bits"] = "6"
    raw["rram"]["adc_bitz"] = 6
    raw["router"]["ports"] = 4.0
    _, p = validated(PrimalTarget, raw)
    assert (p.key, p.message) == ("rram.adc_bitz", "unknown key (did you mean 'adc_bits'?)")
    del raw["rram"]["adc_bitz"]
    _, p = validated(PrimalTarget, raw)
    assert (p.key, p.message) == ("rram.adc_bits", 'expected an integer, got string "6"')
    raw["rram"]["adc_bits"] = True
    assert validated(PrimalTarget, raw)[1].message == "expected an integer, got boolean true"
    raw["rram"]["adc_bits"] = 6
    _, p = validated(PrimalTarget, raw)
    assert (p.key, p.message) == ("router.ports", "expected an integer, got float 4.0")
    del raw["router"]
    _, p = validated(PrimalTarget, raw)
    assert p.key == "router" and p.missing and p.message.startswith("missing key (")


def test_rules_and_a_stated_ranges_ends():
    """A float field accepts an integer (as a float) and refuses infinity; a rule names its bound and the value;
    a range's end goes through the same field's rules (leaf)."""
    from primal_compiler.target.spec import RramSpec

    raw = _raw()
    raw["ct"]["mesh_rows"] = 0
    assert validated(PrimalTarget, raw)[1].message == "must be >= 1, got 0"
    raw["ct"]["mesh_rows"] = 32
    raw["rram"]["leakage_uw"] = float("inf")
    assert validated(PrimalTarget, raw)[1].message == "must be finite, got inf"
    assert leaf(RramSpec, "leakage_uw", 3) == (3.0, None)
    assert leaf(RramSpec, "array_read_energy_pj", -1)[1] == "must be > 0, got -1.0"
    assert leaf(RramSpec, "input_mode", "analog")[1] == "must be one of 'bit-serial', 'dac', got 'analog'"


def test_a_huge_number_is_shown_by_its_size_and_a_blank_text_by_str_strip():
    raw = _raw()
    raw["rram"]["adc_bits"] = 10**400
    assert validated(PrimalTarget, raw)[1].message == "must be <= 16, got an integer of about 400 digits"
    raw["rram"]["adc_bits"] = 6
    raw["rram"]["leakage_uw"] = 10**400
    assert validated(PrimalTarget, raw)[1].message == "expected a number, got an integer of about 400 digits"
    raw["rram"]["leakage_uw"] = 1.0
    raw["description"] = "\x1f"  # whitespace to str.strip, as the loader has always judged it
    assert validated(PrimalTarget, raw)[1].message == "must not be empty"
