"""ga-placement: determinism, executors, pins, and beating the orderings it starts from."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from primal_compiler.errors import InputError
from primal_compiler.mapping.ga import GaConfig, run_ga
from primal_compiler.mapping.hops import template_hops
from primal_compiler.passmgr import PassManager, parse_pipeline
from primal_compiler.transforms.ga_placement import GaPlacement

FAST = "ga-placement{generations=8,population=12,executor=serial,progress=false}"


def _run(blocked, target, spec):
    return PassManager(parse_pipeline(spec)).run(blocked, target)


def _cost(prog):
    uses = np.bincount(prog.layout.ct_template)
    return sum(uses[k] * float(template_hops(tp) @ tp.instance.weight) for k, tp in enumerate(prog.layout.templates))


def test_same_seed_same_placement_and_global_random_untouched(tiny_blocked, small_target):
    random.seed(123)
    before = random.random()
    random.seed(123)
    a = _run(tiny_blocked, small_target, FAST)
    assert random.random() == before  # DEAP's draws do not leak into the caller's random state
    b = _run(tiny_blocked, small_target, FAST)
    assert np.array_equal(a.tiles.pe, b.tiles.pe)
    c = _run(tiny_blocked, small_target, FAST.replace("{", "{seed=7,"))
    assert _cost(c) > 0


def test_executor_does_not_change_result(tiny_blocked, small_target):
    serial = _run(tiny_blocked, small_target, FAST)
    with ThreadPoolExecutor(2) as pool:
        threaded = GaPlacement(generations=8, population=12, progress=False, executor_override=pool, workers=2)
        out = PassManager((threaded,)).run(tiny_blocked, small_target)
    assert np.array_equal(serial.tiles.pe, out.tiles.pe)


def test_ga_beats_every_ordering(tiny_blocked, small_target):
    ga = _cost(_run(tiny_blocked, small_target, FAST))
    for order in ("row-major", "snake", "spiral", "zigzag", "zcurve", "hilbert"):
        assert ga <= _cost(_run(tiny_blocked, small_target, f"{order}-order"))


def test_convergence_log_recorded(tiny_blocked, small_target):
    rec = _run(tiny_blocked, small_target, FAST).records[-1]
    log = rec.details["ga"]["template0"]["convergence"]
    assert len(log) == 8
    best = [g["best_byte_hops"] for g in log]
    assert best == sorted(best, reverse=True)  # elitism: never gets worse


def test_pins_are_respected(tiny_blocked, small_target):
    prog = _run(tiny_blocked, small_target, FAST.replace("{", "{group_size=1,enforce=,pins=q.0.0@3.5,"))
    t = prog.tiles
    pinned = (t.role == 0) & (t.brow == 0) & (t.bcol == 0) & (t.part == 0) & (t.slice == 0)
    assert (t.pe[pinned] == 3 * 8 + 5).all()


@pytest.mark.parametrize("pin, message", [("q.0.0@9.9", "off the"), ("q.0@1.1", "not ROLE.BROW.BCOL")])
def test_bad_pins(tiny_blocked, small_target, pin, message):
    with pytest.raises(InputError, match=message):
        _run(tiny_blocked, small_target, FAST.replace("{", f"{{group_size=1,pins={pin},"))


def test_time_budget_stops_early():
    from .instances import random_instance

    inst = random_instance(0, 6, 6, 12, 3)
    res = run_ga(inst, GaConfig(generations=10_000, time_limit_s=0.5, group_size=1, polish_top=1))
    assert res.generations < 10_000


def _with_copy_of_template0(blocked):
    """``blocked`` whose layout has a third template: a fresh Instance with template 0's arrays."""
    from dataclasses import replace

    from primal_compiler.mapping.instance import Instance

    layout = blocked.layout
    i = layout.templates[0].instance
    copy = Instance(i.rows, i.cols, i.num_tiles, i.num_hubs, i.src.copy(), i.dst.copy(), i.weight.copy(),
                    i.flow_class.copy(), i.hub_names)
    templates = layout.templates + (replace(layout.templates[0], instance=copy),)
    return blocked.evolve(layout=replace(layout, templates=templates))


def test_identical_templates_are_solved_once_and_share_the_placement(tiny_blocked, small_target):
    plain = _run(tiny_blocked, small_target, FAST)
    dup = _run(_with_copy_of_template0(tiny_blocked), small_target, FAST)
    t = dup.layout.templates
    assert np.array_equal(t[2].slots, t[0].slots) and np.array_equal(t[2].hubs, t[0].hubs)
    for k in (0, 1):  # the first of each group keeps its own seed, so nothing else changes
        assert np.array_equal(t[k].slots, plain.layout.templates[k].slots)
    assert np.array_equal(dup.tiles.pe, plain.tiles.pe)


def test_no_progress_output_when_stderr_is_not_a_terminal(tiny_blocked, small_target, capsys):
    _run(tiny_blocked, small_target, "ga-placement{generations=2,population=4,executor=thread,workers=2}")
    assert capsys.readouterr().err == ""


def test_target_gap_stops_once_the_bound_is_close_enough():
    from primal_compiler.mapping.exact import star_bound

    from .instances import random_instance

    inst = random_instance(1, 6, 6, 12, 3)
    full = run_ga(inst, GaConfig(generations=20, group_size=1, polish_top=1))
    assert full.generations == 20
    loose = run_ga(inst, GaConfig(generations=20, group_size=1, polish_top=1, target_gap=10.0))
    assert loose.generations == 0  # the seeded curves are already within 11x of the bound
    assert loose.cost <= 11 * star_bound(inst).byte_hops
    again = run_ga(inst, GaConfig(generations=20, group_size=1, polish_top=1, target_gap=10.0))
    assert np.array_equal(loose.slots, again.slots)


def test_target_gap_out_of_range_is_one_line(tiny_blocked, small_target):
    with pytest.raises(InputError, match="target_gap"):
        _run(tiny_blocked, small_target, "ga-placement{target_gap=-0.1}")


@pytest.mark.parametrize("seed", range(6))
def test_the_operators_make_deaps_draws_from_a_private_generator(seed):
    from deap import tools

    from primal_compiler.mapping.ga import _pmx, _shuffle_mutation

    ours, theirs = random.Random(seed), random.Random(seed).sample(range(40), 40)
    a, b = random.Random(seed + 100).sample(range(40), 40), theirs
    a2, b2 = list(a), list(b)
    _pmx(ours, a, b)
    _shuffle_mutation(ours, a, 0.2)
    state = random.getstate()
    try:
        random.seed(seed)
        tools.cxPartialyMatched(a2, b2)
        tools.mutShuffleIndexes(a2, 0.2)
    finally:
        random.setstate(state)
    assert (a, b) == (a2, b2)


def test_one_set_of_defaults_and_curves_seeded_by_name(tiny_blocked, small_target, monkeypatch):
    from dataclasses import fields

    from primal_compiler.mapping import curves

    config = {f.name: f.default for f in fields(GaConfig)}
    config["seed_curves"] = config["curves"]
    search = ("seed", "population", "generations", "time_limit_s", "target_gap", "group_size", "polish_rounds",
              "max_hop_slack", "lns_rounds", "seed_curves")  # pins and progress are spelled for their callers, not search settings
    assert {f.name: f.default for f in fields(GaPlacement) if f.name in search} == {k: config[k] for k in search}
    pipeline = "ga-placement{generations=2,population=8,executor=serial}"
    before = PassManager(parse_pipeline(pipeline)).run(tiny_blocked, small_target).tiles.pe
    monkeypatch.setitem(curves.CURVES, "anti-diagonal", lambda r, c: curves.CURVES["zigzag"](r, c)[::-1].copy())
    after = PassManager(parse_pipeline(pipeline)).run(tiny_blocked, small_target).tiles.pe
    assert (before == after).all()  # a new curve seeds nothing unless named
    with pytest.raises(InputError, match=r"pass ga-placement: seed_curves: unknown curve 'spirals'"):
        parse_pipeline("ga-placement{seed_curves=snake:spirals}")


@pytest.fixture(scope="module")
def banded(small_target):
    """One Llama layer of hidden 512 with LoRA on Q, V: 28 RRAM tiles of Q, K, V, O share the first 8x8 CT."""
    from primal_compiler.api import compile_model
    from primal_compiler.frontend.builtin import ArchConfig, build_model
    from primal_compiler.frontend.lora_spec import attach_lora

    model = attach_lora(build_model(ArchConfig("llama", 512, 1, 8, 8, 512, 256, 256), "band-test"), "q,v:8")
    return compile_model(model, small_target, "lower-tiles,blocking")


BANDED = "ga-placement{generations=4,population=8,executor=serial,progress=false"


def _bands_kept(prog) -> dict[str, bool]:
    from primal_compiler.mapping.rules import layout_rules

    return {n: v["holds"] for r in layout_rules(prog) for n, v in r.items() if n.startswith("column_band")}


def test_enforce_columns_keeps_every_column_band(banded, small_target):
    free = _bands_kept(_run(banded, small_target, BANDED + ",enforce=}"))
    assert len(free) == 4 and not all(free.values())  # the same search without the rule breaks a band
    for g in (1, 4):
        spec = BANDED + f",group_size={g},enforce=columns}}"  # the default keeps qk_horizontal too
        kept = _run(banded, small_target, spec)
        assert _bands_kept(kept) == dict.fromkeys(free, True)
        assert np.array_equal(kept.tiles.pe, _run(banded, small_target, spec).tiles.pe)


@pytest.mark.parametrize("options, message", [
    ("group_size=1,enforce=columns,pins=q.0.0@0.7", "pin of tile 0 to PE 7 is outside the tile's column band"),
    ("enforce=columns:rows", "enforce: unknown rule 'rows'; enforceable: columns"),
])
def test_enforce_refuses_what_it_cannot_keep(banded, small_target, options, message):
    with pytest.raises(InputError, match=message):
        _run(banded, small_target, BANDED + f",{options}}}")


def test_enforce_qk_horizontal_keeps_every_q_vector_in_its_k_roots_row(banded, small_target):
    from primal_compiler.mapping.rules import layout_rules

    def broken(spec):
        return [n for r in layout_rules(_run(banded, small_target, spec)) for n, v in r.items() if not v["holds"]]

    assert broken(BANDED + ",enforce=columns}") == ["qk_horizontal"]  # the bands alone send q vertically
    assert broken(BANDED + ",enforce=columns:qk_horizontal}") == []
