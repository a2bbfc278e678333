"""TeacherServicer: protobuf messages to the TeacherCore and back. The forward pass runs on the host's threads, so
the event loop never waits on the model."""

from __future__ import annotations

import asyncio

import numpy as np

from zerobubble.common.codec import decode_array, encode_array
from zerobubble.common.errors import TooLarge
from zerobubble.common.status import translate_errors
from zerobubble.teacher.core import Description, TeacherCore
from zerobubble.v1 import teacher_pb2, teacher_pb2_grpc


def to_reply(description: Description) -> teacher_pb2.ConnectReply:
    return teacher_pb2.ConnectReply(**vars(description))


class TeacherServicer(teacher_pb2_grpc.TeacherServiceServicer):
    def __init__(self, core: TeacherCore):
        self.core = core

    @translate_errors
    async def Connect(self, request, context):
        return to_reply(self.core.connect(request.tokenizer_fingerprint, request.tokenizer_name))

    @translate_errors
    async def Logprobs(self, request, context):
        limit = self.core.limits.max_sequences
        # Before decoding: a message of a million empty sequences costs seconds of the event loop to convert.
        if len(request.sequences) > limit:
            raise TooLarge(f"{len(request.sequences)} sequences exceed the limit of {limit} (limits.max_sequences)",
                           field="sequences")
        sequences = [(decode_array(s.token_ids, f"sequences[{i}].token_ids", dtype="int32", ndim=1), s.score_from)
                     for i, s in enumerate(request.sequences)]
        scores = await asyncio.to_thread(self.core.logprobs, sequences, request.tokenizer_fingerprint)
        return teacher_pb2.LogprobsReply(sequences=[
            teacher_pb2.TokenLogprobs(logprobs=encode_array(np.asarray(s, dtype=np.float32))) for s in scores])
