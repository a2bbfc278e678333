"""The teacher's log-probs of a batch's response tokens, asked where the update needs them.

The trainer, not the rollout worker, asks: the teacher scores exactly the ids the step trains on (prompt and response
as collated, the tokens the engine sampled), only the groups the buffer's filters kept are scored, and the experience
(protobuf, buffer, write-ahead log) carries nothing new. The price is the teacher's forward in the step's critical
path; the teacher's own batching keeps it to one request per max_sequences samples."""

from __future__ import annotations

import numpy as np
import torch

from zerobubble.common.clients.teacher import TeacherClient
from zerobubble.trainer.collate import ExperienceBatch


def teacher_sequences(batch: ExperienceBatch) -> list[tuple[np.ndarray, int]]:
    """Each sample's prompt and response ids without padding, and where its response starts."""
    sequences = []
    for ids, attended in zip(batch.input_ids, batch.attention_mask.bool(), strict=True):
        prompt = int(attended[:batch.prompt_length].sum())
        sequences.append((ids[attended].numpy().astype(np.int32), prompt))
    return sequences


class TeacherScores:
    """batch -> [N, T] float32 log p_teacher of each response token (0 on padding), from the teacher service."""

    def __init__(self, client: TeacherClient):
        self.client = client

    def __call__(self, batch: ExperienceBatch) -> torch.Tensor:
        out = torch.zeros(batch.response_mask.shape)
        for row, scores in enumerate(self.client.logprobs(teacher_sequences(batch))):
            out[row, :len(scores)] = torch.from_numpy(scores)
        return out
