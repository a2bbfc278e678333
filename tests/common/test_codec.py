import numpy as np
import pytest
import torch

from zerobubble.common.codec import decode_array, encode_array, to_torch
from zerobubble.common.errors import InvalidInput
from zerobubble.v1 import common_pb2


@pytest.mark.parametrize("dtype", ["int32", "int64", "float32", "float16", "float64", "uint8", "bool"])
def test_numpy_round_trip(dtype):
    array = (np.arange(24).reshape(2, 3, 4) % 5).astype(dtype)
    back = decode_array(encode_array(array), "x")
    assert back.dtype == array.dtype and back.shape == array.shape
    assert np.array_equal(back, array)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.int32])
def test_torch_round_trip(dtype):
    tensor = torch.linspace(-3, 3, 12, dtype=torch.float32).reshape(3, 4).to(dtype)
    back = to_torch(encode_array(tensor), "x")
    assert back.dtype == dtype and torch.equal(back, tensor)


def test_big_endian_input_is_sent_little_endian():
    array = np.arange(4, dtype=">i4")
    msg = encode_array(array)
    assert msg.data == np.arange(4, dtype="<i4").tobytes()


def test_inconsistent_length_names_the_field():
    msg = encode_array(np.zeros(4, dtype=np.float32))
    msg.data = msg.data[:-1]
    with pytest.raises(InvalidInput, match=r"trajectories\[2\]\.logprobs\.data: 15 bytes"):
        decode_array(msg, "trajectories[2].logprobs")


def test_expectations_and_bad_headers():
    msg = encode_array(np.zeros((2, 2), dtype=np.int32))
    with pytest.raises(InvalidInput, match=r"ids\.dtype: expected dtype float32"):
        decode_array(msg, "ids", dtype="float32")
    with pytest.raises(InvalidInput, match=r"ids\.shape: expected 1 dimensions"):
        decode_array(msg, "ids", ndim=1)
    with pytest.raises(InvalidInput, match=r"ids\.dtype"):
        decode_array(common_pb2.Array(shape=[1], data=b"\0\0\0\0"), "ids")
    with pytest.raises(InvalidInput, match=r"ids\.shape: negative"):
        decode_array(common_pb2.Array(dtype=common_pb2.DTYPE_INT32, shape=[-1], data=b""), "ids")


def test_unsupported_dtype_refused():
    with pytest.raises(InvalidInput, match="complex"):
        encode_array(np.zeros(2, dtype=np.complex64))
