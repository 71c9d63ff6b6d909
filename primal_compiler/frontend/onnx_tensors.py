"""Initializers as float32 arrays: stored values, external data, the file's own quantization.

One reader of every constant the frontend takes numbers from (projection
weights, biases, embeddings, norms, rotary tables), so absent external data,
a length that does not match the shape, and NaN or infinite values are
refused the same way, in one line naming the file.
"""

from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto, numpy_helper

from primal_compiler.errors import InputError, one_line
from primal_compiler.frontend.onnx_graph import ITEMSIZE, PatternError
from primal_compiler.frontend.quant_codes import Decoded, decode


def read_tensor(g, tensor, label: str, where: str) -> np.ndarray:
    """An initializer as float32 (a quantized one dequantized); absent external data and values that are not
    finite are InputErrors."""
    value = decoded(g, tensor, label, where).w if quantized(g, tensor) else _raw(g, tensor, label, where)
    return finite(value.astype(np.float32), tensor, label, where)


def finite(value: np.ndarray, tensor, label: str, where: str) -> np.ndarray:
    if not np.isfinite(value).all():
        raise InputError(where, f"{label}: initializer {tensor.name!r} holds NaN or infinite values")
    return value


def quantized(g, tensor) -> bool:
    return g.quant is not None and tensor.name in g.quant.weights


def decoded(g, tensor, label: str, where: str) -> Decoded:
    """A quantized constant's codes, scales and float values, from the tensors the file stores."""
    try:
        return decode(g.quant.weights[tensor.name], lambda name: _raw(g, g.inits[name], label, where))
    except PatternError as exc:
        raise InputError(where, f"{label}: {exc}") from None


def _raw(g, tensor, label: str, where: str) -> np.ndarray:
    """An initializer's values as stored; absent external data is an InputError."""
    if tensor.data_location == TensorProto.EXTERNAL:
        if g.external_file(tensor) is None:
            location = next(e.value for e in tensor.external_data if e.key == "location")
            raise InputError(
                where, f"{label}: initializer {tensor.name!r} is in external data file {location!r}, which is absent"
            )
        tensor = _sized(tensor, label, where)
    try:
        return numpy_helper.to_array(tensor, base_dir=str(g.base_dir))
    except Exception as exc:  # noqa: BLE001 - onnx raises many types for unreadable data
        detail = f"{type(exc).__name__}: {one_line(exc, 200)}"
        raise InputError(where, f"{label}: cannot read initializer {tensor.name!r} ({detail})") from None


def _sized(tensor, label: str, where: str):
    """An external float tensor with the ``length`` its shape needs, so no read goes past its bytes."""
    size = ITEMSIZE.get(tensor.data_type)
    if size is None:
        return tensor  # onnx reads at most the rest of a file already checked to be regular and bounded
    need = math.prod(tensor.dims) * size
    info = {e.key: e.value for e in tensor.external_data}
    if "length" in info:
        if int(info["length"]) != need:
            raise InputError(where, f"{label}: initializer {tensor.name!r} has {int(info['length']):,} bytes of "
                                    f"external data, its shape needs {need:,}")
        return tensor
    sized = TensorProto()
    sized.CopyFrom(tensor)
    sized.external_data.add(key="length", value=str(need))
    return sized
