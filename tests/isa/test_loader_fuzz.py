"""Edited program files: whatever a user or another tool does to the payload (re-checksummed), every
consumer ends in a one-line InputError or works. A short hypothesis budget here; benchmarks/fuzz.py runs
the same targets longer."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from primal_compiler.report import collect
from primal_compiler.errors import InputError
from primal_compiler.isa.container import load_program

from .fuzzing import (
    assemble, base_program, base_text, consume, consume_functional, edited_texts, functional_setup, mutants,
    pack_parts, parts,
)

FUZZ = settings(max_examples=80, deadline=None, database=None, suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def base() -> bytes:
    return base_program()


def test_the_base_program_replays(tmp_path, base):
    path = tmp_path / "p.primal"
    path.write_bytes(base)
    assert consume(path) == "replayed"
    meta, arrays, sections = parts(base)
    path.write_bytes(pack_parts(meta, arrays, sections))  # the re-packer writes what save_program writes
    assert path.read_bytes() == base


@FUZZ
@given(data=mutants())
def test_edited_program_files_end_in_input_error(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("fuzz") / "program.primal"
    path.write_bytes(data)
    consume(path)  # raises on anything but InputError


@settings(FUZZ, max_examples=30)
@given(data=mutants(base=lambda: functional_setup()[0]))
def test_edited_programs_replay_functionally_or_end_in_input_error(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("fuzz") / "program.primal"
    path.write_bytes(data)
    consume_functional(path)


def write(tmp_path, meta, arrays, sections):
    path = tmp_path / "program.primal"
    path.write_bytes(pack_parts(meta, arrays, sections))
    return path


def refused(path, message: str) -> None:
    with pytest.raises(InputError) as exc:
        collect.load_compiled(path, None)
    assert exc.value.where == str(path) and message in exc.value.problem, exc.value.problem
    assert "\n" not in str(exc.value)


# Each case was an escape of the fuzz (or of the reports) before the loader checked it.
EDITS = {
    "a section renamed": (lambda m, a, s: s[-1].__setitem__(0, "decode:7"), "section 2 decode:7: found where decode:0"),
    "decode cut off": (lambda m, a, s: (a.__setitem__("stream.records", a["stream.records"][: s.pop()[1]]),
                                        [a.pop(k) for k in ("pg_ct", "pg_on", "pg_off", "pg_sram_off")]),
                       "section decode:0: missing, the program ends after section prefill:0"),
    "decode merged into prefill": (lambda m, a, s: (s.pop(), s[-1].__setitem__(2, len(a["stream.records"]))),
                                   "section prefill:0: 2 controller ARGMAX records, needs one per pass, each its own TOKEN buffer"),
    "sections swapped": (lambda m, a, s: s.__setitem__(slice(1, 3), [["decode:0", *s[1][1:]],
                                                                      ["prefill:0", *s[2][1:]]]),
                         "section 1 decode:0: found where prefill:0 belongs"),
    "package_cols a string": (lambda m, a, s: m.__setitem__("package_cols", "2"),
                              "meta package_cols: expected an integer"),
    "package_cols huge": (lambda m, a, s: m.__setitem__("package_cols", 10**12), "meta package_cols"),
    "kv not an object": (lambda m, a, s: m.__setitem__("kv", []), "meta kv: expected an object"),
    "batch zero": (lambda m, a, s: m["kv"].__setitem__("batch", 0), "meta kv.batch: expected an integer in 1.."),
    "rings one too many": (lambda m, a, s: m["kv"].__setitem__("rings", [m["kv"]["context"]] * (m["num_layers"] + 1)),
                           "meta kv.rings: expected one ring per layer"),
    "a ring not whole chunks": (lambda m, a, s: m["kv"].__setitem__("rings", [m["kv"]["chunk_tokens"] + 1] * m["num_layers"]),
                                "each a multiple of kv.chunk_tokens"),
    "a short ring without a window": (lambda m, a, s: m["kv"].__setitem__("rings", [m["kv"]["chunk_tokens"]] * m["num_layers"]),
                                     "meta kv.rings[0]: 32 tokens, shorter than kv.context 2048, but layer 0 has no "
                                     "sliding window"),
    "model_ir a list": (lambda m, a, s: m.__setitem__("model_ir", [1]), "meta model_ir: expected a JSON object"),
    "hidden a string": (lambda m, a, s: m["model_ir"].__setitem__("hidden_size", "256"),
                        "meta model_ir: not a model description"),
    "in_features a float": (lambda m, a, s: m["model_ir"]["layers"][0]["linears"][0].__setitem__("in_features", 256.5),
                            "meta model_ir.layers[0].linears[0].in_features: expected an int"),
    "model a number": (lambda m, a, s: m.__setitem__("model", 7), "meta model: expected a string"),
    "num_cts beyond ct_layer": (lambda m, a, s: m.__setitem__("num_cts", m["num_cts"] + 1),
                                "array ct_layer: 3 entries, expected 4"),
    "mesh shrunk": (lambda m, a, s: m.__setitem__("mesh_rows", 4), ">= mesh_rows*mesh_cols 128"),
    "mesh edited": (lambda m, a, s: m.__setitem__("mesh_rows", 64),
                    "meta mesh_rows, mesh_cols: 64x32, but target primal-7nm has 32x32 PEs per CT"),
    "ct_template out of range": (lambda m, a, s: a["ct_template"].__setitem__(0, 9), "array ct_template: entry 0 is 9"),
    "empty flow table": (lambda m, a, s: [a.__setitem__(k, a[k][:0]) for k in ("map_src_pe", "map_dst_pe", "map_hops")],
                         "array map_src_pe: 0 entries, expected 1"),
    "tile_pe outside the mesh": (lambda m, a, s: a["tile_pe"].__setitem__(3, 1024), "array tile_pe: entry 3 is 1024"),
    "tile_host dangling": (lambda m, a, s: a["tile_host"].__setitem__(np.flatnonzero(a["tile_macro"] == 1)[0], 10**6),
                           "array tile_host"),
    "kv_pe outside the mesh": (lambda m, a, s: a["kv_pe"].__setitem__(0, 4000), "array kv_pe: entry 0 is 4000"),
    "kv on another layer's CT": (lambda m, a, s: a["kv_ct"].__setitem__(0, 2),
                                 "a layer's KV cache stays in its own CTs"),
    "pg_on not a PG_ON": (lambda m, a, s: a["pg_on"].__setitem__(0, 0), "array pg_on: entry 0 names record 0"),
    "a LoRA macro switched off": (lambda m, a, s: a["pg_sram_off"].__setitem__(0, m["mesh_rows"] * m["mesh_cols"]),
                                  "array pg_sram_off: entry 0 (CT 0) switches off"),
    "tile column dropped": (lambda m, a, s: a.pop("tile_role"), "array tile_role: missing"),
    "tile column re-typed": (lambda m, a, s: a.__setitem__("tile_ct", a["tile_ct"].astype(np.int64)),
                             "array tile_ct: expected a 1-D int32 array"),
    "format dropped": (lambda m, a, s: m.pop("format"), "meta format: None, not 'primal-program'"),
}


@pytest.mark.parametrize("edit", EDITS, ids=list(EDITS))
def test_each_edit_is_one_line_naming_the_field(tmp_path, base, edit):
    change, message = EDITS[edit]
    meta, arrays, sections = parts(base)
    change(meta, arrays, sections)
    refused(write(tmp_path, meta, arrays, sections), message)


@pytest.mark.parametrize("field, value, message", [
    ("dst_ct", 0xFFFF, "UNICAST needs a destination CT or ctl, got none"),
    ("dst_pe", 0xFFFF, "UNICAST to a CT needs a destination PE, got none"),
])
def test_records_routed_nowhere_are_illegal(tmp_path, base, field, value, message):
    """A UNICAST without destination used to walk links outside the mesh inside the compiled replay."""
    meta, arrays, sections = parts(base)
    r = arrays["stream.records"]
    i = int(np.flatnonzero((r["op"] == 2) & (r["dst_ct"] < meta["num_cts"]))[0])
    r[field][i] = value
    path = write(tmp_path, meta, arrays, sections)
    with pytest.raises(InputError, match=re.escape(f"record {i} field {field}: {message}")):
        load_program(path)


def test_header_json_that_only_python_reads_is_refused(tmp_path, base):
    from .fuzzing import pack, unpack

    header, payload = unpack(base)
    for text, message in ((b'{"meta": NaN}', "NaN is not a JSON number"), (b"[" * 100_000, "nested too deeply"),
                          (b'{"x": 1e999}', "out of range")):
        (tmp_path / "p").write_bytes(pack(text, payload))
        with pytest.raises(InputError, match=message):
            load_program(tmp_path / "p")
    header["arrays"][5]["offset"] = header["arrays"][4]["offset"]  # two arrays sharing bytes
    (tmp_path / "p").write_bytes(pack(header, payload))
    with pytest.raises(InputError, match="overlaps the array before it"):
        load_program(tmp_path / "p")


# --------------------------------------------------------------------------- assembly text


@pytest.fixture(scope="module")
def text() -> str:
    return base_text()


def asm_error(text: str) -> str:
    from primal_compiler.isa.text import asm

    with pytest.raises(InputError) as exc:
        asm(text, "prog.s")
    assert "\n" not in str(exc.value) and exc.value.where == "prog.s"
    return exc.value.problem


def test_truncated_text_is_refused_in_one_line(text):
    lines = text.split("\n")
    decode = lines.index(".section decode:0")
    problem = asm_error("\n".join(lines[:decode]))
    assert problem.startswith("line 1: the first line declares ") and "(truncated?" in problem
    # without disasm's first line: the power schedule names records that are gone
    assert "array pg_on: entry 2 names record 2748, but the stream has records 0..2747 (truncated?)" in \
        asm_error("\n".join(lines[1:decode]))
    # and in a program compiled without srpg the missing section itself is named, at the last line
    lines = base_text(None, "lower-tiles,blocking,zcurve-order,kv-ring,codegen").split("\n")
    decode = lines.index(".section decode:0")
    assert asm_error("\n".join(lines[1:decode])) == (f"line {decode - 1}: section decode:0: missing, the program ends "
                                                     "after section prefill:0 (truncated?)")


@FUZZ
@given(cut=st.integers(0, 10**6))
def test_text_cut_anywhere_is_refused(text, cut):
    lines = text.rstrip("\n").split("\n")
    assert asm_error("\n".join(lines[: cut % len(lines)])).startswith("line ")


@FUZZ
@given(edited=edited_texts())
def test_edited_text_assembles_only_to_loadable_programs(tmp_path_factory, edited):
    assemble(edited, tmp_path_factory.mktemp("asm"))


# --------------------------------------------------------------------------- the commands


def test_run_accepts_an_assembled_program_file_of_any_name(tmp_path, capsys, text):
    from primal_compiler.cli import main

    (tmp_path / "p.s").write_text(text)
    assert main(["asm", str(tmp_path / "p.s"), "-o", str(tmp_path / "prog.bin")]) == 0
    capsys.readouterr()
    assert main(["run", str(tmp_path / "prog.bin"), "--json"]) == 0  # recognised by its magic, not its name
    assert '"model": "tiny-llama"' in capsys.readouterr().out


def test_commands_refuse_edited_and_plain_programs_in_one_line(tmp_path, capsys, base):
    from primal_compiler.cli import main
    from primal_compiler.isa.container import save_program

    from . import small_program

    save_program(tmp_path / "plain.primal", *small_program())
    meta, arrays, sections = parts(base)
    arrays["tile_pe"][0] = 5000
    (tmp_path / "edited.primal").write_bytes(pack_parts(meta, arrays, sections))
    for argv in (["run", str(tmp_path / "plain.primal")], ["run", str(tmp_path / "edited.primal")],
                 ["viz", str(tmp_path / "edited.primal"), "-o", str(tmp_path / "v")],
                 ["disasm", str(tmp_path / "edited.primal")]):
        assert main(argv) == 2, argv
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 4 and all(line.startswith("primal: ") for line in err), err
    assert "plain.primal: meta format: None, not 'primal-program'" in err[0]
    assert all("edited.primal: array tile_pe: entry 0 is 5000, outside 0..1023" in line for line in err[1:])
    assert not (tmp_path / "v").exists()


@pytest.mark.parametrize("content", [b'[{"name": 1}]', b'{"name": "x"}', b'[{"name": "x", "seconds": "fast"}]',
                                     b'[{"name": "x", "seconds": NaN}]', b'[{"name": "x"}', b"\xff\xfe[]", b"[" * 50_000])
def test_viz_refuses_a_bad_records_file_in_one_line(tmp_path, base, content):
    from primal_compiler.viz import data

    (tmp_path / "program.primal").write_bytes(base)
    (tmp_path / "records.json").write_bytes(content)
    with pytest.raises(InputError) as exc:
        data.load(tmp_path)
    assert exc.value.where == str(tmp_path / "records.json") and "\n" not in str(exc.value)


def test_a_pipeline_that_does_not_parse_names_the_file_when_the_program_is_rebuilt(tmp_path, base):
    """An escape of the fuzz: the loader takes any string, the Program rebuild parses it."""
    meta, arrays, sections = parts(base)
    meta["pipeline"] = "primal-7nm"
    path = write(tmp_path, meta, arrays, sections)
    with pytest.raises(InputError) as exc:
        collect.load_compiled(path, None).program()
    assert exc.value.where == str(path) and "meta pipeline: pass primal-7nm: unknown pass" in exc.value.problem


def test_a_precision_without_a_width_replays_at_its_default(tmp_path, base):
    """An escape of the fuzz: model_ir's precision may leave a width at its default; the replay read it raw."""
    meta, arrays, sections = parts(base)
    del meta["model_ir"]["precision"]["kv_bits"]
    assert consume(write(tmp_path, meta, arrays, sections)) == "replayed"
