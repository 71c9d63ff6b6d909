"""The package's heat path as a compact thermal RC network, one die node and one plate node per CT site.

Geometry (docs/thermal.md): every CT is a square die of ``pes x area.pe_um2``
(side ``a``) on the package grid of the executor's topology (``ct_xy``: CTs
in snake order, ``package_cols`` per row), at pitch ``p = a + die_gap_um``.
One copper plate (the heat spreader bonded to the heat-sink base) covers the
package; its part over a site is that site's plate node. Conductances:

- die -> its plate node: half the die, the interface material and half the
  plate, in series, each over the die's area ``a^2`` (spreading into the
  plate beyond the die's footprint is not modelled: a conservative rise);
- plate node -> ambient: half the plate plus the fins' convection, over the
  site's area ``p^2``;
- plate node <-> each grid neighbour's plate node: copper of cross-section
  ``p x plate_thickness`` over length ``p``. Dies are separate chiplets: no
  die-to-die conduction.

Capacitances: the die's silicon, the plate's copper over the site and the
fins' share of the heat sink's capacity.

With ``theta`` the rise over ambient, ``C dtheta/dt = -G theta + P``: the
steady state is ``G^-1 P``, and the transient from any start is exact for
piecewise-constant power through the eigen-decomposition of
``C^-1/2 G C^-1/2`` (its eigenvalues are the network's inverse time
constants). Both are dense numpy: two nodes per CT.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from primal_compiler.executor.topology import Topology
    from primal_compiler.target.spec import PrimalTarget

UM = 1e-6  # metres per micrometre
MM2 = 1e-6  # square metres per square millimetre


@dataclass(frozen=True, eq=False)
class Network:
    """Conductance matrix ``g`` (W/K, ambient conductances on its diagonal), node capacitances ``c`` (J/K) and
    the ambient; nodes ``0..n-1`` are the CT dies, ``n..2n-1`` their plate nodes."""

    g: np.ndarray
    c: np.ndarray
    ambient_c: float
    num_cts: int
    die_mm2: float
    site_mm2: float

    def steady_rise(self, power_w: np.ndarray) -> np.ndarray:
        """Kelvin over ambient of every node under constant per-CT die power ``power_w`` (W, one per CT)."""
        return np.linalg.solve(self.g, self._inject(power_w))

    def modes(self) -> tuple[np.ndarray, np.ndarray]:
        """(rates 1/s ascending, vectors) of the symmetric ``C^-1/2 G C^-1/2``: the time constants are
        ``1 / rates``."""
        s = 1.0 / np.sqrt(self.c)
        rates, vectors = np.linalg.eigh(self.g * s[:, None] * s[None, :])
        return rates, vectors

    def transient_rise(self, power_w: np.ndarray, times_s: np.ndarray, start: np.ndarray | None = None) -> np.ndarray:
        """Rise over ambient of every node at ``times_s`` (one row each) under constant ``power_w`` from the
        rise ``start`` (default: every node at ambient), exactly."""
        steady = self.steady_rise(power_w)
        theta0 = np.zeros_like(steady) if start is None else np.asarray(start, dtype=np.float64)
        rates, vectors = self.modes()
        root = np.sqrt(self.c)
        amp = vectors.T @ (root * (theta0 - steady))
        decay = np.exp(-np.outer(np.asarray(times_s, dtype=np.float64), rates))
        return steady[None, :] + (decay * amp[None, :]) @ vectors.T / root[None, :]

    def _inject(self, power_w: np.ndarray) -> np.ndarray:
        p = np.asarray(power_w, dtype=np.float64)
        if p.shape != (self.num_cts,):
            raise ValueError(f"expected one power per CT ({self.num_cts}), got shape {p.shape}")
        return np.concatenate([p, np.zeros(self.num_cts)])


def die_side_um(target: PrimalTarget, pes: int) -> float:
    """Side of one square CT die: its PEs' area (``area.pe_um2`` each)."""
    return math.sqrt(pes * target.area.pe_um2)


def network(topo: Topology, target: PrimalTarget) -> Network:
    """The RC network of ``topo``'s CT sites under ``target.thermal`` (module docstring)."""
    th, n = target.thermal, topo.num_cts
    side = die_side_um(target, topo.pes) * UM
    pitch = side + th.die_gap_um * UM
    die_a, site_a = side * side, pitch * pitch
    half_plate = th.plate_thickness_um * UM / 2 / th.plate_conductivity_w_per_m_k
    r_down = (th.die_thickness_um * UM / 2 / th.die_conductivity_w_per_m_k
              + th.interface_thickness_um * UM / th.interface_conductivity_w_per_m_k + half_plate) / die_a
    r_out = half_plate / site_a + th.convection_k_mm2_per_w * MM2 / site_a
    g_lat = th.plate_conductivity_w_per_m_k * th.plate_thickness_um * UM  # (k t p) / p
    g = np.zeros((2 * n, 2 * n))
    die, plate = np.arange(n), np.arange(n, 2 * n)
    _couple(g, die, plate, 1.0 / r_down)
    g[plate, plate] += 1.0 / r_out
    x, y = topo.ct_xy(np.arange(n))
    site = {(int(a), int(b)): i for i, (a, b) in enumerate(zip(x, y))}
    pairs = [(i, site[(a + dx, b + dy)]) for (a, b), i in site.items() for dx, dy in ((1, 0), (0, 1))
             if (a + dx, b + dy) in site]
    if pairs:
        left, right = np.array(pairs).T
        _couple(g, plate[left], plate[right], g_lat)
    c_die = th.die_heat_capacity_j_per_m3_k * die_a * th.die_thickness_um * UM
    c_plate = (th.plate_heat_capacity_j_per_m3_k * site_a * th.plate_thickness_um * UM
               + th.convection_capacity_j_per_k_mm2 * site_a / MM2)
    c = np.concatenate([np.full(n, c_die), np.full(n, c_plate)])
    return Network(g, c, th.ambient_c, n, die_a / MM2, site_a / MM2)


def _couple(g: np.ndarray, a: np.ndarray, b: np.ndarray, conductance: float) -> None:
    """Add a conductance between each node pair (a[i], b[i])."""
    np.add.at(g, (a, a), conductance)
    np.add.at(g, (b, b), conductance)
    np.add.at(g, (a, b), -conductance)
    np.add.at(g, (b, a), -conductance)
