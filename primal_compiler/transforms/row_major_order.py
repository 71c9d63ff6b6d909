"""Pass ``row-major-order``: place tiles along the row by row from the port corner (the naive order)."""

from __future__ import annotations

from dataclasses import dataclass

from primal_compiler.transforms.ordering import OrderingPass


@dataclass(frozen=True)
class RowMajorOrder(OrderingPass):
    name = "row-major-order"
    summary = "place tiles in row by row from the port corner (the naive order)"
    curve = "row-major"
    compared_hubs = "port"  # compared as the naive layout: hubs at the port PE too
