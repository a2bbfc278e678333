"""RolloutServicer: Generate, Status, Pause and Resume over the worker core."""

from __future__ import annotations

import numpy as np

from zerobubble.common.codec import encode_array
from zerobubble.common.errors import InvalidInput
from zerobubble.common.status import translate_errors
from zerobubble.rollout.engine import SamplingSettings
from zerobubble.rollout.experience import FINISH_REASONS
from zerobubble.rollout.worker import RolloutWorker
from zerobubble.v1 import rollout_pb2, rollout_pb2_grpc

MAX_SAMPLES_PER_CALL = 4096


def to_sampling(params: rollout_pb2.SamplingParams, defaults) -> SamplingSettings:
    """Unset (zero) fields take the worker's generation defaults."""
    n = params.n or 1
    if n < 0 or params.max_new_tokens < 0:
        raise InvalidInput("must not be negative", "sampling.n" if n < 0 else "sampling.max_new_tokens")
    if params.temperature < 0:
        raise InvalidInput("must not be negative", "sampling.temperature")
    if not 0 <= params.top_p <= 1:
        raise InvalidInput("must be in [0, 1]", "sampling.top_p")
    return SamplingSettings(
        n=n, temperature=params.temperature, top_p=params.top_p or 1.0, top_k=params.top_k or -1,
        max_new_tokens=params.max_new_tokens or defaults.max_new_tokens, stop=tuple(params.stop),
    )


class RolloutServicer(rollout_pb2_grpc.RolloutServiceServicer):
    def __init__(self, worker: RolloutWorker, engine_name: str):
        self.worker = worker
        self.engine_name = engine_name

    @translate_errors
    def Generate(self, request, context):
        if not request.prompts:
            raise InvalidInput("at least one prompt is needed", "prompts")
        sampling = to_sampling(request.sampling, self.worker.config.generation)
        if sampling.n * len(request.prompts) > MAX_SAMPLES_PER_CALL:
            raise InvalidInput(f"n x prompts is over {MAX_SAMPLES_PER_CALL}", "sampling.n")
        tokenizer = self.worker.engine.tokenizer
        prompt_ids = []
        for i, prompt in enumerate(request.prompts):
            if request.raw:
                prompt_ids.append(tokenizer.encode(prompt, add_special_tokens=False))
                continue
            try:
                prompt_ids.append(self.worker.prompts.build(prompt))
            except (ValueError, TypeError, KeyError) as exc:
                raise InvalidInput(f"expected chat messages as JSON ({exc})", f"prompts[{i}]") from None
        samples, version = self.worker.generate(prompt_ids, sampling)
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
