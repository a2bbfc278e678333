"""Checks on a pushed group that need no buffer state; each failure names the offending field."""

from __future__ import annotations

from zerobubble.common.codec import decode_array
from zerobubble.common.errors import InvalidInput
from zerobubble.v1 import common_pb2


def check_group(group: common_pb2.ExperienceGroup, size: int, *, num_generations: int | None, max_bytes: int) -> None:
    """Refuse a malformed group of `size` serialized bytes with InvalidInput."""
    if size > max_bytes:
        raise InvalidInput(f"the group is {size} bytes, over the limit of {max_bytes}", field="group")
    if not group.producer_id:
        raise InvalidInput("must not be empty", field="producer_id")
    if group.sequence < 0:
        raise InvalidInput(f"must not be negative, got {group.sequence}", field="sequence")
    if not group.HasField("prompt") or not group.prompt.prompt_id:
        raise InvalidInput("must not be empty", field="prompt.prompt_id")
    decode_array(group.prompt_ids, "prompt_ids", dtype="int32", ndim=1)
    count = len(group.trajectories)
    if count == 0 or (num_generations is not None and count != num_generations):
        expected = num_generations if num_generations is not None else "at least 1"
        raise InvalidInput(f"expected {expected} trajectories, got {count}", field="trajectories")
    for i, trajectory in enumerate(group.trajectories):
        where = f"trajectories[{i}]"
        tokens = decode_array(trajectory.response_ids, f"{where}.response_ids", dtype="int32", ndim=1)
        if len(tokens) == 0:
            raise InvalidInput("empty response", field=f"{where}.response_ids")
        logprobs = decode_array(
            trajectory.behaviour_logprobs, f"{where}.behaviour_logprobs", dtype="float32", ndim=1
        )
        if len(logprobs) != len(tokens):
            raise InvalidInput(f"{len(logprobs)} log-probs for {len(tokens)} tokens",
                               field=f"{where}.behaviour_logprobs")
        if trajectory.policy_version < 0:
            raise InvalidInput(f"must not be negative, got {trajectory.policy_version}",
                               field=f"{where}.policy_version")
