"""Pass ``spiral-order``: place tiles along the clockwise spiral from the corner inwards."""

from __future__ import annotations

from dataclasses import dataclass

from primal_compiler.transforms.ordering import OrderingPass


@dataclass(frozen=True)
class SpiralOrder(OrderingPass):
    name = "spiral-order"
    summary = "place tiles in clockwise spiral from the corner inwards"
    curve = "spiral"
