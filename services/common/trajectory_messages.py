"""Trajectories at the edges: the plain form (common/trajectory.py) to the protobuf messages the buffer stores and
the trainer pulls, and back, refusing on the way in what the wire alone can get wrong (dtypes, shapes, version spans,
finish reasons), each refusal naming the field."""

from __future__ import annotations

import numpy as np

from zerobubble.common.codec import decode_array, encode_array
from zerobubble.common.errors import InvalidInput
from zerobubble.common.token_versions import check_spans, per_token, version_spans
from zerobubble.common.trajectory import FINISH_LENGTH, FINISH_STOP, EpisodeRecord, Trajectory
from zerobubble.v1 import common_pb2

FINISH_REASONS = {FINISH_STOP: common_pb2.FINISH_REASON_STOP, FINISH_LENGTH: common_pb2.FINISH_REASON_LENGTH}
_FINISH_NAMES = {wire: name for name, wire in FINISH_REASONS.items()}


def trajectory_message(trajectory: Trajectory) -> common_pb2.Trajectory:
    """The trajectory as the wire carries it: its versions as spans, its mask only where some token is masked, its
    support only where sampling was truncated (the prompt ids travel once, with the group)."""
    oldest, spans = version_spans(trajectory.versions)
    message = common_pb2.Trajectory(
        response_ids=encode_array(trajectory.response_ids), behaviour_logprobs=encode_array(trajectory.logprobs),
        finish_reason=FINISH_REASONS[trajectory.finish_reason], reward=trajectory.reward,
        format_ok=trajectory.format_ok, answer_ok=trajectory.answer_ok, policy_version=oldest,
        temperature=trajectory.temperature, response_text=trajectory.text, version_spans=spans)
    if trajectory.support is not None:
        message.sampling_support.CopyFrom(encode_array(trajectory.support))
    if not trajectory.loss_mask.all():
        message.loss_mask.CopyFrom(encode_array(trajectory.loss_mask))
    if (record := trajectory.episode) is not None:
        message.response_text = record.transcript
        message.episode.CopyFrom(common_pb2.EpisodeInfo(
            environment=record.environment, turns=record.turns, tool_calls=record.tool_calls,
            step_rewards=record.step_rewards, ended_reason=record.ended_reason, error=record.error))
    return message


def group_trajectories(group: common_pb2.ExperienceGroup, *, newest: int | None = None) -> list[Trajectory]:
    """The group's trajectories in the plain form, each with the group's prompt ids. `newest`: the highest policy
    version a token may name (None: no bound)."""
    prompt = decode_array(group.prompt_ids, "prompt_ids", dtype="int32", ndim=1)
    return [trajectory_of(message, prompt, f"trajectories[{i}]", newest=newest)
            for i, message in enumerate(group.trajectories)]


def trajectory_of(message: common_pb2.Trajectory, prompt_ids: np.ndarray, where: str, *,
                  newest: int | None = None) -> Trajectory:
    response = decode_array(message.response_ids, f"{where}.response_ids", dtype="int32", ndim=1)
    tokens = len(response)
    if message.finish_reason not in _FINISH_NAMES:
        raise InvalidInput(f"expected FINISH_REASON_STOP or FINISH_REASON_LENGTH, got {message.finish_reason}",
                           field=f"{where}.finish_reason")
    check_spans(message.version_spans, tokens, message.policy_version,
                np.iinfo(np.int64).max if newest is None else newest, where)
    mask = (decode_array(message.loss_mask, f"{where}.loss_mask", dtype="uint8", ndim=1)
            if message.HasField("loss_mask") else np.ones(tokens, dtype=np.uint8))
    support = (decode_array(message.sampling_support, f"{where}.sampling_support", dtype="int32", ndim=1)
               if message.HasField("sampling_support") else None)
    episode = None
    if message.HasField("episode"):
        info = message.episode
        episode = EpisodeRecord(info.environment, turns=info.turns, tool_calls=info.tool_calls,
                                step_rewards=list(info.step_rewards), ended_reason=info.ended_reason,
                                transcript=message.response_text, error=info.error)
    return Trajectory(
        prompt_ids=prompt_ids, response_ids=response,
        logprobs=decode_array(message.behaviour_logprobs, f"{where}.behaviour_logprobs", dtype="float32", ndim=1),
        loss_mask=mask, versions=per_token(message, tokens), finish_reason=_FINISH_NAMES[message.finish_reason],
        temperature=message.temperature, text=message.response_text, support=support, episode=episode,
        reward=message.reward, format_ok=message.format_ok, answer_ok=message.answer_ok)
