"""A sliding layer's KV ring holds its window and one pass, and wraps: Gemma-2 replayed past it, exactly.

Gemma-2's layer 0 sees the last 32 keys, layer 1 every key. Prefilled in passes of 8 tokens with chunks of
32, layer 0 keeps 32 + 8 - 1 = 39 positions in two chunks (64 tokens), layer 1 the context's 2048; a
40-token prompt and 30 generated tokens reach position 69, so layer 0's ring wraps in the decode. The
replay (whose KV slots hold only what the records appended) equals onnxruntime's logits and tokens.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from primal_compiler.errors import InputError
from primal_compiler.frontend import load_model
from primal_compiler.functional import compile_for_replay, replay_functional
from primal_compiler.target import load_primal_target

GEMMA2 = str(Path(__file__).resolve().parents[1] / "fixtures" / "onnx" / "families" / "gemma2.onnx")
PROMPT, GENERATE = list(range(1, 41)), 30


def _replayed_and_onnxruntime(program, target, prompt: list[int], generate: int):
    """(the exact replay's logits, onnxruntime's), the replay fed onnxruntime's greedy tokens."""
    from primal_compiler.report.check import ort_greedy

    want = ort_greedy(GEMMA2, prompt, generate)
    forced = [int(t) for t in want.argmax(axis=1)][: generate - 1]
    got = replay_functional(program, target, GEMMA2, None, prompt=prompt, generate=generate, precision="exact",
                            where=GEMMA2, force=forced).logits
    return got, want


def test_a_wrapped_window_ring_replays_as_onnxruntime():
    pytest.importorskip("onnxruntime")
    target = load_primal_target("primal-7nm")
    program = compile_for_replay(load_model(GEMMA2), target, len(PROMPT), GENERATE, prefill_chunk=8)
    assert program.kv.rings == (64, 2048)
    got, want = _replayed_and_onnxruntime(program, target, PROMPT, GENERATE)
    assert float(np.abs(got - want).max() / np.abs(want).max()) < 1e-5
    assert (got.argmax(axis=1) == want.argmax(axis=1)).all()


def test_a_prefill_pass_longer_than_the_ring_was_sized_for_is_refused():
    """The ring sized for passes of 8 tokens (64 positions), an 80-token prompt asked for in passes of 40: the
    second pass's first query reads back to position 9 while the pass writes 40..79, 71 positions; refused
    naming both options."""
    from primal_compiler.api import compile_model

    target = load_primal_target("primal-7nm")
    with pytest.raises(InputError, match=r"codegen.prefill_chunk: a prefill pass of 40 tokens would overwrite "
                                         r"keys it reads in layer 0's ring of 64 tokens .*chunks of at most 33 "
                                         r"tokens or give kv-ring pass_tokens=40"):
        compile_model(load_model(GEMMA2), target, "lower-tiles,blocking,zcurve-order,kv-ring{pass_tokens=8},"
                                                  "codegen{prompt=80,prefill_chunk=40}")


def test_the_window_ring_is_written_read_back_and_replayed(tmp_path):
    """The program file keeps the rings (``kv.rings``); read back, it runs, and its KV takes (64 + 2048) /
    (2048 + 2048) of the bytes the same model without its window takes."""
    from dataclasses import replace

    import primal_compiler as pc
    from primal_compiler.api import last_details
    from primal_compiler.compiled import write_compiled

    target = load_primal_target("primal-7nm")
    model = load_model(GEMMA2)
    program = compile_for_replay(model, target, len(PROMPT), GENERATE, prefill_chunk=8)
    write_compiled(program, target, tmp_path / "out")
    loaded = pc.load_program(tmp_path / "out")
    assert loaded.kv.rings == (64, 2048) and (loaded.kv.ct == program.kv.ct).all()
    assert pc.run(tmp_path / "out")["metrics"]["ttft_s"] > 0
    unwindowed = replace(model, layers=tuple(replace(x, window=0) for x in model.layers))
    full = compile_for_replay(unwindowed, target, len(PROMPT), GENERATE, prefill_chunk=8)
    assert full.kv.rings == (2048, 2048)
    assert last_details(program, "kv")["kv_bytes"] * 4096 == last_details(full, "kv")["kv_bytes"] * (64 + 2048)


def test_passes_that_wrap_the_window_ring_replay_as_onnxruntime():
    """Chunks of 8, passes of 12 over an 80-token prompt: layer 0 keeps 32 + 12 - 1 = 43 positions in six
    chunks (48), so the prefill passes themselves wrap the ring (positions 48-59 land in chunks 0-1 while
    the pass still reads 17-47); the replay equals onnxruntime's logits."""
    pytest.importorskip("onnxruntime")
    target, prompt, generate = load_primal_target("primal-7nm"), [1 + (i * 7) % 50 for i in range(80)], 12
    program = compile_for_replay(load_model(GEMMA2), target, len(prompt), generate, prefill_chunk=12,
                                 pipeline="lower-tiles,blocking,zcurve-order,kv-ring{chunk_tokens=8,context=256},codegen")
    assert program.kv.rings == (48, 256)
    got, want = _replayed_and_onnxruntime(program, target, prompt, generate)
    assert float(np.abs(got - want).max() / np.abs(want).max()) < 1e-5


def test_a_ring_shorter_than_its_layers_window_is_refused_on_load(tmp_path):
    """A program file whose model says layer 0 sees 100 keys while its ring holds 64: one line naming kv.rings[0]
    (it had replayed, silently with a shorter window)."""
    from primal_compiler.compiled import write_compiled
    from primal_compiler.isa.container import PROGRAM_FILE
    from primal_compiler.report.collect import load_compiled
    from tests.isa.fuzzing import pack_parts, parts

    target = load_primal_target("primal-7nm")
    program = compile_for_replay(load_model(GEMMA2), target, len(PROMPT), 2, prefill_chunk=8)
    write_compiled(program, target, tmp_path / "out")
    meta, arrays, sections = parts((tmp_path / "out" / PROGRAM_FILE).read_bytes())
    meta["model_ir"]["layers"][0]["window"] = 100
    edited = tmp_path / "edited.primal"
    edited.write_bytes(pack_parts(meta, arrays, sections))
    with pytest.raises(InputError, match=r"meta kv.rings\[0\]: 64 tokens, shorter than layer 0's sliding window of 100"):
        load_compiled(edited, None)
