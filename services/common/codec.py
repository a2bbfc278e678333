"""Arrays on the wire: raw little-endian bytes plus dtype and shape, never repeated floats."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from zerobubble.common.errors import InvalidInput
from zerobubble.v1 import common_pb2

_NUMPY_DTYPES: dict[int, np.dtype] = {
    common_pb2.DTYPE_BOOL: np.dtype("bool"),
    common_pb2.DTYPE_UINT8: np.dtype("uint8"),
    common_pb2.DTYPE_INT8: np.dtype("int8"),
    common_pb2.DTYPE_INT16: np.dtype("<i2"),
    common_pb2.DTYPE_INT32: np.dtype("<i4"),
    common_pb2.DTYPE_INT64: np.dtype("<i8"),
    common_pb2.DTYPE_FLOAT16: np.dtype("<f2"),
    # numpy has no bfloat16: its bytes travel as int16 and torch reinterprets them.
    common_pb2.DTYPE_BFLOAT16: np.dtype("<i2"),
    common_pb2.DTYPE_FLOAT32: np.dtype("<f4"),
    common_pb2.DTYPE_FLOAT64: np.dtype("<f8"),
}
_WIRE_DTYPES: dict[str, int] = {
    "bool": common_pb2.DTYPE_BOOL,
    "uint8": common_pb2.DTYPE_UINT8,
    "int8": common_pb2.DTYPE_INT8,
    "int16": common_pb2.DTYPE_INT16,
    "int32": common_pb2.DTYPE_INT32,
    "int64": common_pb2.DTYPE_INT64,
    "float16": common_pb2.DTYPE_FLOAT16,
    "bfloat16": common_pb2.DTYPE_BFLOAT16,
    "float32": common_pb2.DTYPE_FLOAT32,
    "float64": common_pb2.DTYPE_FLOAT64,
}


def _dtype_name(x: Any) -> str:
    if isinstance(x, np.ndarray):
        return x.dtype.name
    return str(x.dtype).removeprefix("torch.")


def encode_array(x: Any) -> common_pb2.Array:
    """numpy array or torch tensor -> Array message."""
    name = _dtype_name(x)
    if name not in _WIRE_DTYPES:
        raise InvalidInput(f"dtype {name} cannot be sent; use one of {sorted(_WIRE_DTYPES)}")
    wire = _WIRE_DTYPES[name]
    if not isinstance(x, np.ndarray):
        tensor = x.detach().cpu().contiguous()
        if name == "bfloat16":
            import torch

            tensor = tensor.view(torch.int16)
        x = tensor.numpy()
    data = np.ascontiguousarray(x, dtype=_NUMPY_DTYPES[wire]).tobytes()
    return common_pb2.Array(dtype=wire, shape=list(x.shape), data=data)


def decode_array(
    msg: common_pb2.Array,
    field: str,
    *,
    dtype: str | None = None,
    ndim: int | None = None,
) -> np.ndarray:
    """Array message -> numpy array (a view of the bytes), refusing anything inconsistent.

    `field` names the message field in errors; `dtype`/`ndim` state what the caller expects.
    A bfloat16 array comes back as int16 bits; `to_torch` restores the dtype.
    """
    if msg.dtype not in _NUMPY_DTYPES:
        raise InvalidInput(f"unknown or unspecified dtype {msg.dtype}", field=f"{field}.dtype")
    wire_name = common_pb2.DType.Name(msg.dtype).removeprefix("DTYPE_").lower()
    if dtype is not None and wire_name != dtype:
        raise InvalidInput(f"expected dtype {dtype}, got {wire_name}", field=f"{field}.dtype")
    if ndim is not None and len(msg.shape) != ndim:
        raise InvalidInput(f"expected {ndim} dimensions, got shape {list(msg.shape)}", field=f"{field}.shape")
    if any(d < 0 for d in msg.shape):
        raise InvalidInput(f"negative dimension in shape {list(msg.shape)}", field=f"{field}.shape")
    np_dtype = _NUMPY_DTYPES[msg.dtype]
    expected = math.prod(msg.shape) * np_dtype.itemsize
    data = msg.data  # each access to a bytes field copies it
    if len(data) != expected:
        raise InvalidInput(
            f"{len(data)} bytes do not match shape {list(msg.shape)} of {wire_name} ({expected} bytes)",
            field=f"{field}.data",
        )
    return np.frombuffer(data, dtype=np_dtype).reshape(tuple(msg.shape))


def to_torch(msg: common_pb2.Array, field: str, **expect: Any):
    """Array message -> torch tensor with the wire dtype (bfloat16 included)."""
    import torch

    array = decode_array(msg, field, **expect)
    tensor = torch.from_numpy(array.copy())
    if msg.dtype == common_pb2.DTYPE_BFLOAT16:
        tensor = tensor.view(torch.bfloat16)
    return tensor


def varint(value: int) -> bytes:
    """A non-negative integer as a protobuf base-128 varint (for messages assembled around raw bytes)."""
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
