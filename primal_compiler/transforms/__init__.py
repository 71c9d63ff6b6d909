"""Every pass of the compiler; importing this package registers them all."""

from primal_compiler.transforms import (  # noqa: F401
    blocking,
    exact_placement,
    ga_placement,
    hilbert_order,
    lower_tiles,
    row_major_order,
    snake_order,
    spiral_order,
    zcurve_order,
    zigzag_order,
)
