"""Ragged experience groups -> padded tensors for one training step.

Layout: prompts are left-padded to the longest prompt P and responses right-padded to the longest
response T, so every response token sits in columns P..P+T-1 and is predicted by the logits of
columns P-1..P+T-2 for every sample alike.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np
import torch

from zerobubble.common.codec import decode_array
from zerobubble.common.errors import InvalidInput
from zerobubble.common.token_versions import per_token
from zerobubble.v1 import common_pb2


@dataclass
class ExperienceBatch:
    input_ids: torch.Tensor           # [N, P+T] long
    attention_mask: torch.Tensor      # [N, P+T] long
    position_ids: torch.Tensor        # [N, P+T] long: positions restart after the left padding
    response_ids: torch.Tensor        # [N, T] long
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
    group_size: int                   # G: samples i*G..(i+1)*G-1 answer the same prompt
    prompt_length: int                # P

    @property
    def size(self) -> int:
        return self.rewards.shape[0]

    @property
    def response_lengths(self) -> torch.Tensor:
        return self.response_mask.sum(dim=1)

    def select(self, index: torch.Tensor | slice) -> ExperienceBatch:
        """The samples at `index` (a micro-batch); group structure is not kept."""
        parts = {}
        for field in fields(self):
            value = getattr(self, field.name)
            parts[field.name] = value[index] if isinstance(value, torch.Tensor) else value
        return ExperienceBatch(**parts)


def unusable(group: common_pb2.ExperienceGroup, vocab_size: int) -> str:
    """Why training on this group would poison or crash the step ("" when it would not): the trainer's own
    check, whatever the buffer let through (a buffer configured without the vocabulary size, or another
    version of it)."""
    try:
        arrays = [("prompt_ids", decode_array(group.prompt_ids, "prompt_ids", dtype="int32", ndim=1))]
        for i, trajectory in enumerate(group.trajectories):
            where = f"trajectories[{i}]"
            arrays.append((f"{where}.response_ids", decode_array(
                trajectory.response_ids, f"{where}.response_ids", dtype="int32", ndim=1)))
            logprobs = decode_array(trajectory.behaviour_logprobs, f"{where}.behaviour_logprobs",
                                    dtype="float32", ndim=1)
            if not np.isfinite(logprobs).all():
                return f"{where}.behaviour_logprobs: not finite"
            if not math.isfinite(trajectory.reward):
                return f"{where}.reward: not finite ({trajectory.reward})"
            loss_mask(trajectory, where)
            sampling_support(trajectory, where, vocab_size)
            if not (math.isfinite(trajectory.temperature) and trajectory.temperature > 0):
                return f"{where}.temperature: must be finite and above 0, got {trajectory.temperature}"
    except InvalidInput as exc:
        return str(exc)
    for field, ids in arrays:
        if len(ids) and (ids.min() < 0 or ids.max() >= vocab_size):
            return f"{field}: token ids outside [0, {vocab_size})"
    return ""


def loss_mask(trajectory: common_pb2.Trajectory, where: str) -> torch.Tensor | None:
    """Which response tokens the model sampled (None: all of them); the observation tokens of an episode are
    context the model reads, never targets it learns."""
    if not trajectory.HasField("loss_mask"):
        return None
    mask = decode_array(trajectory.loss_mask, f"{where}.loss_mask", dtype="uint8", ndim=1)
    if len(mask) != len(trajectory.response_ids.data) // 4 or mask.max(initial=0) > 1 or not mask.any():
        raise InvalidInput("must hold one 0 or 1 per response token, at least one of them 1",
                           field=f"{where}.loss_mask")
    return torch.from_numpy(mask.astype(np.float32))


def sampling_support(trajectory: common_pb2.Trajectory, where: str, vocab_size: int | None = None) -> np.ndarray | None:
    """How many tokens each position's sampling kept (None: the whole vocabulary everywhere)."""
    if not trajectory.HasField("sampling_support"):
        return None
    kept = decode_array(trajectory.sampling_support, f"{where}.sampling_support", dtype="int32", ndim=1)
    top = vocab_size if vocab_size is not None else np.iinfo(np.int32).max
    if len(kept) != len(trajectory.response_ids.data) // 4 or kept.min(initial=0) < 0 or kept.max(initial=0) > top:
        raise InvalidInput(f"must hold one count per response token, each from 0 to {top}",
                           field=f"{where}.sampling_support")
    return kept


def collate(groups: Sequence[common_pb2.ExperienceGroup], pad_id: int) -> ExperienceBatch:
    if not groups:
        raise ValueError("no groups to collate")
    sizes = {len(g.trajectories) for g in groups}
    if len(sizes) != 1:
        raise ValueError(f"groups of one step must have the same number of trajectories, got {sorted(sizes)}")
    prompts, responses, behaviour, masks, drawn_by, kept = [], [], [], [], [], []
    for g_index, group in enumerate(groups):
        prompt = torch.tensor(decode_array(group.prompt_ids, f"groups[{g_index}].prompt_ids", ndim=1))
        for t_index, trajectory in enumerate(group.trajectories):
            where = f"groups[{g_index}].trajectories[{t_index}]"
            prompts.append(prompt)
            responses.append(torch.tensor(decode_array(trajectory.response_ids, f"{where}.response_ids", ndim=1)))
            behaviour.append(torch.from_numpy(
                decode_array(trajectory.behaviour_logprobs, f"{where}.behaviour_logprobs", ndim=1)))
            masks.append(loss_mask(trajectory, where))
            drawn_by.append(torch.from_numpy(per_token(trajectory, len(responses[-1]))))
            kept.append(sampling_support(trajectory, where))
    n = len(responses)
    p_len = max(len(p) for p in prompts)
    t_len = max(len(r) for r in responses)
    input_ids = torch.full((n, p_len + t_len), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((n, p_len + t_len), dtype=torch.long)
    response_mask = torch.zeros((n, t_len))
    behaviour_logprobs = torch.zeros((n, t_len))
    trajectories = [t for g in groups for t in g.trajectories]
    versions = torch.tensor([t.policy_version for t in trajectories], dtype=torch.long)
    token_versions = versions[:, None].repeat(1, t_len)
    support = None if all(k is None for k in kept) else torch.zeros((n, t_len), dtype=torch.long)
    for i, (prompt, response, logprobs, mask) in enumerate(zip(prompts, responses, behaviour, masks, strict=True)):
        input_ids[i, p_len - len(prompt):p_len] = prompt
        input_ids[i, p_len:p_len + len(response)] = response
        attention_mask[i, p_len - len(prompt):p_len + len(response)] = 1
        response_mask[i, :len(response)] = 1 if mask is None else mask
        behaviour_logprobs[i, :len(logprobs)] = logprobs
        token_versions[i, :len(response)] = drawn_by[i]
        if support is not None and kept[i] is not None:
            support[i, :len(response)] = torch.from_numpy(kept[i].astype(np.int64))
    return ExperienceBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=(attention_mask.cumsum(dim=1) - 1).clamp(min=0),
        response_ids=input_ids[:, p_len:].clone(),
        response_mask=response_mask,
        behaviour_logprobs=behaviour_logprobs,
        rewards=torch.tensor([t.reward for t in trajectories], dtype=torch.float32),
        answer_ok=torch.tensor([t.answer_ok for t in trajectories]),
        format_ok=torch.tensor([t.format_ok for t in trajectories]),
        truncated=torch.tensor([t.finish_reason == common_pb2.FINISH_REASON_LENGTH for t in trajectories]),
        temperatures=torch.tensor([t.temperature for t in trajectories], dtype=torch.float32),
        versions=versions,
        token_versions=token_versions,
        turns=torch.tensor([t.episode.turns if t.HasField("episode") else 1 for t in trajectories],
                           dtype=torch.float32),
        tool_calls=torch.tensor([t.episode.tool_calls for t in trajectories], dtype=torch.float32),
        support=support,
        group_size=sizes.pop(),
        prompt_length=p_len,
    )
