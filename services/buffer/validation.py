"""Checks on a pushed group; each failure names the offending field.

Every value a group carries reaches the trainer's arithmetic or its allocations: a NaN reward makes a
NaN step, an out-of-vocabulary id an IndexError, a long response a padded tensor of that length for
every sample of the step. So each is checked here, before anything of the group is stored.
"""

from __future__ import annotations

import math

import numpy as np

from zerobubble.buffer.config import BufferServiceConfig
from zerobubble.common.codec import decode_array
from zerobubble.common.errors import InvalidInput, TooLarge
from zerobubble.common.names import check_name
from zerobubble.common.token_versions import check_spans
from zerobubble.v1 import common_pb2

FINISH_REASONS = {common_pb2.FINISH_REASON_STOP, common_pb2.FINISH_REASON_LENGTH}
# Engines compute log-probs in reduced precision (bf16 logits, fused kernels), so a token drawn with
# probability ~1 may come back a hair above 0; anything clearly positive is not a log-probability.
LOGPROB_TOLERANCE = 1e-3


def _check_length(tokens: np.ndarray, field: str, limit: int) -> None:
    if len(tokens) == 0:
        raise InvalidInput("must not be empty", field=field)
    if len(tokens) > limit:
        raise TooLarge(f"{len(tokens)} tokens, over the limit of {limit}", field=field)


def _ids_problem(ids: np.ndarray, vocab_size: int | None) -> str:
    # Read as unsigned, a negative id is above any vocabulary: one pass checks both bounds.
    if ids.min() >= 0 if vocab_size is None else ids.view(np.uint32).max() < vocab_size:
        return ""
    bound = "" if vocab_size is None else f", below the vocabulary size {vocab_size}"
    return f"token ids must be non-negative{bound}; got {int(ids.min())} to {int(ids.max())}"


def _logprobs_problem(logprobs: np.ndarray) -> str:
    # min and max carry a NaN through: two reductions instead of a mask per condition.
    if not (np.isfinite(logprobs.min()) and logprobs.max() <= LOGPROB_TOLERANCE):
        return "log-probabilities must be finite and not above 0"
    return ""


def _check_loss_mask(array: common_pb2.Array, tokens: int, where: str) -> None:
    """A multi-turn response's mask: one 0/1 per token, and at least one token the model sampled (a response
    with none would train on nothing, and divide by its zero model tokens)."""
    field = f"{where}.loss_mask"
    mask = decode_array(array, field, dtype="uint8", ndim=1)
    if len(mask) != tokens:
        raise InvalidInput(f"{len(mask)} mask values for {tokens} tokens", field=field)
    highest = mask.max()  # one pass: above 1 is no mask value, 0 means no token is the model's
    if highest > 1:
        raise InvalidInput(f"values must be 0 or 1, got {int(highest)}", field=field)
    if highest == 0:
        raise InvalidInput("no token is the model's (every value is 0)", field=field)


def _check_support(array: common_pb2.Array, tokens: int, vocab_size: int | None, where: str) -> None:
    """One count of kept tokens per response token, 0 (the whole vocabulary) to the vocabulary size."""
    field = f"{where}.sampling_support"
    kept = decode_array(array, field, dtype="int32", ndim=1)
    top = np.iinfo(np.int32).max if vocab_size is None else vocab_size
    if len(kept) != tokens or kept.min(initial=0) < 0 or kept.max(initial=0) > top:
        raise InvalidInput(f"must hold one count per token ({tokens}), each from 0 to {top}", field=field)


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
    _check_length(prompt, "prompt_ids", limits.max_prompt_tokens)
    if problem := _ids_problem(prompt, spec.model.vocab_size):
        raise InvalidInput(problem, field="prompt_ids")
    count = len(group.trajectories)
    if count > limits.max_trajectories:
        raise TooLarge(f"{count} trajectories, over the limit of {limits.max_trajectories}", field="trajectories")
    if count != spec.num_generations:
        raise InvalidInput(f"expected {spec.num_generations} trajectories (run_spec.num_generations), got {count}",
                           field="trajectories")
    newest = policy_version + limits.max_version_ahead
    for i, trajectory in enumerate(group.trajectories):
        where = f"trajectories[{i}]"
        tokens = decode_array(trajectory.response_ids, f"{where}.response_ids", dtype="int32", ndim=1)
        _check_length(tokens, f"{where}.response_ids", limits.max_response_tokens)
        behaviour = decode_array(
            trajectory.behaviour_logprobs, f"{where}.behaviour_logprobs", dtype="float32", ndim=1
        )
        if len(behaviour) != len(tokens):
            raise InvalidInput(f"{len(behaviour)} log-probs for {len(tokens)} tokens",
                               field=f"{where}.behaviour_logprobs")
        if trajectory.finish_reason not in FINISH_REASONS:
            raise InvalidInput(f"expected FINISH_REASON_STOP or FINISH_REASON_LENGTH, got {trajectory.finish_reason}",
                               field=f"{where}.finish_reason")
        if not math.isfinite(trajectory.reward):
            raise InvalidInput(f"must be finite, got {trajectory.reward}", field=f"{where}.reward")
        if not (math.isfinite(trajectory.temperature) and trajectory.temperature > 0):
            raise InvalidInput(f"must be finite and above 0, got {trajectory.temperature}",
                               field=f"{where}.temperature")
        if not 0 <= trajectory.policy_version <= newest:
            raise InvalidInput(f"expected 0 to {newest} (the buffer's policy version {policy_version} plus "
                               f"validation.max_version_ahead), got {trajectory.policy_version}",
                               field=f"{where}.policy_version")
        if trajectory.HasField("loss_mask"):
            _check_loss_mask(trajectory.loss_mask, len(tokens), where)
        if trajectory.HasField("sampling_support"):
            _check_support(trajectory.sampling_support, len(tokens), spec.model.vocab_size, where)
        check_spans(trajectory.version_spans, len(tokens), trajectory.policy_version, newest, where)
        # Each array in place, where it lies: gathering them into one first copied every byte of the group.
        if problem := _ids_problem(tokens, spec.model.vocab_size):
            raise InvalidInput(problem, field=f"{where}.response_ids")
        if problem := _logprobs_problem(behaviour):
            raise InvalidInput(problem, field=f"{where}.behaviour_logprobs")
