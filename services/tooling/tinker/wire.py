"""The binary half of the wire: forward_backward arrives as the client's protobuf (tinker.proto), and its output and
sample results go back as protobuf, the only form the client reads them in. JSON requests are pydantic (schema.py).
Decoding checks every length against the declared shape, so a truncated or forged body is a 422 naming the field."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from google.protobuf.message import DecodeError
from tinker.proto import tinker_public_pb2 as pb

from zerobubble.tooling.tinker.errors import invalid

PROTO = "application/x-protobuf"
_NUMPY = {pb.DTYPE_FLOAT32: np.dtype(np.float32), pb.DTYPE_INT64: np.dtype(np.int64),
          pb.DTYPE_INT32: np.dtype(np.int32)}


@dataclass
class Datum:
    tokens: np.ndarray                    # int64 [L]: the model input
    inputs: dict[str, np.ndarray]         # loss_fn_inputs, each flattened to [L]


@dataclass
class ForwardBackwardCall:
    model_id: str
    seq_id: int
    loss_fn: str
    loss_fn_config: dict[str, float | str]
    forward_only: bool
    data: list[Datum]


def _tensor(message: pb.Tensor, field: str) -> np.ndarray:
    dtype = _NUMPY.get(message.dtype)
    if dtype is None:
        raise invalid(f"{field}.dtype", f"dtype {message.dtype} is not float32 or int64")
    shape = list(message.shape)
    if message.HasField("sparse_csr"):
        return _sparse(message.sparse_csr, dtype, shape, field)
    if len(message.dense) % dtype.itemsize:
        raise invalid(field, f"{len(message.dense)} bytes is no whole number of {dtype} values")
    values = np.frombuffer(message.dense, dtype=dtype)
    if shape and int(np.prod(shape)) != values.size:
        raise invalid(f"{field}.shape", f"shape {shape} does not hold the {values.size} values sent")
    return values


def _sparse(csr: pb.SparseCsr, dtype: np.dtype, shape: list[int], field: str) -> np.ndarray:
    if len(shape) != 2 or min(shape) < 0:
        raise invalid(f"{field}.shape", f"a sparse tensor needs a 2-D shape, got {shape}")
    try:
        values = np.frombuffer(csr.values, dtype=dtype)
        rows = np.frombuffer(csr.crow_indices, dtype=np.int64)
        cols = np.frombuffer(csr.col_indices, dtype=np.int64)
    except ValueError as exc:
        raise invalid(f"{field}.sparse_csr", str(exc)) from None
    ok = (rows.size == shape[0] + 1 and cols.size == values.size and rows[0] == 0 and rows[-1] == values.size
          and bool(np.all(np.diff(rows) >= 0)) and bool(np.all((cols >= 0) & (cols < shape[1]))))
    if not ok:
        raise invalid(f"{field}.sparse_csr", f"the row pointers and columns do not fit the shape {shape}")
    dense = np.zeros(shape, dtype=dtype)
    dense[np.repeat(np.arange(shape[0]), np.diff(rows)), cols] = values
    return dense.reshape(-1)


def _tokens(chunks, field: str) -> np.ndarray:
    parts = []
    for i, chunk in enumerate(chunks):
        if chunk.WhichOneof("chunk") != "encoded_text":
            raise invalid(f"{field}[{i}]", "only encoded text chunks are served (no images or audio)")
        raw = chunk.encoded_text.tokens
        if len(raw) % 4:
            raise invalid(f"{field}[{i}].tokens", "not a whole number of int32 tokens")
        parts.append(np.frombuffer(raw, dtype=np.int32))
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)


def decode_forward_backward(body: bytes) -> ForwardBackwardCall:
    message = pb.ForwardBackwardRequest()
    try:
        message.ParseFromString(body)
    except DecodeError as exc:
        raise invalid("body", f"not a ForwardBackwardRequest protobuf ({exc})") from None
    config: dict[str, float | str] = {key: value for key, value in message.loss_fn_config.items()}
    for key, value in message.loss_fn_config_v2.items():
        config[key] = value.text if value.WhichOneof("value") == "text" else value.number
    data = []
    for i, datum in enumerate(message.data):
        tokens = _tokens(datum.model_input, f"data[{i}].model_input")
        inputs = {name: _tensor(tensor, f"data[{i}].loss_fn_inputs.{name}")
                  for name, tensor in datum.loss_fn_inputs.items()}
        data.append(Datum(tokens=tokens, inputs=inputs))
    return ForwardBackwardCall(model_id=message.model_id, seq_id=message.seq_id, loss_fn=message.loss_fn,
                               loss_fn_config=config, forward_only=message.forward_only, data=data)


def _batched(arrays: list[np.ndarray], dtype: int) -> pb.BatchedTensor:
    numpy = _NUMPY[dtype]
    sizes = np.array([0, *(a.size * numpy.itemsize for a in arrays)], dtype=np.int64)
    data = b"".join(np.ascontiguousarray(a, dtype=numpy).tobytes() for a in arrays)
    return pb.BatchedTensor(data=data, offsets=np.cumsum(sizes).tobytes(), dtype=dtype)


def encode_forward_backward(outputs: dict[str, list[np.ndarray]], metrics: dict[str, float], count: int) -> bytes:
    """ForwardBackwardOutput: one ArrayRecord whose float32 fields hold one array per datum."""
    record = pb.ArrayRecord(num_datums=count)
    for name, arrays in outputs.items():
        record.fields[name].CopyFrom(_batched(arrays, pb.DTYPE_FLOAT32))
    message = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", loss_fn_outputs=[record])
    for key, value in metrics.items():
        message.metrics[key] = value
    return message.SerializeToString()


@dataclass
class Sequence:
    tokens: np.ndarray
    logprobs: np.ndarray
    stopped: bool                         # False: it reached max_tokens


def encode_sample(sequences: list[Sequence], prompt_logprobs: np.ndarray | None) -> bytes:
    message = pb.SampleResponse()
    for sequence in sequences:
        message.sequences.add(stop_reason=pb.STOP_REASON_STOP if sequence.stopped else pb.STOP_REASON_LENGTH,
                              tokens=np.asarray(sequence.tokens, dtype=np.int32).tobytes(),
                              logprobs=np.asarray(sequence.logprobs, dtype=np.float32).tobytes())
    if prompt_logprobs is not None:
        message.prompt_logprobs = np.asarray(prompt_logprobs, dtype=np.float32).tobytes()
    return message.SerializeToString()
