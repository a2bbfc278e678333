"""Experience groups -> one training step's batch, each sample one flat masked sequence.

A sample is its prompt and response ids end to end, without padding: what the model reads, packed once into rows
by trainer/sequences.py (or padded there, for a model that cannot take packed rows). What the loss reads is per
response token, [N, T] with T the longest response: the loss mask (1 where the model sampled the token: never
padding, never an episode's observations), behaviour log-probs, versions and sampling support.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np
import torch

from zerobubble.common.errors import InvalidInput
from zerobubble.common.trajectory_messages import group_trajectories
from zerobubble.v1 import common_pb2


@dataclass
class ExperienceBatch:
    sequences: list[torch.Tensor]     # N x [P_i + T_i] long: each sample's prompt then response ids, no padding
    prompt_lengths: torch.Tensor      # [N] long: P_i
    response_mask: torch.Tensor       # [N, T] float: 1 on response tokens the model sampled (not on padding, nor
                                      # on an episode's observation tokens): the positions the loss counts
    behaviour_logprobs: torch.Tensor  # [N, T] float32: under the distribution each token was drawn from
    rewards: torch.Tensor             # [N] float32
    answer_ok: torch.Tensor           # [N] bool
    format_ok: torch.Tensor           # [N] bool
    truncated: torch.Tensor           # [N] bool: stopped by max_new_tokens
    temperatures: torch.Tensor        # [N] float32: each sample's sampling temperature
    versions: torch.Tensor            # [N] long: the oldest policy version among each sample's tokens
    token_versions: torch.Tensor      # [N, T] long: the version that drew each token (padding: the sample's)
    turns: torch.Tensor               # [N] float32: assistant turns of each sample's episode (1: single turn)
    tool_calls: torch.Tensor          # [N] float32: tool calls of each sample's episode
    # [N, T] long: tokens the engine's top-k / top-p kept at each position (0: the whole vocabulary); None: no
    # sample of the batch was truncated. The trainer's log-probs are taken over the same support.
    support: torch.Tensor | None
    data_sources: list[str | None]    # N: each sample's prompt row's data source (None: the row names none)
    messages: list[str]               # N: each sample's prompt row's messages, as JSON (a self-distilling teacher's)
    answers: list[str | None]         # N: each sample's ground-truth answer (None: the row has test cases instead)
    group_size: int                   # G: samples i*G..(i+1)*G-1 answer the same prompt
    pad_id: int                       # for a layout that pads

    @property
    def size(self) -> int:
        return self.rewards.shape[0]

    @property
    def response_lengths(self) -> torch.Tensor:
        """The model's tokens of each sample (an episode's observations not among them)."""
        return self.response_mask.sum(dim=1)

    @property
    def sequence_lengths(self) -> torch.Tensor:
        """[N] each sample's prompt + response tokens: what a packed forward costs it."""
        return torch.tensor([len(s) for s in self.sequences], dtype=torch.long)

    def select(self, index: torch.Tensor | slice) -> ExperienceBatch:
        """The samples at `index` (a micro-batch); group structure is not kept."""
        picked = range(self.size)[index] if isinstance(index, slice) else index.tolist()
        parts = {}
        for field in fields(self):
            value = getattr(self, field.name)
            if isinstance(value, torch.Tensor):
                value = value[index]
            elif isinstance(value, list):
                value = [value[i] for i in picked]
            parts[field.name] = value
        return ExperienceBatch(**parts)


def unusable(group: common_pb2.ExperienceGroup, vocab_size: int) -> str:
    """Why training on this group would poison or crash the step ("" when it would not): the trainer's own
    check, the buffer's (common/trajectory.py), whatever the buffer let through (a buffer configured without the
    vocabulary size, or another version of it)."""
    try:
        for i, trajectory in enumerate(group_trajectories(group)):
            trajectory.check(f"trajectories[{i}]", vocab_size=vocab_size)
    except InvalidInput as exc:
        return str(exc)
    return ""


def collate(groups: Sequence[common_pb2.ExperienceGroup], pad_id: int) -> ExperienceBatch:
    if not groups:
        raise ValueError("no groups to collate")
    sizes = {len(g.trajectories) for g in groups}
    if len(sizes) != 1:
        raise ValueError(f"groups of one step must have the same number of trajectories, got {sorted(sizes)}")
    trajectories = [t for group in groups for t in group_trajectories(group)]
    n = len(trajectories)
    t_len = max(len(t.response_ids) for t in trajectories)
    response_mask = torch.zeros((n, t_len))
    behaviour_logprobs = torch.zeros((n, t_len))
    versions = torch.tensor([int(t.versions.min()) for t in trajectories], dtype=torch.long)
    token_versions = versions[:, None].repeat(1, t_len)
    truncating = any(t.support is not None for t in trajectories)
    support = torch.zeros((n, t_len), dtype=torch.long) if truncating else None
    for i, t in enumerate(trajectories):
        length = len(t.response_ids)
        response_mask[i, :length] = torch.from_numpy(t.loss_mask.astype(np.float32))
        behaviour_logprobs[i, :length] = torch.from_numpy(t.logprobs)
        token_versions[i, :length] = torch.from_numpy(t.versions)
        if support is not None and t.support is not None:
            support[i, :length] = torch.from_numpy(t.support.astype(np.int64))
    return ExperienceBatch(
        sequences=[torch.from_numpy(np.concatenate([t.prompt_ids, t.response_ids]).astype(np.int64))
                   for t in trajectories],
        prompt_lengths=torch.tensor([len(t.prompt_ids) for t in trajectories], dtype=torch.long),
        response_mask=response_mask,
        behaviour_logprobs=behaviour_logprobs,
        rewards=torch.tensor([t.reward for t in trajectories], dtype=torch.float32),
        answer_ok=torch.tensor([t.answer_ok for t in trajectories]),
        format_ok=torch.tensor([t.format_ok for t in trajectories]),
        truncated=torch.tensor([t.truncated for t in trajectories]),
        temperatures=torch.tensor([t.temperature for t in trajectories], dtype=torch.float32),
        versions=versions,
        token_versions=token_versions,
        turns=torch.tensor([t.episode.turns if t.episode else 1 for t in trajectories], dtype=torch.float32),
        tool_calls=torch.tensor([t.episode.tool_calls if t.episode else 0 for t in trajectories],
                                dtype=torch.float32),
        support=support,
        data_sources=[g.prompt.data_source if g.prompt.HasField("data_source") else None
                      for g in groups for _ in g.trajectories],
        messages=[g.prompt.messages_json for g in groups for _ in g.trajectories],
        answers=[g.prompt.gt_answer if g.prompt.WhichOneof("ground_truth") == "gt_answer" else None
                 for g in groups for _ in g.trajectories],
        group_size=sizes.pop(),
        pad_id=pad_id,
    )
