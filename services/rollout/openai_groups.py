"""Closed sessions of the OpenAI-compatible endpoint become training groups.

`POST /v1/groups` leases one prompt from the buffer and opens run_spec.num_generations sessions on it; the caller
runs its agent once per session. When the last of them is closed the group is scored (a session closed without a
reward is judged by the row's verifier on its final answer), pushed through the worker's push path and the lease
completed. Each session trains its last chain of calls (the last sample stitch() made); earlier chains of a
session whose calls forked are dropped and counted (rollout_openai_chains_dropped_total). The group's prompt_ids
are the longest common prefix of the trained chains' prompts; what lies past it in a chain's prompt is the start
of that trajectory's response, masked. A group that cannot finish (a session dropped for idleness) gives its
prompt back to the buffer at once, pushing nothing; a lease never given back expires at the buffer.
"""

from __future__ import annotations

import logging
import threading
import uuid
from dataclasses import dataclass, field

import numpy as np

from zerobubble.common.persistence import Stopped
from zerobubble.rollout.engine import Sample
from zerobubble.rollout.episodes.driver import row_of as episode_row
from zerobubble.rollout.experience import experience_group
from zerobubble.v1 import buffer_pb2, common_pb2, reward_pb2

log = logging.getLogger(__name__)


@dataclass
class Group:
    lease: buffer_pb2.LeaseReply
    session_ids: list[str]
    # session id -> (its trained chain, its reward or None: the verifier's)
    closed: dict[str, tuple[dict, float | None]] = field(default_factory=dict)

    @property
    def prompt(self) -> common_pb2.Prompt:
        return self.lease.prompts[0]


def common_prefix(sequences: list[list[int]]) -> list[int]:
    first = sequences[0]
    length = len(first)
    for other in sequences[1:]:
        length = min(length, len(other))
        length = next((i for i in range(length) if first[i] != other[i]), length)
    return list(first[:length])


def trajectory_sample(chain: dict, prefix_length: int, text: str) -> Sample:
    """The chain as one response after the group's prompt: its prompt past the prefix masked, then its own
    tokens. A masked token takes the version of the sampled token before it (the first sampled one at the start),
    as an episode's observations do; the tokens each sampled one's distribution kept go with it (top-p, top-k)."""
    head = chain["prompt_ids"][prefix_length:]
    versions = [-1] * len(head) + chain["policy_versions"]
    sampled = [v for v in versions if v >= 0]
    current = sampled[0] if sampled else 0
    for i, version in enumerate(versions):
        current = version if version >= 0 else current
        versions[i] = current
    return Sample(token_ids=head + chain["response_ids"], logprobs=[0.0] * len(head) + chain["logprobs"],
                  finish_reason=chain["finish_reason"], text=text, versions=np.asarray(versions),
                  loss_mask=np.asarray([0] * len(head) + chain["loss_mask"], dtype=np.uint8),
                  support=[0] * len(head) + chain["support"])


def row_of(prompt: common_pb2.Prompt, ground_truth: bool = True) -> dict:
    """What the caller's agent needs of the leased row: as an environment's reset sees it (its id, messages, data
    source and ground truth, to score with), without the ground truth when `ground_truth` is off."""
    row = episode_row(prompt)
    if not ground_truth:
        del row["ground_truth"]
    return row


class GroupPusher:
    """Scores and pushes finished groups with `worker`'s clients, retries and deadlines, as a producer of its own
    (the worker's id + "/openai", its own incarnation and sequence numbers) so that its groups never share a
    sequence number with the worker loop's."""

    def __init__(self, worker):
        self.worker = worker
        self.incarnation = uuid.uuid4().hex
        self._sequence = 0
        self._lock = threading.Lock()

    @property
    def producer_id(self) -> str:
        return f"{self.worker.config.worker_id}/openai"

    def lease(self) -> buffer_pb2.LeaseReply:
        worker = self.worker
        return worker.persist(lambda: worker.buffer.lease(self.producer_id, 1), "lease", worker.buffer)

    def give_back(self, group: Group) -> bool:
        """The group's prompt goes back to the buffer's queue (its lease completed without a group); False when
        the buffer did not answer, and the prompt goes back only when the lease expires there."""
        try:
            self.worker.buffer.complete(group.lease.lease_id)
        except Exception as exc:  # noqa: BLE001 - the lease then expires at the buffer
            log.warning("giving back lease %s failed (it expires at the buffer): %s", group.lease.lease_id, exc)
            return False
        return True

    def push(self, group: Group) -> dict:
        worker = self.worker
        chains = [group.closed[s][0] for s in group.session_ids]
        rewards = [group.closed[s][1] for s in group.session_ids]
        prefix = common_prefix([chain["prompt_ids"] for chain in chains])
        decode = worker.engine.tokenizer.decode
        samples = [trajectory_sample(chain, len(prefix), decode(chain["last_completion"], skip_special_tokens=True))
                   for chain in chains]
        prompt = group.prompt
        verdicts = [None] * len(samples)
        unscored = [i for i, reward in enumerate(rewards) if reward is None]
        if unscored:
            scored = worker.player.score(
                lambda requests: worker.persist(lambda: worker.reward.score_batch(requests), "score", worker.reward),
                [prompt], [[samples[i] for i in unscored]], partial_credit=worker.config.reward.partial_credit,
                prompt_texts=[decode(prefix)])[0]
            for i, verdict in zip(unscored, scored, strict=True):
                verdicts[i] = verdict
        scores = [verdict if verdict is not None else
                  _given(reward) for verdict, reward in zip(verdicts, rewards, strict=True)]
        with self._lock:
            self._sequence += 1
            sequence = self._sequence
        message = experience_group(
            prompt, prefix, samples, scores, policy_version=min(int(s.versions.min()) for s in samples),
            temperature=chains[0]["temperature"], producer_id=self.producer_id,
            producer_incarnation=self.incarnation, sequence=sequence, lease_id=group.lease.lease_id)
        try:
            worker.push_groups([message])
            worker.persist(lambda: worker.buffer.complete(group.lease.lease_id), "complete lease", worker.buffer)
        except Stopped:
            raise RuntimeError("the service is stopping") from None
        return {"prompt_id": prompt.prompt_id, "rewards": [score.reward for score in scores],
                "prompt_ids": prefix, "trajectories": [{"response_ids": s.token_ids.tolist(),
                                                        "loss_mask": s.loss_mask.tolist()} for s in samples]}


def _given(reward: float) -> reward_pb2.ScoreResult:
    return reward_pb2.ScoreResult(reward=reward, format_ok=True, answer_ok=reward > 0)
