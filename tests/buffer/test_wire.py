"""Reading a pushed group where it lies (wire.py): whatever the bytes, the buffer checks exactly what
protobuf parses from them, and a group's arrays are never copied."""

from __future__ import annotations

import random
import struct

import numpy as np
import pytest
from buffer_helpers import make_group
from google.protobuf.message import DecodeError

from zerobubble.buffer.wire import GroupView, read_group
from zerobubble.common.codec import decode_array, encode_array, varint
from zerobubble.v1 import common_pb2

PROMPT = common_pb2.Prompt(prompt_id="p-1", epoch=2, messages_json="[]", gt_answer="4", data_source="math")


def fields(group) -> tuple | None:
    """Every field the buffer reads, comparable between a GroupView and a parsed message (floats as bits)."""
    if group is None:
        return None

    def array(a):
        return a.dtype, list(a.shape), bytes(a.data)

    def bits(x: float) -> bytes:
        return struct.pack("<f", x)

    return (
        group.prompt.SerializeToString(deterministic=True), array(group.prompt_ids), group.producer_id,
        group.sequence, group.lease_id, group.producer_incarnation,
        [(array(t.response_ids), array(t.behaviour_logprobs), t.finish_reason, bits(t.reward), t.format_ok,
          t.answer_ok, t.policy_version, bits(t.temperature), t.response_text) for t in group.trajectories],
    )


def parsed(payload: bytes) -> common_pb2.ExperienceGroup | None:
    try:
        return common_pb2.ExperienceGroup.FromString(payload)
    except DecodeError:
        return None


def full_group() -> common_pb2.ExperienceGroup:
    """Every field set, with values at the edges of their types."""
    group = make_group(PROMPT, "worker-ü", 7, generations=3, tokens=5, lease_id="12")
    group.producer_incarnation = "inc"
    group.sequence = -3  # ten bytes on the wire
    first = group.trajectories[0]
    first.reward, first.temperature, first.format_ok = float("nan"), 1e-30, True
    first.policy_version = -(1 << 62)
    first.finish_reason = -2  # an enum value no one declared
    first.response_text = "réponse"
    return group


def test_a_serialized_group_is_read_without_protobuf_and_reads_the_same():
    group = full_group()
    payload = group.SerializeToString()
    view = read_group(payload, in_place_from=0)
    assert isinstance(view, GroupView)
    assert fields(view) == fields(group)


def test_small_groups_are_left_to_protobuf():
    payload = make_group(PROMPT).SerializeToString()
    assert isinstance(read_group(payload), common_pb2.ExperienceGroup)
    assert isinstance(read_group(payload, in_place_from=len(payload)), GroupView)


def test_the_arrays_are_views_of_the_received_bytes():
    payload = make_group(PROMPT, tokens=1000).SerializeToString()
    tokens = decode_array(read_group(payload, in_place_from=0).trajectories[1].response_ids, "r", dtype="int32", ndim=1)
    assert (tokens == 2).all()
    assert np.shares_memory(tokens, np.frombuffer(payload, np.uint8)), "no copy of the group's bytes"


def key(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


def length_delimited(number: int, body: bytes) -> bytes:
    assert len(body) < 128
    return key(number, 2) + bytes([len(body)]) + body


@pytest.mark.parametrize("extra", [
    # prompt_ids again: protobuf merges the two (the shapes add up), which this reader does not do.
    length_delimited(2, encode_array(np.arange(3, dtype=np.int32)).SerializeToString()),
    length_delimited(99, b"unknown"),              # a field this version does not know
    key(5, 2) + b"\x00",                           # sequence with the wrong wire type: an unknown field
    key(4, 2) + b"\x02\xff\xfe",                   # producer_id that is no UTF-8: no ExperienceGroup at all
    key(5, 0) + b"\xff" * 11,                       # a varint longer than ten bytes
    key(3, 3) + key(3, 4),                         # a group (the old wire type)
    length_delimited(3, key(2, 2) + b"\x02" + key(2, 0) + b"\x05"),  # an array cut short inside a trajectory
])
def test_unusual_encodings_are_left_to_protobuf_and_read_as_it_reads_them(extra):
    payload = make_group(PROMPT).SerializeToString() + extra
    assert fields(read_group(payload, in_place_from=0)) == fields(parsed(payload))


def test_fields_in_any_order_and_unpacked_shapes_read_the_same():
    group = make_group(PROMPT, generations=2, tokens=3)
    pieces = [length_delimited(1, PROMPT.SerializeToString()), key(5, 0) + b"\x09",
              length_delimited(4, b"w")]
    ids = encode_array(np.arange(3, dtype=np.int32))
    unpacked = key(1, 0) + varint(ids.dtype) + key(2, 0) + varint(3) + length_delimited(3, ids.data)
    trajectories = [length_delimited(3, t.SerializeToString()) for t in group.trajectories]
    payload = b"".join([*reversed(trajectories), length_delimited(2, unpacked), *reversed(pieces)])
    view = read_group(payload, in_place_from=0)
    assert isinstance(view, GroupView)
    assert fields(view) == fields(parsed(payload))
    assert list(view.prompt_ids.shape) == [3]


def test_damaged_groups_read_as_protobuf_reads_them():
    payload = bytearray(full_group().SerializeToString())
    rng = random.Random(17)
    fast = 0
    for _ in range(3000):
        damaged = bytearray(payload)
        for _ in range(rng.randint(1, 3)):
            position = rng.randrange(len(damaged))
            if rng.random() < 0.2:
                del damaged[position:position + rng.randint(1, 8)]
            else:
                damaged[position] = rng.randrange(256)
        damaged = bytes(damaged)
        read = read_group(damaged, in_place_from=0)
        fast += isinstance(read, GroupView)
        assert fields(read) == fields(parsed(damaged)), damaged.hex()
    assert fast > 300, "the reader itself took part"


def test_large_groups_are_checked_in_place_through_the_service_and_leave_as_they_came(serve):
    _, client = serve(prompts=3, run_spec__num_generations=4)
    prompts = list(client.lease("w", 3).prompts)
    good, nan, negative = (make_group(p, "w", i, tokens=1 << 16) for i, p in enumerate(prompts))
    assert good.ByteSize() > 2 * 1024 * 1024
    logprobs = np.full(1 << 16, -0.5, np.float32)
    logprobs[-1] = np.nan
    nan.trajectories[2].behaviour_logprobs.CopyFrom(encode_array(logprobs))
    ids = np.ones(1 << 16, np.int32)
    ids[7] = -1
    negative.trajectories[1].response_ids.CopyFrom(encode_array(ids))
    acks = list(client.push([good, nan, negative]))
    assert [a.code for a in acks] == [0, 3, 3]
    assert acks[1].error.startswith("trajectories[2].behaviour_logprobs:") and "finite" in acks[1].error
    assert acks[2].error.startswith("trajectories[1].response_ids:") and "got -1 to 1" in acks[2].error
    (pulled,) = client.pull(0, 1, 3, wait_seconds=5).groups
    assert pulled.group.SerializeToString() == good.SerializeToString()
