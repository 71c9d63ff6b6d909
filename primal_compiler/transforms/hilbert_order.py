"""Pass ``hilbert-order``: place tiles along the Hilbert curve order."""

from __future__ import annotations

from dataclasses import dataclass

from primal_compiler.transforms.ordering import OrderingPass


@dataclass(frozen=True)
class HilbertOrder(OrderingPass):
    name = "hilbert-order"
    summary = "place tiles in Hilbert curve order"
    curve = "hilbert"
