"""Pass ``zcurve-order``: place tiles along the Z-curve (Morton) order."""

from __future__ import annotations

from dataclasses import dataclass

from primal_compiler.transforms.ordering import OrderingPass


@dataclass(frozen=True)
class ZcurveOrder(OrderingPass):
    name = "zcurve-order"
    summary = "place tiles in Z-curve (Morton) order"
    curve = "zcurve"
