"""The teacher's log-probs of a batch's response tokens, asked where the update needs them.

The trainer, not the rollout worker, asks: the teacher scores exactly the ids the step trains on (prompt and response
as collated, the tokens the engine sampled), only the groups the buffer's filters kept are scored, and the experience
(protobuf, buffer, write-ahead log) carries nothing new. The price is the teacher's forward in the step's critical
path; the teacher's own batching keeps it to one request per max_sequences samples."""

from __future__ import annotations

import json
import threading

import numpy as np
import torch

from zerobubble.common.clients.teacher import TeacherClient
from zerobubble.common.persistence import until_done
from zerobubble.trainer.collate import ExperienceBatch

# The longest pause between two tries at a teacher that is down, slow or busy.
TEACHER_BACKOFF_MAX_SECONDS = 5.0


def teacher_sequences(batch: ExperienceBatch) -> list[tuple[np.ndarray, int]]:
    """Each sample's prompt and response ids, and where its response starts."""
    return [(sequence.numpy().astype(np.int32), int(prompt))
            for sequence, prompt in zip(batch.sequences, batch.prompt_lengths, strict=True)]


class TeacherContext:
    """Self-distillation's teacher prompt (SDFT: Shenfeld et al. 2026, "Self-Distillation Enables Continual
    Learning"; tinker-cookbook's sdft): the row's messages with `template` (its {answer} the row's ground-truth
    answer) added to the last user message, rendered by the model's chat template with the generation prompt. The
    response ids follow it unchanged: the teacher scores exactly the tokens the student sampled, in a context that
    knows the answer. The worker's system prompt is not in it: the teacher's context is the row and the answer."""

    def __init__(self, tokenizer, template: str):
        self.tokenizer = tokenizer
        self.template = template

    def prompt_ids(self, messages_json: str, answer: str | None) -> list[int]:
        messages = json.loads(messages_json)
        messages = [messages] if isinstance(messages, dict) else list(messages)
        last = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=None)
        context = self.template.format(answer=answer or "")
        if last is None:
            messages.append({"role": "user", "content": context})
        else:
            messages[last] = {**messages[last], "content": f"{messages[last]['content']}\n\n{context}"}
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def sequences(self, batch: ExperienceBatch) -> list[tuple[np.ndarray, int]]:
        """Each sample's teacher prompt then its response ids, and where the response starts."""
        rendered: dict[tuple[str, str | None], list[int]] = {}   # a group's samples share their prompt
        out = []
        for sequence, prompt_length, messages, answer in zip(batch.sequences, batch.prompt_lengths, batch.messages,
                                                             batch.answers, strict=True):
            prompt = rendered.setdefault((messages, answer), self.prompt_ids(messages, answer))
            response = sequence[int(prompt_length):].numpy()
            out.append((np.concatenate([np.asarray(prompt), response]).astype(np.int32), len(prompt)))
        return out


class TeacherScores:
    """batch -> [N, T] float32 log p_teacher of each response token (0 on padding), from the teacher services:
    each sample's data source's teacher in `routes`, else `client`; with a `context`, after the teacher's own prompt
    (self-distillation) rather than the student's.

    A teacher that is down, restarting, slow past the deadline or busy is waited for with backoff, a warning each
    try, for its client's retry_seconds; then the step fails with the last error (the client retries nothing
    itself: built with retries=False, one retry layer). close() ends the wait at once."""

    def __init__(self, client: TeacherClient, routes: dict[str, TeacherClient] | None = None,
                 context: TeacherContext | None = None):
        self.client = client
        self.routes = routes or {}
        self.context = context
        self.stopping = threading.Event()

    def __call__(self, batch: ExperienceBatch) -> torch.Tensor:
        sequences = teacher_sequences(batch) if self.context is None else self.context.sequences(batch)
        rows_of: dict[int, tuple[TeacherClient, list[int]]] = {}
        for row, source in enumerate(batch.data_sources):
            client = self.routes.get(source, self.client) if source is not None else self.client
            rows_of.setdefault(id(client), (client, []))[1].append(row)
        out = torch.zeros(batch.response_mask.shape)
        for client, rows in rows_of.values():
            asked = [sequences[row] for row in rows]
            answers = until_done(lambda c=client, a=asked: c.logprobs(a),
                                 what=f"teacher log-probs ({client.config.address})", stop=self.stopping,
                                 max_backoff=TEACHER_BACKOFF_MAX_SECONDS, give_up_seconds=client.config.retry_seconds)
            for row, scores in zip(rows, answers, strict=True):
                out[row, :len(scores)] = torch.from_numpy(scores)
        return out

    def close(self) -> None:
        self.stopping.set()
