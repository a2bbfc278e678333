"""The teacher's core: checks a request against the limits and the student's tokenizer, then scores it on the model
one request at a time. Knows nothing of gRPC; the servicer maps its errors to status codes."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from zerobubble.common.errors import InvalidInput, Overloaded, ServiceError, TooLarge, Unavailable
from zerobubble.teacher.config import TeacherLimits
from zerobubble.teacher.metrics import TeacherMetrics


class TokenizerMismatch(Unavailable):
    """The student's ids name other tokens than the teacher's (FAILED_PRECONDITION)."""


class Scorer(Protocol):
    path: str
    fingerprint: str
    tokenizer_name: str
    vocab_size: int
    max_positions: int | None

    def logprobs(self, sequences: list[tuple[np.ndarray, int]]) -> list[np.ndarray]: ...


@dataclass(frozen=True)
class Description:
    model: str
    tokenizer_fingerprint: str
    tokenizer_name: str
    vocab_size: int
    max_sequences: int
    max_tokens_per_request: int
    max_sequence_tokens: int


class TeacherCore:
    def __init__(self, scorer: Scorer, limits: TeacherLimits, metrics: TeacherMetrics):
        self.scorer = scorer
        self.limits = limits
        self.metrics = metrics
        self.max_sequence_tokens = limits.max_sequence_tokens or scorer.max_positions or limits.max_tokens_per_request
        self._model = threading.Lock()
        self._waiting = 0
        self._count = threading.Lock()

    @property
    def waiting(self) -> int:
        """Requests on the model or queued for it."""
        return self._waiting

    def describe(self) -> Description:
        return Description(self.scorer.path, self.scorer.fingerprint, self.scorer.tokenizer_name,
                           self.scorer.vocab_size, self.limits.max_sequences, self.limits.max_tokens_per_request,
                           self.max_sequence_tokens)

    def connect(self, fingerprint: str, name: str) -> Description:
        self.check_tokenizer(fingerprint, name)
        return self.describe()

    def check_tokenizer(self, fingerprint: str, name: str = "") -> None:
        if not fingerprint:
            raise InvalidInput("the student tokenizer's fingerprint is required", field="tokenizer_fingerprint")
        if fingerprint != self.scorer.fingerprint:
            student = f"{name or 'the student tokenizer'} (fingerprint {fingerprint[:12]})"
            raise TokenizerMismatch(
                f"{student} does not name token ids as the teacher's tokenizer {self.scorer.tokenizer_name} "
                f"(fingerprint {self.scorer.fingerprint[:12]}) does: the teacher would score other tokens than the "
                "student drew", field="tokenizer_fingerprint")

    def check(self, sequences: list[tuple[np.ndarray, int]]) -> None:
        """Every bound and id of the request, before it waits for the model."""
        limits = self.limits
        if not sequences:
            raise InvalidInput("at least one sequence is needed", field="sequences")
        if len(sequences) > limits.max_sequences:
            raise TooLarge(f"{len(sequences)} sequences exceed the limit of {limits.max_sequences} "
                           "(limits.max_sequences)", field="sequences")
        total = sum(len(ids) for ids, _ in sequences)
        if total > limits.max_tokens_per_request:
            raise TooLarge(f"{total} token ids exceed the limit of {limits.max_tokens_per_request} "
                           "(limits.max_tokens_per_request)", field="sequences")
        for i, (ids, start) in enumerate(sequences):
            where = f"sequences[{i}]"
            if len(ids) > self.max_sequence_tokens:
                raise TooLarge(f"{len(ids)} token ids exceed the limit of {self.max_sequence_tokens} "
                               "(limits.max_sequence_tokens, else the model's max_position_embeddings)",
                               field=f"{where}.token_ids")
            if not 1 <= start < len(ids):
                raise InvalidInput(f"must be from 1 to {len(ids) - 1} (the sequence has {len(ids)} ids), got {start}",
                                   field=f"{where}.score_from")
            if ids.min() < 0 or ids.max() >= self.scorer.vocab_size:
                raise InvalidInput(f"ids outside [0, {self.scorer.vocab_size}) (the teacher's vocabulary)",
                                   field=f"{where}.token_ids")

    def logprobs(self, sequences: list[tuple[np.ndarray, int]], fingerprint: str) -> list[np.ndarray]:
        started = time.monotonic()
        try:
            self.check_tokenizer(fingerprint)
            self.check(sequences)
            out = self._scored(sequences)
        except Overloaded:
            self.metrics.requests.labels("overloaded").inc()
            raise
        except ServiceError:
            self.metrics.requests.labels("refused").inc()
            raise
        self.metrics.requests.labels("scored").inc()
        self.metrics.tokens.inc(sum(len(ids) - start for ids, start in sequences))
        self.metrics.seconds.observe(time.monotonic() - started)
        return out

    def _scored(self, sequences: list[tuple[np.ndarray, int]]) -> list[np.ndarray]:
        """The model's answer, one request on it at a time; Overloaded when too many already wait."""
        with self._count:
            if self._waiting > self.limits.max_waiting_requests:
                raise Overloaded(f"{self._waiting} requests wait for the model (limits.max_waiting_requests); "
                                 "retry later")
            self._waiting += 1
        try:
            with self._model:
                out = []
                for batch in self._batches(sequences):
                    out += self.scorer.logprobs(batch)
                return out
        finally:
            with self._count:
                self._waiting -= 1

    def _batches(self, sequences: list[tuple[np.ndarray, int]]) -> list[list[tuple[np.ndarray, int]]]:
        """Consecutive sequences whose padded size stays within limits.batch_tokens (a longer one alone)."""
        batches: list[list[tuple[np.ndarray, int]]] = [[]]
        width = 0
        for item in sequences:
            wider = max(width, len(item[0]))
            if batches[-1] and wider * (len(batches[-1]) + 1) > self.limits.batch_tokens:
                batches.append([])
                wider = len(item[0])
            batches[-1].append(item)
            width = wider
        return batches
