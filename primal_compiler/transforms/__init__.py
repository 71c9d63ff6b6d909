"""Every pass of the compiler; importing this package registers them all."""

from primal_compiler.transforms import (  # noqa: F401
    blocking,
    codegen,
    exact_placement,
    ga_placement,
    hilbert_order,
    kv_ring,
    lora_sparsity,
    lower_tiles,
    row_major_order,
    snake_order,
    spiral_order,
    srpg,
    zcurve_order,
    zigzag_order,
)
