"""Pass ``snake-order``: place tiles along the row by row, alternating direction (boustrophedon)."""

from __future__ import annotations

from dataclasses import dataclass

from primal_compiler.transforms.ordering import OrderingPass


@dataclass(frozen=True)
class SnakeOrder(OrderingPass):
    name = "snake-order"
    summary = "place tiles in row by row, alternating direction (boustrophedon)"
    curve = "snake"
