"""The core of the Generate RPC: every size and count of a call is checked against the configured bounds
before anything of it is tokenized or generated, so no call makes the worker allocate more than its
configuration allows, and a bad call is refused naming the field, never failing inside the engine."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from jinja2.exceptions import TemplateError

from zerobubble.common.errors import InvalidInput, Overloaded, TooLarge, check_size
from zerobubble.rollout.config import RequestLimits
from zerobubble.rollout.engine import Sample, SamplingError, SamplingSettings
from zerobubble.rollout.prompting import NotMessages, PromptTooLong
from zerobubble.rollout.worker import RolloutWorker


class GenerateCalls:
    def __init__(self, worker: RolloutWorker, limits: RequestLimits):
        self.worker = worker
        self.limits = limits
        self._slots = threading.BoundedSemaphore(limits.max_calls)

    def generate(self, prompts: Sequence[str], *, raw: bool, n: int, temperature: float, top_p: float, top_k: int,
                 max_new_tokens: int, stop: Sequence[str]) -> tuple[list[list[Sample]], int]:
        """`n` samples of each prompt (chat messages as JSON, or plain text when `raw`) and the policy version
        that made them."""
        if not prompts:
            raise InvalidInput("at least one prompt is needed", "prompts")
        try:
            sampling = SamplingSettings(n=n, temperature=temperature, top_p=top_p, top_k=top_k,
                                        max_new_tokens=max_new_tokens, stop=tuple(stop))
        except SamplingError as exc:
            raise InvalidInput(str(exc), f"sampling.{exc.field}") from None
        self._check_sizes(prompts, sampling)
        if not self._slots.acquire(blocking=False):
            raise Overloaded(f"{self.limits.max_calls} Generate calls are in progress already "
                             "(requests.max_calls); retry later")
        try:
            prompt_ids = [self._tokens(i, prompt, raw) for i, prompt in enumerate(prompts)]
            return self.worker.generate(prompt_ids, sampling)
        finally:
            self._slots.release()

    def _check_sizes(self, prompts: Sequence[str], sampling: SamplingSettings) -> None:
        limits = self.limits
        if sampling.max_new_tokens > limits.max_new_tokens:
            raise TooLarge(f"{sampling.max_new_tokens} is over the limit of {limits.max_new_tokens} "
                           "(requests.max_new_tokens, by default run_spec.max_new_tokens)", "sampling.max_new_tokens")
        samples = f"the limit of {limits.max_samples} samples (requests.max_samples, by default the worker's batch)"
        if sampling.n > limits.max_samples:
            raise TooLarge(f"{sampling.n} is over {samples}", "sampling.n")
        if len(prompts) > limits.max_samples:
            raise TooLarge(f"{len(prompts)} prompts are over {samples}", "prompts")
        if sampling.n * len(prompts) > limits.max_samples:
            raise TooLarge(f"n x prompts = {sampling.n * len(prompts)} is over {samples}", "sampling.n")
        if len(sampling.stop) > limits.max_stop_strings:
            raise TooLarge(f"{len(sampling.stop)} stop strings are over the limit of {limits.max_stop_strings} "
                           "(requests.max_stop_strings)", "sampling.stop")
        for i, stop in enumerate(sampling.stop):
            check_size(stop, limits.max_stop_bytes, f"sampling.stop[{i}]", "requests.max_stop_bytes")
        for i, prompt in enumerate(prompts):
            check_size(prompt, limits.max_prompt_bytes, f"prompts[{i}]", "requests.max_prompt_bytes")

    def _tokens(self, index: int, prompt: str, raw: bool) -> list[int]:
        field = f"prompts[{index}]"
        builder = self.worker.prompts
        if not raw:
            try:
                return builder.build(prompt)
            except PromptTooLong as exc:
                raise TooLarge(str(exc), field) from None
            except (NotMessages, TemplateError) as exc:
                raise InvalidInput(f"expected chat messages as JSON: {exc}", field) from None
        ids = builder.tokenizer.encode(prompt, add_special_tokens=False)
        if not ids:
            raise InvalidInput("the text encodes to no tokens", field)
        if len(ids) > builder.max_prompt_tokens:
            raise TooLarge(f"{len(ids)} tokens are over run_spec.max_prompt_tokens={builder.max_prompt_tokens} "
                           "(a raw prompt is not cut)", field)
        return ids
