"""Decoding a quantized ONNX constant from the tensors the file stores: codes, scales, zero points, blocks.

:func:`decode` follows the ONNX and ONNX Runtime definitions exactly (the
tests compare it with ONNX Runtime on single-node graphs):
``DequantizeLinear`` is ``(codes - zero_point) * scale`` with the scale per
tensor, per ``axis`` or repeated over ``block_size`` elements along it;
``QuantizeLinear`` is ``saturate(round_half_even(x / scale) + zero_point)``;
``MatMulNBits`` packs ``bits``-bit codes low bits first along K, in blocks
of ``block_size`` per output column, with packed uint8 zero points (default
``2**(bits-1)``) or float ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import TensorProto

from primal_compiler.frontend.patterns import PatternError

#: Code types DequantizeLinear may hold here, with their bits.
CODE_BITS: dict[int, int] = {TensorProto.INT4: 4, TensorProto.UINT4: 4, TensorProto.INT8: 8, TensorProto.UINT8: 8,
             TensorProto.INT16: 16, TensorProto.UINT16: 16, TensorProto.INT32: 32}
#: The range of each code type (QuantizeLinear saturates to it).
CODE_RANGE: dict[int, tuple[int, int]] = {t: ((-(1 << (b - 1)), (1 << (b - 1)) - 1) if t in (TensorProto.INT4, TensorProto.INT8, TensorProto.INT16,
                                                                TensorProto.INT32) else (0, (1 << b) - 1))
              for t, b in CODE_BITS.items()}


@dataclass(frozen=True, eq=False)
class Decoded:
    """A dequantized constant: ``w = codes * scale`` elementwise (``codes`` already minus the zero points).

    ``codes`` is None when the zero points are not integers (then only ``w`` means anything).
    """

    w: np.ndarray  # float32, the placeholder's dims
    codes: np.ndarray | None  # int32, same dims
    scale: np.ndarray  # float32, same dims (a broadcast view when the scale repeats)
    bits: int  # bits of the stored codes


@dataclass(frozen=True, eq=False)
class QuantWeight:
    """How to decode one placeholder: its op, node name and the original tensors' names."""

    op: str  # "DequantizeLinear", "MatMulNBits", "MatMulInteger" or "Gather"
    node: str
    codes: str
    scale: str
    zero_point: str
    axis: int = 1
    block_size: int = 0
    bits: int = 8
    k: int = 0  # MatMulNBits: K and N
    n: int = 0
    quantize_from: str = ""  # a float constant that a QuantizeLinear turned into the codes
    code_type: int = TensorProto.UINT8  # the codes' TensorProto type


def decode(spec: QuantWeight, read) -> Decoded:
    """The constant ``spec`` describes; ``read(name)`` returns an initializer's array as stored."""
    if spec.op == "MatMulNBits":
        return _decode_nbits(spec, read)
    source = np.asarray(read(spec.quantize_from or spec.codes))  # the codes, or the float a QuantizeLinear reads
    dims = source.shape
    if spec.op in ("MatMulInteger", "Gather"):
        axis, block = (1 if len(dims) == 2 else 0), 0
    else:
        axis, block = spec.axis % max(len(dims), 1), spec.block_size
    scale = _expand(np.asarray(read(spec.scale), np.float32), dims, axis, block, spec)
    zp = (_expand(np.asarray(read(spec.zero_point)), dims, axis, block, spec) if spec.zero_point
          else np.broadcast_to(np.int64(0), dims))
    codes = _quantized(source, scale, zp, spec) if spec.quantize_from else source
    q = codes.astype(np.int64) - zp.astype(np.int64)
    w = (q * scale.astype(np.float64)).astype(np.float32)
    return Decoded(w, q.astype(np.int32), scale, spec.bits)


def _quantized(x: np.ndarray, scale: np.ndarray, zp: np.ndarray, spec: QuantWeight) -> np.ndarray:
    """QuantizeLinear of float ``x``: round half to even (as ``np.rint``), add the zero point, saturate."""
    lo, hi = CODE_RANGE[spec.code_type]
    return np.clip(np.rint(x.astype(np.float64) / scale.astype(np.float64)) + zp, lo, hi).astype(np.int64)


def _expand(values: np.ndarray, dims: tuple, axis: int, block: int, spec: QuantWeight) -> np.ndarray:
    """Scale or zero point broadcast to the codes' dims: per tensor, per ``axis``, or blocked along it."""
    if values.size == 1:
        return np.broadcast_to(values.reshape(()), dims)
    if block == 0 and values.ndim == 1 and values.size == dims[axis]:
        shape = [1] * len(dims)
        shape[axis] = dims[axis]
        return np.broadcast_to(values.reshape(shape), dims)
    if block > 0 and values.ndim == len(dims) and values.shape[axis] == -(-dims[axis] // block):
        full = np.repeat(values, block, axis=axis)
        return np.take(full, np.arange(dims[axis]), axis=axis)
    raise PatternError(f"node {spec.node}: {spec.op} scale or zero point of shape {list(values.shape)} does not "
                       f"fit codes of shape {list(dims)} (axis {axis}, block_size {block})")


def _decode_nbits(spec: QuantWeight, read) -> Decoded:
    k, n, bits, block = spec.k, spec.n, spec.bits, spec.block_size
    blocks, per = -(-k // block), 8 // bits
    packed = np.asarray(read(spec.codes), np.uint8).reshape(n, -1)
    shifts = np.arange(per, dtype=np.uint8) * bits
    q = ((packed[:, :, None] >> shifts) & ((1 << bits) - 1)).reshape(n, -1)[:, :k].astype(np.int64)
    scale = np.asarray(read(spec.scale), np.float32).reshape(n, blocks)
    codes_ok = True
    if not spec.zero_point:
        zp = np.full((n, blocks), 1 << (bits - 1), np.int64)
    else:
        raw = np.asarray(read(spec.zero_point))
        if raw.dtype == np.uint8:
            row = -(-blocks * bits // 8)
            if raw.size != n * row:
                raise PatternError(f"node {spec.node}: MatMulNBits zero points have {raw.size} bytes, "
                                   f"{n * row} expected")
            unpacked = ((raw.reshape(n, row)[:, :, None] >> shifts) & ((1 << bits) - 1)).reshape(n, -1)
            zp = unpacked[:, :blocks].astype(np.int64)
        elif raw.size == n * blocks:
            zp, codes_ok = raw.reshape(n, blocks).astype(np.float64), False
        else:
            raise PatternError(f"node {spec.node}: MatMulNBits zero points have {raw.size} values, "
                               f"{n * blocks} expected")
    zp_full = np.repeat(zp, block, axis=1)[:, :k]
    scale_full = np.repeat(scale, block, axis=1)[:, :k]
    centred = q - zp_full
    w = (centred * scale_full.astype(np.float64)).astype(np.float32).T
    codes = np.ascontiguousarray(centred.T.astype(np.int32)) if codes_ok else None
    return Decoded(np.ascontiguousarray(w), codes, np.ascontiguousarray(scale_full.T), bits)
