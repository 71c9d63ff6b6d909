"""The package RC network: its conductances by hand, its transient against a stepped integration."""

from __future__ import annotations

import math

import numpy as np
import pytest

from primal_compiler.executor.replay import topology
from primal_compiler.target import load_target
from primal_compiler.executor.heat import network


@pytest.fixture(scope="module")
def target():
    return load_target("primal-7nm")


def topo(target, cts: int, cols: int):
    return topology({"num_cts": cts, "mesh_rows": 32, "mesh_cols": 32, "package_cols": cols}, target)


def hand_resistances(target) -> tuple[float, float]:
    """(die -> plate, plate -> ambient) in K/W, typed again from the HotSpot layer stack of primal-7nm."""
    side = math.sqrt(1024 * 60_000.0) * 1e-6  # 1024 PEs of 60,000 um2: 7.84 mm
    pitch = side + 100e-6
    die, site = side**2, pitch**2
    down = (75e-6 / 100.0 + 20e-6 / 4.0 + 3950e-6 / 400.0) / die  # half die, interface, half plate
    out = 3950e-6 / 400.0 / site + 360.0e-6 / site  # half plate, fins (0.1 K/W x 3,600 mm2)
    return down, out


def test_one_ct_settles_at_its_series_resistances_by_hand(target):
    net = network(topo(target, 1, 1), target)
    down, out = hand_resistances(target)
    rise = net.steady_rise(np.array([2.0]))
    assert rise[1] == pytest.approx(2.0 * out, rel=1e-9)
    assert rise[0] == pytest.approx(2.0 * (down + out), rel=1e-9)
    assert 5.0 < out < 7.0 and 0.1 < down < 0.5  # 5.87 and 0.25 K/W: the fins dominate


def test_only_the_plates_lose_heat_to_ambient(target):
    net = network(topo(target, 7, 3), target)
    _, out = hand_resistances(target)
    to_ambient = net.g @ np.ones(14)  # a row of a conductance matrix sums to its node's ambient conductance
    np.testing.assert_allclose(to_ambient[:7], 0.0, atol=1e-9)
    np.testing.assert_allclose(to_ambient[7:], 1.0 / out, rtol=1e-9)
    np.testing.assert_array_equal(net.g, net.g.T)
    power = np.random.default_rng(0).uniform(0, 1, 7)
    rise = net.steady_rise(power)
    assert float(to_ambient @ rise) == pytest.approx(power.sum(), rel=1e-9)  # every watt leaves through the fins


def test_heat_spreads_to_grid_neighbours_through_the_plate(target):
    net = network(topo(target, 5, 5), target)  # one row of five sites
    rise = net.steady_rise(np.array([1.0, 0, 0, 0, 0]))
    die = rise[:5]
    assert (np.diff(die) < 0).all()  # cooler with every site away from the hot one
    lat = 1.0 / (400.0 * 7900e-6)  # copper plate between neighbours: k t p / p
    plate = rise[5:]
    first = (plate[0] - plate[1]) / lat  # watts crossing the first link
    assert first == pytest.approx(1.0 - plate[0] / hand_resistances(target)[1], rel=1e-6)


def test_transient_matches_a_stepped_integration(target):
    net = network(topo(target, 4, 2), target)
    power = np.array([0.5, 0.0, 2.0, 1.0])
    dt, steps = 2e-4, 500
    lhs = np.diag(net.c / dt) + net.g
    theta = np.zeros(8)
    inject = np.concatenate([power, np.zeros(4)])
    for _ in range(steps):  # backward Euler, a second and simpler model of the same network
        theta = np.linalg.solve(lhs, net.c / dt * theta + inject)
    exact = net.transient_rise(power, np.array([0.0, dt * steps, 1e5]))
    np.testing.assert_allclose(exact[0], 0.0, atol=1e-12)
    np.testing.assert_allclose(exact[1], theta, rtol=0.02)
    np.testing.assert_allclose(exact[2], net.steady_rise(power), rtol=1e-9)
    rates, _ = net.modes()
    assert (rates > 0).all() and 1e-3 < 1 / rates[-1] < 1e-2  # the die's own time constant: milliseconds


def test_a_wrong_power_vector_is_refused(target):
    net = network(topo(target, 3, 2), target)
    with pytest.raises(ValueError, match="one power per CT"):
        net.steady_rise(np.ones(4))
