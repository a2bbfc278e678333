"""Per-token policy versions in the buffer: checked on push, kept through the write-ahead log and a restart, and
the staleness bound read from the oldest token."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from buffer_helpers import make_config, make_group

from zerobubble.buffer.core import Buffer
from zerobubble.common.errors import InvalidInput
from zerobubble.common.token_versions import per_token, version_spans
from zerobubble.v1 import common_pb2

TOKENS = 8


def with_spans(group: common_pb2.ExperienceGroup, index: int, versions: list[int]) -> common_pb2.ExperienceGroup:
    """Trajectory `index` drawn by `versions` (one a token), as a rollout worker writes it."""
    oldest, spans = version_spans(np.asarray(versions))
    trajectory = group.trajectories[index]
    trajectory.policy_version = oldest
    del trajectory.version_spans[:]
    trajectory.version_spans.extend(spans)
    return group


@pytest.fixture
def open_buffer(tmp_path, clock):
    opened = []

    def start(**overrides):
        buffer = Buffer(make_config(tmp_path, 4, validation__max_version_ahead=10, **overrides), clock=clock)
        opened.append(buffer)
        return buffer

    yield start
    for buffer in opened:
        buffer.close()


def test_per_token_versions_survive_a_restart(open_buffer):
    buffer = open_buffer()
    prompt = buffer.lease_prompts("w", 1).prompts[0]
    versions = [0, 0, 0, 1, 1, 2, 2, 2]
    buffer.push(with_spans(make_group(prompt, "w", 0), 2, versions))
    buffer.close()

    buffer = open_buffer()
    item, = [i for i in buffer.pull(0, 1, 1, 0) if i.payload is not None]
    trajectory = common_pb2.ExperienceGroup.FromString(item.payload).trajectories[2]
    assert [(s.start, s.version) for s in trajectory.version_spans] == [(0, 0), (3, 1), (5, 2)]
    assert trajectory.policy_version == 0
    np.testing.assert_array_equal(per_token(trajectory, TOKENS), versions)


def test_the_staleness_bound_reads_the_oldest_token(open_buffer):
    buffer = open_buffer(run_spec__max_staleness=1)
    fresh_tail, fresh = buffer.lease_prompts("w", 2).prompts
    # Mostly version 3, but its first token was drawn by version 0: three behind the consuming version 3.
    buffer.push(with_spans(make_group(fresh_tail, "w", 0, version=3), 0, [0] + [3] * (TOKENS - 1)))
    buffer.push(make_group(fresh, "w", 1, version=3))
    buffer.set_policy_version(3)
    delivered = [common_pb2.ExperienceGroup.FromString(i.payload).prompt.prompt_id
                 for i in buffer.pull(0, 1, 2, 0) if i.payload is not None]
    assert delivered == [fresh.prompt_id]
    assert buffer.stats()["stale_dropped"] == 1


BAD_SPANS = {
    "trajectories[1].version_spans[0].start": lambda t: t.version_spans.extend(
        [common_pb2.VersionSpan(start=1, version=0), common_pb2.VersionSpan(start=4, version=1)]),
    "trajectories[1].version_spans[1].start": lambda t: t.version_spans.extend(
        [common_pb2.VersionSpan(start=0, version=0), common_pb2.VersionSpan(start=0, version=1)]),
    "trajectories[1].version_spans[2].start": lambda t: t.version_spans.extend(
        [common_pb2.VersionSpan(start=0, version=0), common_pb2.VersionSpan(start=3, version=1),
         common_pb2.VersionSpan(start=TOKENS, version=2)]),
    "trajectories[1].version_spans[1].version": lambda t: t.version_spans.extend(
        [common_pb2.VersionSpan(start=0, version=0), common_pb2.VersionSpan(start=3, version=11)]),
    "trajectories[1].policy_version": lambda t: (t.version_spans.extend(
        [common_pb2.VersionSpan(start=0, version=1), common_pb2.VersionSpan(start=3, version=2)]),
        setattr(t, "policy_version", 2)),
}


@pytest.mark.parametrize("field", BAD_SPANS)
def test_bad_spans_are_refused_naming_the_field(open_buffer, field):
    buffer = open_buffer()
    prompt = buffer.lease_prompts("w", 1).prompts[0]
    group = make_group(prompt, "w", 0)
    BAD_SPANS[field](group.trajectories[1])
    with pytest.raises(InvalidInput) as refused:
        buffer.push(group)
    assert refused.value.field == field
    assert buffer.stats()["groups_in"] == 0


def test_a_bad_span_over_grpc_is_invalid_argument_in_its_ack(serve):
    _, client = serve(prompts=1, validation__max_version_ahead=1)
    prompt = client.lease("w", 1).prompts[0]
    group = with_spans(make_group(prompt, "w", 0), 0, [0, 0, 1, 1, 1, 1, 1, 1])
    group.trajectories[0].version_spans[1].start = 9
    bad, good = list(client.push([group, with_spans(make_group(prompt, "w", 1), 0, [0, 0, 1, 1, 1, 1, 1, 1])]))
    assert (bad.code, bad.stored) == (grpc.StatusCode.INVALID_ARGUMENT.value[0], False)
    assert bad.error.startswith("trajectories[0].version_spans[1].start:"), bad.error
    assert good.stored
