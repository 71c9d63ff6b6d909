"""The replay cache: a hit gives the full replay's figures, and nothing but an intact entry of this very replay
is ever read."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from primal_compiler.cli import main
from primal_compiler.executor import cache as replay_cache
from primal_compiler.executor.cache import ReplayCache
from primal_compiler.executor.critical import critical_path
from primal_compiler.executor.metrics import metrics
from primal_compiler.executor.replay import replay
from primal_compiler.target import with_overrides


def _figures(rp) -> str:
    m = metrics(rp)
    m.pop("replay_s")
    return json.dumps(m, sort_keys=True)


def _entries(c: ReplayCache) -> list:
    return sorted(c.directory.glob("*.npz"))


@pytest.fixture
def said() -> list[str]:
    return []


@pytest.fixture
def store(tmp_path, said) -> ReplayCache:
    return ReplayCache(tmp_path / "replays", say=said.append)


def _replay(compiled, target, store=None, **kw):
    program, meta, arrays = compiled
    return replay(meta, arrays, program.stream, target, cache=store, **kw)


def test_a_hit_gives_the_full_replays_figures(compiled, replayed, small_target, store, said):
    first = _replay(compiled, small_target, store)
    assert not first.from_cache and len(_entries(store)) == 1
    again = _replay(compiled, small_target, store)
    assert again.from_cache and [name for name, _ in again.stages] == ["control", "cache", "transfers", "costs", "power"]
    assert _figures(again) == _figures(first) == _figures(replayed)
    for name in ("link_ptr", "link", "link_offset", "tree_at", "tree"):  # what a traffic map draws
        assert np.array_equal(getattr(again.transfers, name), getattr(replayed.transfers, name))
    light = _replay(compiled, small_target, store, rows=False)  # a hit without the link rows: the same figures
    assert light.from_cache and _figures(light) == _figures(replayed) and len(replayed.transfers.link)
    assert not len(light.transfers.link) and not len(light.transfers.tree) and not light.transfers.link_ptr.any()
    assert np.array_equal(light.transfers.net_cycles, replayed.transfers.net_cycles)
    assert len(_replay(compiled, small_target, None, rows=False).transfers.link)  # scheduled: its rows, whatever is asked
    for name in ("dispatch", "start", "finish"):
        assert np.array_equal(getattr(again, name), getattr(replayed, name)) and getattr(again, name).dtype == np.int64
    assert np.array_equal(again.memory.peak_bytes, replayed.memory.peak_bytes)
    assert said == []


def test_the_entry_is_what_a_hit_reads(compiled, small_target, store):
    """An entry whose finish cycles were moved (and signed again) moves the figures: the hit really reads it."""
    base = _figures(_replay(compiled, small_target, store))
    (path,) = _entries(store)
    with np.load(path) as z:
        stored = {k: z[k] for k in z.files}
    header = json.loads(bytes(stored.pop("header")).decode())
    stored.pop("checksum")
    stored["finish"] = stored["finish"] + 1000
    np.savez(path, **stored, header=np.frombuffer(json.dumps(header).encode(), np.uint8),
             checksum=np.frombuffer(replay_cache._checksum(header, stored).encode(), np.uint8))
    assert _figures(_replay(compiled, small_target, store)) != base


def test_energy_only_changes_hit_and_timing_changes_miss(compiled, small_target, store):
    _replay(compiled, small_target, store)
    pricier = with_overrides(small_target, {"router.energy_pj_per_bit_hop": small_target.ranges[
        "router.energy_pj_per_bit_hop"][1], "thermal.ambient_c": 40.0})
    hit = _replay(compiled, pricier, store)
    assert hit.from_cache and _figures(hit) == _figures(_replay(compiled, pricier))
    slower = with_overrides(small_target, {"router.hop_latency_cycles": small_target.router.hop_latency_cycles + 1})
    assert not _replay(compiled, slower, store).from_cache
    assert not _replay(compiled, small_target, store, mode="central").from_cache
    assert len(_entries(store)) == 3


def test_a_throttled_replay_is_never_kept(compiled, small_target, store):
    assert not _replay(compiled, small_target, store, max_active_pes=1).from_cache
    assert _entries(store) == []


@pytest.mark.parametrize("damage", ["flip", "truncate", "foreign"])
def test_a_damaged_entry_is_said_never_used_and_replaced(compiled, replayed, small_target, store, said, damage):
    _replay(compiled, small_target, store)
    (path,) = _entries(store)
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0xFF
    path.write_bytes(data[: len(data) // 3] if damage == "truncate" else b"not a cache entry" if damage == "foreign"
                     else data)
    rp = _replay(compiled, small_target, store)
    assert not rp.from_cache and _figures(rp) == _figures(replayed)
    assert len(said) == 1 and said[0].startswith(str(path)) and "\n" not in said[0]
    assert _replay(compiled, small_target, store).from_cache  # the entry written again is whole


def test_an_unwritable_directory_is_said_and_the_replay_runs(compiled, replayed, small_target, tmp_path, said):
    (tmp_path / "file").write_text("a user's file")
    c = ReplayCache(tmp_path / "file" / "replays", say=said.append)
    rp = _replay(compiled, small_target, c)
    assert _figures(rp) == _figures(replayed) and (tmp_path / "file").read_text() == "a user's file"
    assert len(said) == 1 and "replay cache not written" in said[0]


def test_an_entry_name_held_by_a_fifo_is_left_alone(compiled, small_target, store, said):
    _replay(compiled, small_target, store)
    (path,) = _entries(store)
    path.unlink()
    os.mkfifo(path)
    assert not _replay(compiled, small_target, store).from_cache
    assert path.is_fifo() and "left alone" in said[-1]


def test_the_least_recently_used_entries_go_past_the_limit(compiled, small_target, tmp_path):
    c = ReplayCache(tmp_path / "replays", limit_bytes=1)
    (c.directory).mkdir()
    (c.directory / "notes.txt").write_text("kept")
    _replay(compiled, small_target, c)
    first = _entries(c)
    _replay(compiled, small_target, c, mode="central")
    kept = _entries(c)
    assert len(kept) == 1 and kept != first  # the newer one stays, even over the limit
    assert (c.directory / "notes.txt").read_text() == "kept"


def test_the_critical_path_needs_a_full_replay(compiled, small_target, store):
    _replay(compiled, small_target, store)
    with pytest.raises(ValueError, match="full replay"):
        critical_path(_replay(compiled, small_target, store))


def test_primal_run_reads_what_it_kept(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["compile", "tiny-llama", "-p", "fast", "-o", str(out)]) == 0
    runs = []
    for extra in ([], [], ["--critical-path"], ["--no-cache"]):
        capsys.readouterr()
        assert main(["run", str(out), "--json", *extra]) == 0
        runs.append(json.loads(capsys.readouterr().out)["metrics"])
    stages = [set(m.pop("replay_s")) for m in runs]
    runs[2].pop("critical_path")
    assert "schedule" in stages[0] and "schedule" not in stages[1] and "cache" in stages[1]
    assert "schedule" in stages[2] and "cache" not in stages[3]  # the critical path and --no-cache replay in full
    assert runs[0] == runs[1] == runs[2] == runs[3]
    assert len(_entries(ReplayCache())) == 1  # in this test's own $XDG_CACHE_HOME (tests/conftest.py)


def test_an_entry_whose_time_cannot_be_touched_is_still_read(compiled, small_target, store, monkeypatch):
    _replay(compiled, small_target, store)

    def refuse(*args, **kwargs):
        raise PermissionError("read-only")

    monkeypatch.setattr(replay_cache.os, "utime", refuse)  # a read-only cache, or the entry evicted meanwhile
    assert _replay(compiled, small_target, store).from_cache


def test_an_interrupted_write_leaves_no_temporary(compiled, small_target, store, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(replay_cache.np, "savez", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _replay(compiled, small_target, store)
    assert [p.name for p in store.directory.iterdir()] == []


def test_a_killed_writers_temporary_goes_at_the_next_write(compiled, small_target, store):
    store.directory.mkdir(parents=True)
    dead = store.directory / f".{'0' * 64}.npz.primal-tmp.{2**22 + 12345}.{'a' * 12}"
    alive = store.directory / f".{'1' * 64}.npz.primal-tmp.{os.getpid()}.{'b' * 12}"
    for p in (dead, alive):
        p.write_bytes(b"half an entry")
    _replay(compiled, small_target, store)
    assert not dead.exists() and alive.exists()  # another writer, still running, keeps its own


def test_a_signed_entry_with_a_foreign_header_is_said_and_replayed(compiled, small_target, store, said):
    _replay(compiled, small_target, store)
    (path,) = _entries(store)
    with np.load(path) as z:
        stored = {k: z[k] for k in z.files if k not in ("header", "checksum")}
    np.savez(path, **stored, header=np.frombuffer(b"[1, 2]", np.uint8), checksum=np.frombuffer(b"x", np.uint8))
    assert not _replay(compiled, small_target, store).from_cache and len(said) == 1
