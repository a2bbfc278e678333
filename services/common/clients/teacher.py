"""TeacherClient: a student's side of the teacher service. It states the student's tokenizer at connect, splits a
batch into requests within the teacher's limits, and refuses an answer that is not one finite log-prob per scored
token: a NaN or a short answer would otherwise become the student's advantage."""

from __future__ import annotations

import grpc
import numpy as np

from zerobubble.common.client import ServiceClient
from zerobubble.common.codec import decode_array, encode_array
from zerobubble.common.config import ClientConfig, ConfigError
from zerobubble.common.errors import InvalidInput
from zerobubble.v1 import teacher_pb2, teacher_pb2_grpc

# Log-probs are at most 0; a teacher's float rounding may leave them a hair above.
_ROUNDING = 1e-4


class TokenizerMismatch(ConfigError):
    """The teacher's tokenizer names ids otherwise than the student's: refused before any step."""


class BadTeacherAnswer(ValueError):
    """The teacher answered something that is not one finite log-prob per scored token; the message names where."""


class TeacherClient(ServiceClient):
    stub_class = teacher_pb2_grpc.TeacherServiceStub

    def __init__(self, config: ClientConfig | str, fingerprint: str, tokenizer_name: str, **kwargs):
        super().__init__(config, **kwargs)
        self.fingerprint = fingerprint
        self.tokenizer_name = tokenizer_name
        self.limits: teacher_pb2.ConnectReply | None = None

    def connect(self, *, field: str = "teacher") -> teacher_pb2.ConnectReply:
        """The teacher's description, once it agrees on the tokenizer; waits for a teacher still starting (see
        first_call). TokenizerMismatch names both tokenizers."""
        request = teacher_pb2.ConnectRequest(tokenizer_fingerprint=self.fingerprint, tokenizer_name=self.tokenizer_name)
        try:
            reply = self.first_call("Connect", request, peer="teacher", field=field)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                raise TokenizerMismatch(f"{field}: {exc.details()}") from None
            raise
        # A teacher of another build may not check: the student checks too.
        if reply.tokenizer_fingerprint != self.fingerprint:
            raise TokenizerMismatch(
                f"{field}: the student tokenizer {self.tokenizer_name} (fingerprint {self.fingerprint[:12]}) does not "
                f"name token ids as the teacher's {reply.tokenizer_name} (fingerprint "
                f"{reply.tokenizer_fingerprint[:12]}) does")
        self.limits = reply
        return reply

    def logprobs(self, sequences: list[tuple[np.ndarray, int]], *,
                 timeout: float | None = None) -> list[np.ndarray]:
        """log p_teacher(ids[t] | ids[:t]) for t in score_from..len-1 of each (ids, score_from), checked."""
        if self.limits is None:
            self.connect()
        out: list[np.ndarray] = []
        for part in self._requests(sequences):
            request = teacher_pb2.LogprobsRequest(
                tokenizer_fingerprint=self.fingerprint,
                sequences=[teacher_pb2.TokenSequence(token_ids=encode_array(np.asarray(ids, dtype=np.int32)),
                                                     score_from=start) for ids, start in part])
            reply = self.unary("Logprobs", request, timeout=timeout)
            out += checked_answer(reply, part, first=len(out))
        return out

    def _requests(self, sequences: list[tuple[np.ndarray, int]]) -> list[list[tuple[np.ndarray, int]]]:
        """Consecutive runs of sequences within the teacher's max_sequences and max_tokens_per_request."""
        limits = self.limits
        parts: list[list[tuple[np.ndarray, int]]] = [[]]
        tokens = 0
        for i, item in enumerate(sequences):
            if len(item[0]) > limits.max_sequence_tokens:
                raise InvalidInput(f"{len(item[0])} ids are more than the teacher takes in one sequence "
                                   f"({limits.max_sequence_tokens})", field=f"sequences[{i}]")
            if parts[-1] and (len(parts[-1]) == limits.max_sequences
                              or tokens + len(item[0]) > limits.max_tokens_per_request):
                parts.append([])
                tokens = 0
            parts[-1].append(item)
            tokens += len(item[0])
        return parts


def checked_answer(reply: teacher_pb2.LogprobsReply, asked: list[tuple[np.ndarray, int]],
                   first: int = 0) -> list[np.ndarray]:
    """The reply's log-probs, refused (BadTeacherAnswer) unless one finite value at most 0 per scored token."""
    if len(reply.sequences) != len(asked):
        raise BadTeacherAnswer(f"the teacher answered {len(reply.sequences)} sequences for {len(asked)} asked")
    out = []
    for offset, (answer, (ids, start)) in enumerate(zip(reply.sequences, asked, strict=True)):
        where = f"sequences[{first + offset}].logprobs"
        try:
            values = decode_array(answer.logprobs, where, dtype="float32", ndim=1)
        except InvalidInput as exc:
            raise BadTeacherAnswer(f"the teacher's answer: {exc}") from None
        if len(values) != len(ids) - start:
            raise BadTeacherAnswer(f"{where}: the teacher gave {len(values)} log-probs for {len(ids) - start} "
                                   "scored tokens")
        if not np.isfinite(values).all():
            raise BadTeacherAnswer(f"{where}: the teacher gave a value that is not finite (NaN or infinite) at "
                                   f"token {int(np.argmin(np.isfinite(values)))}")
        if values.max(initial=0.0) > _ROUNDING:
            raise BadTeacherAnswer(f"{where}: the teacher gave a log-prob above 0 ({float(values.max())})")
        out.append(values.astype(np.float32))
    return out
