"""The generator reaches every field of every request and the extremes the suite promises."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, Phase, given, settings

from zerobubble.tooling.fuzz.messages import ITEM_BYTES, MessageStrategies
from zerobubble.tooling.fuzz.targets import MAX_MESSAGE_BYTES, RPCS
from zerobubble.v1 import common_pb2

DRAWS = 200


def _draw(strategy, count: int = DRAWS) -> list:
    drawn = []

    @settings(max_examples=count, database=None, deadline=None, phases=[Phase.generate], derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(value) -> None:
        drawn.append(value)

    collect()
    return drawn


def _set_fields(message, prefix: str = "") -> set[str]:
    names = set()
    for field, value in message.ListFields():
        names.add(prefix + field.name)
        if field.message_type is not None and not field.message_type.GetOptions().map_entry:
            # Beyond four, a list holds copies of one element.
            for item in value[:4] if field.is_repeated else [value]:
                names |= _set_fields(item, f"{prefix}{field.name}.")
    return names


def _all_fields(descriptor, prefix: str = "", depth: int = 0) -> set[str]:
    names = set()
    for field in descriptor.fields:
        names.add(prefix + field.name)
        message = field.message_type
        if message is not None and not message.GetOptions().map_entry and depth < 3:
            names |= _all_fields(message, f"{prefix}{field.name}.", depth + 1)
    return names


@pytest.mark.parametrize("descriptor", sorted({rpc.request_type for rpc in RPCS}, key=lambda d: d.full_name),
                         ids=lambda d: d.name)
def test_every_field_of_every_request_is_drawn_and_messages_stay_near_the_limit(descriptor):
    drawn = _draw(MessageStrategies(MAX_MESSAGE_BYTES).requests(descriptor))
    seen = set().union(*(_set_fields(message) for message in drawn))
    assert _all_fields(descriptor) <= seen
    assert max(message.ByteSize() for message in drawn) <= 2 * MAX_MESSAGE_BYTES
    # Messages without fields differ in the unknown fields they carry.
    assert len({message.SerializeToString() for message in drawn}) > DRAWS // 2


def test_extremes_are_drawn():
    drawn = _draw(MessageStrategies(MAX_MESSAGE_BYTES).requests(common_pb2.ExperienceGroup.DESCRIPTOR), 400)
    trajectories = [t for group in drawn for t in group.trajectories]
    integers = {group.sequence for group in drawn} | {group.prompt.epoch for group in drawn}
    integers |= {t.policy_version for t in trajectories}
    assert {2**63 - 1, 2**31 - 1, -1, -(2**63)} <= integers
    floats = [t.reward for t in trajectories] + [t.temperature for t in trajectories]
    assert any(math.isnan(f) for f in floats) and any(math.isinf(f) for f in floats)
    assert "" in {group.producer_id for group in drawn}
    assert any(len(group.producer_id) >= MAX_MESSAGE_BYTES // 256 for group in drawn), "huge strings"
    assert {t.finish_reason for t in trajectories} - set(common_pb2.FinishReason.values()), "unknown enum values"
    arrays = [t.response_ids for t in trajectories]
    consistent = [a for a in arrays if a.dtype in ITEM_BYTES and a.shape
                  and len(a.data) == math.prod(a.shape) * ITEM_BYTES[a.dtype]]
    assert len({a.dtype for a in consistent}) >= 3 and len({len(a.shape) for a in consistent}) >= 3
    assert any(len(group.trajectories) >= 100 for group in drawn), "counts far past what a caller sends"
