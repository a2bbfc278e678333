"""Checks on a pushed group; each failure names the offending field.

Every value a group carries reaches the trainer's arithmetic or its allocations: a NaN reward makes a
NaN step, an out-of-vocabulary id an IndexError, a long response a padded tensor of that length for
every sample of the step. So each is checked here, before anything of the group is stored.
"""

from __future__ import annotations

from zerobubble.buffer.config import BufferServiceConfig
from zerobubble.common.codec import decode_array
from zerobubble.common.errors import InvalidInput, TooLarge
from zerobubble.common.names import check_name
from zerobubble.common.trajectory_messages import trajectory_of
from zerobubble.v1 import common_pb2


def check_group(group: common_pb2.ExperienceGroup, size: int, config: BufferServiceConfig, *,
                policy_version: int) -> None:
    """Refuse a malformed group of `size` serialized bytes: InvalidInput, or TooLarge over a configured limit.

    `policy_version` is the buffer's current one, which a trajectory may be only so far ahead of."""
    limits, spec = config.validation, config.run_spec
    max_bytes = config.capacity.max_group_bytes
    if size > max_bytes:
        raise InvalidInput(f"the group is {size} bytes, over the limit of {max_bytes}", field="group")
    check_name(group.producer_id, "producer_id", required=True)
    check_name(group.producer_incarnation, "producer_incarnation", required=False)
    if group.sequence < 0:
        raise InvalidInput(f"must not be negative, got {group.sequence}", field="sequence")
    if not group.HasField("prompt") or not group.prompt.prompt_id:
        raise InvalidInput("must not be empty", field="prompt.prompt_id")
    prompt = decode_array(group.prompt_ids, "prompt_ids", dtype="int32", ndim=1)
    count = len(group.trajectories)
    if count > limits.max_trajectories:
        raise TooLarge(f"{count} trajectories, over the limit of {limits.max_trajectories}", field="trajectories")
    if count != spec.num_generations:
        raise InvalidInput(f"expected {spec.num_generations} trajectories (run_spec.num_generations), got {count}",
                           field="trajectories")
    newest = policy_version + limits.max_version_ahead
    for i, message in enumerate(group.trajectories):
        where = f"trajectories[{i}]"
        if not 0 <= message.policy_version <= newest:
            raise InvalidInput(f"expected 0 to {newest} (the buffer's policy version {policy_version} plus "
                               f"validation.max_version_ahead), got {message.policy_version}",
                               field=f"{where}.policy_version")
        trajectory_of(message, prompt, where, newest=newest).check(
            where, vocab_size=spec.model.vocab_size, max_prompt_tokens=limits.max_prompt_tokens,
            max_response_tokens=limits.max_response_tokens)
