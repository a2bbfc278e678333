"""An engine's single-turn response as a trajectory, and the scored trajectories of one prompt as the ExperienceGroup
message the buffer stores."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from zerobubble.common.clients.reward import score_request
from zerobubble.common.codec import encode_array
from zerobubble.common.trajectory import Trajectory
from zerobubble.common.trajectory_messages import trajectory_message
from zerobubble.rollout.engine import Sample
from zerobubble.v1 import common_pb2, reward_pb2


def score_requests(verifier: str, prompt: common_pb2.Prompt, trajectories: Sequence[Trajectory], *,
                   partial_credit: bool = False, prompt_text: str = "") -> list[reward_pb2.ScoreRequest]:
    """One request per trajectory, carrying the prompt's ground truth (an answer or test cases), the prompt as the
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
        score_request(verifier, trajectory.text, gt_answer, tests, id=f"{prompt.prompt_id}/{i}",
                      partial_credit=partial_credit, prompt=prompt_text, metadata=metadata)
        for i, trajectory in enumerate(trajectories)
    ]


def single_turn(prompt_ids: Sequence[int], sample: Sample, *, policy_version: int,
                temperature: float) -> Trajectory:
    """An engine's response as a trajectory: every token the model's. `policy_version`: the engine's when the call
    returned, for engines that do not say per token."""
    versions = np.full(len(sample.token_ids), policy_version) if sample.versions is None else sample.versions
    return Trajectory(prompt_ids=prompt_ids, response_ids=sample.token_ids, logprobs=sample.logprobs,
                      loss_mask=np.ones(len(sample.token_ids), dtype=np.uint8), versions=versions,
                      finish_reason=sample.finish_reason, temperature=temperature, text=sample.text,
                      support=sample.support)


def experience_group(
    prompt: common_pb2.Prompt,
    prompt_ids: Sequence[int],
    trajectories: Sequence[Trajectory],
    scores: Sequence[reward_pb2.ScoreResult],
    *,
    producer_id: str,
    producer_incarnation: str,
    sequence: int,
    lease_id: str,
) -> common_pb2.ExperienceGroup:
    group = common_pb2.ExperienceGroup(
        prompt=prompt, prompt_ids=encode_array(np.asarray(prompt_ids, dtype=np.int32)),
        producer_id=producer_id, producer_incarnation=producer_incarnation, sequence=sequence, lease_id=lease_id,
    )
    for trajectory, score in zip(trajectories, scores, strict=True):
        trajectory.reward, trajectory.format_ok, trajectory.answer_ok = score.reward, score.format_ok, score.answer_ok
        group.trajectories.append(trajectory_message(trajectory))
    return group
