"""RolloutServicer: Generate, Status, Pause and Resume over the worker core."""

from __future__ import annotations

import numpy as np

from zerobubble.common.codec import encode_array
from zerobubble.common.status import translate_errors
from zerobubble.common.trajectory_messages import FINISH_REASONS
from zerobubble.rollout.generate import GenerateCalls
from zerobubble.rollout.worker import RolloutWorker
from zerobubble.v1 import rollout_pb2, rollout_pb2_grpc


class RolloutServicer(rollout_pb2_grpc.RolloutServiceServicer):
    def __init__(self, worker: RolloutWorker, calls: GenerateCalls, engine_name: str):
        self.worker = worker
        self.calls = calls
        self.engine_name = engine_name

    @translate_errors
    def Generate(self, request, context):
        # Unset (zero) fields take the worker's own settings; a zero temperature is greedy.
        params = request.sampling
        samples, version = self.calls.generate(
            request.prompts, raw=request.raw, n=params.n or 1, temperature=params.temperature,
            top_p=params.top_p or 1.0, top_k=params.top_k or -1,
            max_new_tokens=params.max_new_tokens or self.worker.spec.max_new_tokens,
            stop=params.stop,
        )
        reply = rollout_pb2.GenerateReply(policy_version=version)
        for per_prompt in samples:
            for sample in per_prompt:
                reply.completions.append(rollout_pb2.Completion(
                    text=sample.text, token_ids=encode_array(np.asarray(sample.token_ids, dtype=np.int32)),
                    logprobs=encode_array(np.asarray(sample.logprobs, dtype=np.float32)),
                    finish_reason=FINISH_REASONS[sample.finish_reason],
                ))
        return reply

    def Status(self, request, context):
        worker = self.worker
        return rollout_pb2.RolloutStatusReply(
            worker_id=worker.config.worker_id, engine=self.engine_name,
            policy_version=worker.engine.policy_version, paused=worker.paused,
            groups_pushed=worker.groups_pushed, tokens_per_second=worker.tokens_per_second,
        )

    def Pause(self, request, context):
        self.worker.pause()
        return rollout_pb2.PauseReply()

    def Resume(self, request, context):
        self.worker.resume()
        return rollout_pb2.ResumeReply()
