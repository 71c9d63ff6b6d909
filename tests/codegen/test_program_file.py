"""A compiled program round-trips through the container and its text form, and is checked on load."""

from __future__ import annotations

import numpy as np
import pytest

from primal_compiler import cli
from primal_compiler.compiled import write_compiled
from primal_compiler.errors import InputError
from primal_compiler.isa.container import PROGRAM_FILE, load_program
from primal_compiler.isa.text import asm, disasm
from primal_compiler.target import load_target


def test_written_program_loads_with_every_part(gated, small_target, tmp_path):
    write_compiled(gated, small_target, tmp_path / "out")
    meta, arrays, stream = load_program(tmp_path / "out" / PROGRAM_FILE, small_target)
    assert stream.records.tobytes() == gated.stream.records.tobytes()
    assert stream.sections == gated.stream.sections
    assert meta["num_cts"] == gated.layout.num_cts and meta["kv"]["batch"] == 2
    assert "srpg" in meta["pipeline"] and meta["target_hash"] == small_target.content_hash
    assert np.array_equal(arrays["tile_pe"], gated.tiles.pe) and np.array_equal(arrays["kv_ct"], gated.kv.ct)
    assert len(arrays["pg_ct"]) == len(gated.power["pg_ct"])
    with pytest.raises(InputError, match="compiled for target"):
        load_program(tmp_path / "out" / PROGRAM_FILE, load_target("primal-7nm"))


def test_text_form_of_a_real_program_round_trips(gated, small_target, tmp_path):
    write_compiled(gated, small_target, tmp_path / "out")
    meta, arrays, stream = load_program(tmp_path / "out" / PROGRAM_FILE)
    text = disasm(meta, arrays, stream)
    again = disasm(*asm(text))
    assert again == text
    assert cli.main(["disasm", str(tmp_path / "out"), "-o", str(tmp_path / "p.txt")]) == 0
    assert cli.main(["asm", str(tmp_path / "p.txt"), "-o", str(tmp_path / "p2.primal")]) == 0
    assert (tmp_path / "p2.primal").read_bytes() == (tmp_path / "out" / PROGRAM_FILE).read_bytes()
