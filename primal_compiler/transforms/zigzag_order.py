"""Pass ``zigzag-order``: place tiles along the diagonal zig-zag (JPEG order)."""

from __future__ import annotations

from dataclasses import dataclass

from primal_compiler.transforms.ordering import OrderingPass


@dataclass(frozen=True)
class ZigzagOrder(OrderingPass):
    name = "zigzag-order"
    summary = "place tiles in diagonal zig-zag (JPEG order)"
    curve = "zigzag"
