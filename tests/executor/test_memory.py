"""Scratchpad occupancy (``executor/memory.py``) against hand computations from the model and its tiles.

The buffer sizes the occupancy model reads from the records (``nbytes``, ``count``, the tiles' shapes) are
checked against sizes computed here from the model's dimensions alone: a hub's hidden vector is
``hidden_size`` activations, a tile's input block its rows of activations, its partial sums its columns at
``psum_bits``, a root its column block of partial sums, the KV of a PE its allocated chunks; a prefill
holds them for every prompt token. The peak is checked against a direct count, and an overflow is named.
"""

from __future__ import annotations

import numpy as np
import pytest

from primal_compiler.compiled import program_file
from primal_compiler.errors import InputError
from primal_compiler.executor import memory
from primal_compiler.executor.replay import replay
from primal_compiler.ir.model import NormKind, Role
from primal_compiler.ir.tiles import ROLE_INDEX, Macro, Part
from primal_compiler.isa.opcodes import BufKind, HiddenBuf, buf, hidden, step_ends
from primal_compiler.target import with_overrides
from tests.functional.conftest import compiled, replay_target  # noqa: F401  (replay_target: a fixture)

PROMPT = 6
CASES = ["llama_lora_qv_r4_torchscript", "gpt2_lora_cattn_r4_dynamo", "opt_lora_qv_r4_optimum"]


@pytest.fixture(scope="module")
def occupied(replay_target):  # noqa: F811
    done = {}

    def get(case: str):
        if case not in done:
            program = compiled(case, replay_target, PROMPT, 1)
            meta, arrays = program_file(program, replay_target)
            done[case] = program, replay(meta, arrays, program.stream, replay_target).memory
        return done[case]

    return get


def _sizes(program, m: memory.Memory, tag: int, pass_: int) -> dict[tuple[int, int], int]:
    """(ct, pe) -> bytes of every instance of buffer ``tag`` in pass ``pass_``."""
    passes = np.concatenate([[0], np.cumsum(step_ends(program.stream.records))[:-1]])
    mine = np.flatnonzero(((m.inst_loc & 0xFFFF) == tag) & (passes[m.inst_first] == pass_))
    return {(int(m.inst_loc[i] >> 32), int((m.inst_loc[i] >> 16) & 0xFFFF)): int(m.inst_bytes[i]) for i in mine}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("pass_, vectors", [(0, PROMPT), (1, 1)], ids=["prefill", "decode"])
def test_buffer_sizes_follow_the_model_dimensions(case, pass_, vectors, occupied):
    program, m = occupied(case)
    model, t = program.model, program.tiles
    act, psum = model.precision.activation_bits // 8, -(-model.precision.psum_bits // 8)  # stored in whole bytes
    rows = int(t.rows[t.macro == Macro.RRAM].max())  # the crossbar's rows: a hub shard
    for hb in (HiddenBuf.X_NORM, HiddenBuf.MID, HiddenBuf.OUT):
        for i in range(-(-model.hidden_size // rows)):
            n = min(rows, model.hidden_size - i * rows)
            sizes = sorted(_sizes(program, m, hidden(hb, i), pass_).values())
            head = [n * act] if hb == HiddenBuf.X_NORM else []  # the LM head norms the last token only
            assert sizes == sorted(head + [n * act * vectors] * model.num_layers), (hb, i)
        stats = sorted(_sizes(program, m, hidden(HiddenBuf.TOTAL), pass_).values())
        k = 1 if model.norm == NormKind.RMS else 2  # the sum of squares, and for a LayerNorm the sum
        assert stats and set(stats) <= {k * psum * vectors, k * psum}  # at psum_bits
    layer = model.layers[0]
    for role in (Role.Q, Role.QKV, Role.UP, Role.FC1):
        lin = layer.linear(role)
        if lin is None:
            continue
        cols = int(t.cols[t.macro == Macro.RRAM].max())  # the crossbar's columns: a root's block
        for j in range(-(-lin.out_features // cols)):
            sizes = _sizes(program, m, buf(BufKind.ROOT, ROLE_INDEX[role] << 8 | j), pass_)
            n = min(cols, lin.out_features - j * cols)
            assert sorted(sizes.values()) == [n * psum * vectors] * model.num_layers, (role, j)
    rram = np.flatnonzero((t.macro == Macro.RRAM) & (t.part == Part.BASE))
    tile_in, tile_psum = _sizes(program, m, buf(BufKind.IN, 0), pass_), _sizes(program, m, buf(BufKind.PSUM, 0), pass_)
    for r in rram:
        where, v = (int(t.ct[r]), int(t.pe[r])), 1 if t.layer[r] == model.num_layers else vectors  # the LM head: 1
        assert tile_in[where] == t.rows[r] * act * v
        assert tile_psum[where] == t.cols[r] * psum * v


def test_kv_bytes_are_the_allocated_chunks(occupied):
    program, m = occupied(CASES[0])
    kv = program.kv
    expected = np.zeros_like(m.kv_bytes)
    for ct, pe in zip(kv.ct.tolist(), kv.pe.tolist()):
        expected[ct * m.pes + pe] += kv.chunk_tokens * kv.head_dim * kv.kv_bytes
    assert (m.kv_bytes == expected).all() and expected.sum() == kv.units_per_layer().sum() * kv.chunk_bytes


def test_peak_follows_the_live_buffers_by_hand(occupied):
    """The sweep against a direct count: every PE's peak is the largest sum of its instances live at once."""
    _, m = occupied(CASES[0])
    pe_key = (m.inst_loc >> 32) * m.pes + ((m.inst_loc >> 16) & 0xFFFF)
    for key in np.unique(pe_key)[:12]:
        mine = np.flatnonzero(pe_key == key)
        levels = [m.inst_bytes[mine][(m.inst_begin[mine] <= t) & (m.inst_end[mine] > t)].sum()
                  for t in m.inst_begin[mine]]
        assert m.peak_bytes[key] == m.kv_bytes[key] + max(levels)


def test_a_scratchpad_too_small_is_named(replay_target):  # noqa: F811
    small = with_overrides(replay_target, {"router.scratchpad_bytes": 512})
    program = compiled(CASES[0], replay_target, PROMPT, 1)
    meta, arrays = program_file(program, replay_target)
    m = replay(meta, arrays, program.stream, small).memory
    assert m.overflow is not None and m.pes_over > 0
    with pytest.raises(InputError, match=r"record \d+ \(\w+\) writes \w+\.0x[0-9a-f]+ .* at CT \d+ PE \d+: its "
                                         r"scratchpad then holds [\d,]+ B \([\d,]+ B of KV\) of 512 B"):
        memory.check(m, program.stream.records, "prog")
    roomy = replay(meta, arrays, program.stream, replay_target).memory
    assert roomy.overflow is None and memory.summary(roomy, program.stream.records)["fits"]


def test_instances_sized_in_chunks_are_the_same(replay_target, monkeypatch):  # noqa: F811
    """``buffers.instances`` sizes its footprint rows ``CHUNK_ROWS`` at a time: chunks of 7 rows and of 1 M give
    the same instances, element for element (the fixtures have fewer rows than one default chunk)."""
    from primal_compiler.executor import buffers, deps

    program = compiled(CASES[0], replay_target, PROMPT, 1)
    meta, arrays = program_file(program, replay_target)
    rp = replay(meta, arrays, program.stream, replay_target)
    prints = deps.footprints(program.stream)
    sizing = buffers.Sizing(rp.topo.pes, rp.ctx.rram_rows, rp.ctx.rram_cols, rp.ctx.sram_rows, rp.ctx.sram_cols,
                            replay_target.router.dmac_bits, memory.precision(meta))
    whole = buffers.instances(program.stream, prints, sizing)
    monkeypatch.setattr(buffers, "CHUNK_ROWS", 7)
    chunked = buffers.instances(program.stream, prints, sizing)
    assert len(prints.rec) > 7 * 10
    for name in ("loc", "bytes", "cut", "rec", "write"):
        assert np.array_equal(getattr(whole, name), getattr(chunked, name)), name
