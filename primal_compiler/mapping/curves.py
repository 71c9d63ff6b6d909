"""PE orderings of a rows x cols mesh: each returns PE indices (row*cols+col) in visiting order.

The four classic PIM tile orders (row-major, snake, spiral, diagonal zig-zag)
and two space-filling curves (Z-curve/Morton, Hilbert). Curves defined on
powers of two are laid on the enclosing power-of-two square and clipped to the
mesh, which keeps their order and locality.
"""

from __future__ import annotations

import numpy as np


def _index(r: np.ndarray, c: np.ndarray, cols: int) -> np.ndarray:
    return (r * cols + c).astype(np.int32)


def row_major(rows: int, cols: int) -> np.ndarray:
    return np.arange(rows * cols, dtype=np.int32)


def snake(rows: int, cols: int) -> np.ndarray:
    grid = np.arange(rows * cols, dtype=np.int32).reshape(rows, cols)
    grid[1::2] = grid[1::2, ::-1]
    return grid.ravel()


def spiral(rows: int, cols: int) -> np.ndarray:
    """Clockwise from the top-left corner inwards."""
    grid = np.arange(rows * cols, dtype=np.int32).reshape(rows, cols)
    out = []
    while grid.size:
        out.append(grid[0])
        grid = np.rot90(grid[1:])  # rotate the remainder counter-clockwise: its right column becomes the top row
    return np.concatenate(out)


def zigzag(rows: int, cols: int) -> np.ndarray:
    """Diagonal zig-zag (JPEG order): anti-diagonals, alternating direction."""
    r, c = np.divmod(np.arange(rows * cols), cols)
    d = r + c
    along = np.where(d % 2 == 0, -r, r)
    order = np.lexsort((along, d))
    return _index(r[order], c[order], cols)


def _spread_bits(v: np.ndarray) -> np.ndarray:
    v = v.astype(np.uint64)
    out = np.zeros_like(v)
    for bit in range(16):
        out |= ((v >> np.uint64(bit)) & np.uint64(1)) << np.uint64(2 * bit)
    return out


def zcurve(rows: int, cols: int) -> np.ndarray:
    """Morton order: row bits interleaved above column bits, 2x2 blocks first."""
    r, c = np.divmod(np.arange(rows * cols), cols)
    key = (_spread_bits(r) << np.uint64(1)) | _spread_bits(c)
    order = np.argsort(key, kind="stable")
    return _index(r[order], c[order], cols)


def _hilbert_d(n: int, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Distance along the Hilbert curve of side n (power of two) for points (x, y)."""
    x, y = x.astype(np.int64).copy(), y.astype(np.int64).copy()
    d = np.zeros_like(x)
    s = n // 2
    while s > 0:
        rx = ((x & s) > 0).astype(np.int64)
        ry = ((y & s) > 0).astype(np.int64)
        d += s * s * ((3 * rx) ^ ry)
        flip = ry == 0
        swap_x = np.where(flip & (rx == 1), s - 1 - x, x)
        swap_y = np.where(flip & (rx == 1), s - 1 - y, y)
        x, y = np.where(flip, swap_y, swap_x), np.where(flip, swap_x, swap_y)
        s //= 2
    return d


def hilbert(rows: int, cols: int) -> np.ndarray:
    n = 1 << max(0, (max(rows, cols) - 1).bit_length())
    r, c = np.divmod(np.arange(rows * cols), cols)
    order = np.argsort(_hilbert_d(max(n, 1), c, r), kind="stable")
    return _index(r[order], c[order], cols)


def column_major(rows: int, cols: int) -> np.ndarray:
    k = np.arange(rows * cols)
    return ((k % rows) * cols + k // rows).astype(np.int32)


CURVES = {
    "row-major": row_major,
    "snake": snake,
    "spiral": spiral,
    "zigzag": zigzag,
    "zcurve": zcurve,
    "hilbert": hilbert,
    "column-major": column_major,
}
