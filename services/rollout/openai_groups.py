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

from zerobubble.common.persistence import Stopped
from zerobubble.common.trajectory import Trajectory, carried_versions
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


def chain_trajectory(chain: dict, prefix: list[int], text: str, temperature: float) -> Trajectory:
    """The chain as one response after the group's prompt (`prefix`): its prompt past the prefix masked, then its
    own tokens, each with the tokens its distribution kept (top-p, top-k)."""
    head = chain["prompt_ids"][len(prefix):]
    mask = [0] * len(head) + chain["loss_mask"]
    return Trajectory(prompt_ids=prefix, response_ids=head + chain["response_ids"],
                      logprobs=[0.0] * len(head) + chain["logprobs"], loss_mask=mask,
                      versions=carried_versions([0] * len(head) + chain["policy_versions"], mask),
                      finish_reason=chain["finish_reason"], temperature=temperature, text=text,
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
        return worker.persist(lambda: worker.buffer.lease(self.producer_id, 1), "lease", worker.buffer,
                              stop=worker.stopping)

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
        # A group's trajectories are drawn at one temperature: its first session's.
        temperature = chains[0]["temperature"]
        samples = [chain_trajectory(chain, prefix, decode(chain["last_completion"], skip_special_tokens=True),
                                    temperature) for chain in chains]
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
            prompt, prefix, samples, scores, producer_id=self.producer_id,
            producer_incarnation=self.incarnation, sequence=sequence, lease_id=group.lease.lease_id)
        try:
            worker.push_groups([message])
            worker.persist(lambda: worker.buffer.complete(group.lease.lease_id), "complete lease", worker.buffer)
        except Stopped:
            raise RuntimeError("the service is stopping") from None
        return {"prompt_id": prompt.prompt_id, "rewards": [score.reward for score in scores],
                "prompt_ids": prefix, "trajectories": [{"response_ids": s.response_ids.tolist(),
                                                        "loss_mask": s.loss_mask.tolist()} for s in samples]}


def _given(reward: float) -> reward_pb2.ScoreResult:
    return reward_pb2.ScoreResult(reward=reward, format_ok=True, answer_ok=reward > 0)
