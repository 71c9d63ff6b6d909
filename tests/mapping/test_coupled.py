"""The coupled row/column bound (mapping/coupled.py) is a lower bound, and tighter than the star bound.

Independent checks: CP-SAT's proven optimum of small matrices, and the exact cost (every hub at its best
PE for the tiles' places) of random and structured placements. A bound above any of them is wrong.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from primal_compiler.mapping.coupled import coupled_bound
from primal_compiler.mapping.exact import solve_exact, star_bound
from primal_compiler.mapping.ga import GaConfig, run_ga
from primal_compiler.mapping.instance import Instance
from tests.mapping.instances import exact_cost, matrix


@pytest.mark.parametrize("shape, mesh", [((2, 3), (3, 3)), ((3, 3), (3, 3)), ((2, 4), (3, 3))])
def test_the_bound_lies_below_cp_sat_optima(shape, mesh):
    inst = matrix(*shape, mesh)
    best = solve_exact(inst, max_deterministic_time=30.0)
    assert best.optimal
    assert star_bound(inst).byte_hops <= coupled_bound(inst) <= best.cost + 1e-6  # here no tighter: too few tiles


@pytest.mark.parametrize("shape, mesh, then", [((8, 8), (8, 8), 0), ((6, 10), (8, 8), 0), ((10, 8), (12, 8), 2),
                                                ((16, 16), (16, 16), 0)])
def test_no_placement_costs_less_than_the_bound(shape, mesh, then):
    inst = matrix(*shape, mesh, then=then)
    bound = coupled_bound(inst)
    assert bound > star_bound(inst).byte_hops
    pes = mesh[0] * mesh[1]
    layouts = [np.random.default_rng(k).permutation(pes)[: inst.num_tiles] for k in range(200)]
    layouts.append(np.arange(inst.num_tiles))  # the matrices as they are written, row by row
    ga = run_ga(inst, GaConfig())
    layouts.append(ga.slots)  # a good placement, about 1.5x the bound here
    costs = [exact_cost(inst, slot) for slot in layouts]
    assert costs[-1] <= ga.cost + 1e-6 and min(costs) >= bound


def test_without_matrix_blocks_it_is_the_star_bound():
    inst = matrix(4, 4, (4, 4), wa=256.0)
    uneven = Instance(inst.rows, inst.cols, inst.num_tiles, inst.num_hubs, inst.src, inst.dst,
                      inst.weight * np.linspace(1, 2, len(inst.weight)), inst.flow_class)
    assert coupled_bound(uneven) == star_bound(uneven).byte_hops  # one weight per family is what it takes


@settings(max_examples=12, deadline=None, derandomize=True)
@given(rows=st.integers(2, 12), cols=st.integers(2, 12), extra=st.integers(0, 8),
       wa=st.sampled_from([64.0, 256.0, 512.0]), wb=st.sampled_from([64.0, 256.0, 1024.0]))
def test_any_matrix_any_weights_no_good_placement_beats_the_bound(rows, cols, extra, wa, wb):
    side = max(4, 2 * int(np.ceil(np.sqrt(rows * cols + extra) / 2)))  # even: the GA's slot groups tile it
    inst = matrix(rows, cols, (side, side), wa, wb)
    bound = coupled_bound(inst)
    assert bound >= star_bound(inst).byte_hops
    layouts = [np.arange(inst.num_tiles), run_ga(inst, GaConfig(generations=10)).slots]
    assert min(exact_cost(inst, slot) for slot in layouts) >= bound


def _side_by_side(first: Instance, second: Instance, mesh: tuple[int, int]) -> Instance:
    """The two instances' tiles, hubs and flows in one CT, renumbered (tiles first, then hubs)."""
    T1, T2 = first.num_tiles, second.num_tiles

    def renumber(e: np.ndarray, tiles_before: int, hubs_before: int, T: int) -> np.ndarray:
        return np.where(e < T, e + tiles_before, e - T + T1 + T2 + hubs_before).astype(np.int32)

    src = np.concatenate([renumber(first.src, 0, 0, T1), renumber(second.src, T1, first.num_hubs, T2)])
    dst = np.concatenate([renumber(first.dst, 0, 0, T1), renumber(second.dst, T1, first.num_hubs, T2)])
    return Instance(mesh[0], mesh[1], T1 + T2, first.num_hubs + second.num_hubs, src, dst,
                    np.concatenate([first.weight, second.weight]), np.zeros(len(src), np.int8))


@pytest.mark.parametrize("then", [0, 6])
def test_a_block_of_mixed_weights_keeps_its_stars_and_the_others_still_couple(then):
    """Beside a plain 10x10 matrix: a 6x6 matrix of mixed weights (then=0), or a chained pair whose second
    block has mixed weights (then=6: the first block shares its column roots with it, so neither couples)."""
    plain = matrix(10, 10, (16, 16))
    other = matrix(6, 6, (16, 16), then=then)
    w = other.weight.copy()
    first = 0 if then == 0 else 2 * 36  # the chained pair's second block: the flows after the first's
    w[first:] *= np.linspace(1, 2, len(w) - first)
    other = Instance(16, 16, other.num_tiles, other.num_hubs, other.src, other.dst, w, other.flow_class)
    both = _side_by_side(plain, other, (16, 16))
    gain = coupled_bound(plain) - star_bound(plain).byte_hops
    assert gain > 0
    # the plain block's gain survives beside the other (the same mesh: the same stars and LP)
    assert coupled_bound(both) == pytest.approx(star_bound(both).byte_hops + gain, rel=1e-6)
    layouts = [np.arange(both.num_tiles), run_ga(both, GaConfig(generations=5)).slots]
    assert min(exact_cost(both, slot) for slot in layouts) >= coupled_bound(both)


def test_tiles_with_extra_flows_still_couple_and_stay_below_every_placement():
    """Row 0 of an 8x8 matrix as a LoRA-adapted row: each of its tiles also takes 8 B from an adapter hub and
    sends a second 512 B flow to its column root. The block is each tile's heaviest flow in and out; the
    extras are left out of the coupling (the adapter hub keeps its star), so the bound still rises above
    the star bound and stays below the exact cost of any placement."""
    plain = matrix(8, 8, (8, 8))
    T, adapter = plain.num_tiles, plain.num_tiles + plain.num_hubs
    row0 = np.arange(8)
    root = plain.dst[(plain.src < T) & np.isin(plain.src, row0)]  # each row-0 tile's column root, in tile order
    src = np.concatenate([plain.src, np.full(8, adapter), row0]).astype(np.int32)
    dst = np.concatenate([plain.dst, row0, root]).astype(np.int32)
    w = np.concatenate([plain.weight, np.full(8, 8.0), np.full(8, 512.0)])
    inst = Instance(8, 8, T, plain.num_hubs + 1, src, dst, w, np.zeros(len(w), np.int8))
    bound = coupled_bound(inst)
    assert bound > star_bound(inst).byte_hops
    layouts = [np.random.default_rng(k).permutation(64)[:T] for k in range(100)]
    layouts += [np.arange(T), run_ga(inst, GaConfig()).slots]
    assert min(exact_cost(inst, slot) for slot in layouts) >= bound
