"""Scored samples of one prompt -> the ExperienceGroup message the buffer stores."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from zerobubble.common.clients.reward import score_request
from zerobubble.common.codec import encode_array
from zerobubble.common.token_versions import version_spans
from zerobubble.rollout.engine import Sample
from zerobubble.v1 import common_pb2, reward_pb2

FINISH_REASONS = {"stop": common_pb2.FINISH_REASON_STOP, "length": common_pb2.FINISH_REASON_LENGTH}


def score_requests(verifier: str, prompt: common_pb2.Prompt, samples: Sequence[Sample], *,
                   partial_credit: bool = False, prompt_text: str = "") -> list[reward_pb2.ScoreRequest]:
    """One request per sample, carrying the prompt's ground truth (an answer or test cases), the prompt as the
    model saw it (`prompt_text`, for a reward model) and the row's id and data source (for custom verifiers)."""
    kind = prompt.WhichOneof("ground_truth")
    tests = None
    if kind == "test_cases":
        tests = {"inputs": list(prompt.test_cases.inputs), "outputs": list(prompt.test_cases.outputs)}
    gt_answer = prompt.gt_answer if kind == "gt_answer" else None
    metadata = {"prompt_id": prompt.prompt_id}
    if prompt.HasField("data_source"):
        metadata["data_source"] = prompt.data_source
    return [
        score_request(verifier, sample.text, gt_answer, tests, id=f"{prompt.prompt_id}/{i}",
                      partial_credit=partial_credit, prompt=prompt_text, metadata=metadata)
        for i, sample in enumerate(samples)
    ]


def experience_group(
    prompt: common_pb2.Prompt,
    prompt_ids: Sequence[int],
    samples: Sequence[Sample],
    scores: Sequence[reward_pb2.ScoreResult],
    *,
    policy_version: int,  # of the samples that carry no per-token versions
    temperature: float,
    producer_id: str,
    producer_incarnation: str,
    sequence: int,
    lease_id: str,
) -> common_pb2.ExperienceGroup:
    group = common_pb2.ExperienceGroup(
        prompt=prompt, prompt_ids=encode_array(np.asarray(prompt_ids, dtype=np.int32)),
        producer_id=producer_id, producer_incarnation=producer_incarnation, sequence=sequence, lease_id=lease_id,
    )
    for sample, score in zip(samples, scores, strict=True):
        oldest, spans = (policy_version, []) if sample.versions is None else version_spans(sample.versions)
        trajectory = common_pb2.Trajectory(
            response_ids=encode_array(sample.token_ids.astype(np.int32, copy=False)),
            behaviour_logprobs=encode_array(sample.logprobs.astype(np.float32, copy=False)),
            finish_reason=FINISH_REASONS[sample.finish_reason],
            reward=score.reward, format_ok=score.format_ok, answer_ok=score.answer_ok,
            policy_version=oldest, temperature=temperature, response_text=sample.text, version_spans=spans,
        )
        if sample.support is not None:
            trajectory.sampling_support.CopyFrom(encode_array(sample.support.astype(np.int32, copy=False)))
        if sample.loss_mask is not None:
            trajectory.loss_mask.CopyFrom(encode_array(sample.loss_mask.astype(np.uint8, copy=False)))
        if (record := sample.episode) is not None:
            trajectory.response_text = record.transcript
            trajectory.episode.CopyFrom(common_pb2.EpisodeInfo(
                environment=record.environment, turns=record.turns, tool_calls=record.tool_calls,
                step_rewards=record.step_rewards, ended_reason=record.ended_reason, error=record.error))
        group.trajectories.append(trajectory)
    return group
