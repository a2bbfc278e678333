"""The sampling clients: the rollout service's generation engine (rollout/engine_factory.py) over the base model,
with a sampler's saved adapter merged in before its requests (the engine keeps the base apart, so each adapter
replaces the one before). Log-probs are the engine's: of each token under the distribution it was drawn from.

Requests waiting for the worker that share weights and settings are sampled in one generate call: an RL loop asks
one sample per request (tinker-cookbook's rollouts do, one per episode), and one batch of a group's prompts costs
about what one prompt does on a small model. A request with a seed of its own is sampled alone, so that its
draws depend on nothing else queued."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from zerobubble.common.lora_adapter import LORA_B
from zerobubble.rollout.engine import SamplingError, SamplingSettings
from zerobubble.rollout.engine_factory import make_engine
from zerobubble.tooling.tinker.errors import invalid
from zerobubble.tooling.tinker.schema import SamplingParams
from zerobubble.tooling.tinker.wire import Sequence

Weights = list[tuple[str, torch.Tensor]]


@dataclass(frozen=True)
class SamplerWeights:
    key: str                              # the checkpoint's tinker:// path; "" for the base model
    adapter: Weights | None               # None: the base model


@dataclass(eq=False)
class _Request:
    weights: SamplerWeights
    prompt: list[int]
    settings: SamplingSettings
    result: list[Sequence] | None = None

    def joins(self, other: _Request) -> bool:
        return (self.settings.seed is None and other.weights.key == self.weights.key
                and other.settings == self.settings)


class Sampler:
    def __init__(self, model_dir: Path, *, seed: int, max_new_tokens: int, default_max_new_tokens: int,
                 max_batch_samples: int):
        self.engine = make_engine("transformers", model_dir, device="cpu", dtype="float32", seed=seed)
        self.tokenizer = self.engine.tokenizer
        self._waiting: list[_Request] = []
        self._waiting_lock = threading.Lock()   # requests are queued by the event loop, taken by the worker
        self._max_batch_samples = max_batch_samples
        self._loaded = ""
        self._last_adapter: Weights | None = None
        self._version = 0
        self._max_new_tokens, self._default_max_new_tokens = max_new_tokens, default_max_new_tokens

    def settings(self, params: SamplingParams, count: int) -> SamplingSettings:
        """The engine's settings for a request; 422 naming the sampling_params field."""
        max_tokens = params.max_tokens or self._default_max_new_tokens
        if max_tokens > self._max_new_tokens:
            raise invalid("sampling_params.max_tokens", f"{max_tokens} is over max_new_tokens={self._max_new_tokens}")
        try:
            return SamplingSettings(n=count, temperature=params.temperature, max_new_tokens=max_tokens,
                                    top_p=params.top_p, top_k=params.top_k, stop=self._stop(params.stop),
                                    seed=params.seed)
        except SamplingError as exc:
            raise invalid(f"sampling_params.{exc.field}", str(exc)) from None

    def _stop(self, stop: str | list[str] | list[int] | None) -> tuple[str, ...]:
        if stop is None or stop == []:
            return ()  # [] would also drop the EOS stop, which the engine always keeps
        if isinstance(stop, str):
            return (stop,)
        if all(isinstance(item, str) for item in stop):
            return tuple(stop)
        # Token ids: EOS already stops; any other becomes its text.
        eos = set(self.tokenizer.all_special_ids) & {self.tokenizer.eos_token_id}
        texts = []
        for token in stop:
            if token in eos:
                continue
            if token in self.tokenizer.all_special_ids or not 0 <= token < len(self.tokenizer):
                raise invalid("sampling_params.stop", f"token {token} is no stop this server can watch for "
                              "(only EOS and tokens that have text)")
            texts.append(self.tokenizer.decode([token]))
        return tuple(texts)

    def queue(self, weights: SamplerWeights, prompt: list[int], settings: SamplingSettings) -> _Request:
        """A request waiting for the worker; `take` samples it, `forget` withdraws it."""
        request = _Request(weights, prompt, settings)
        with self._waiting_lock:
            self._waiting.append(request)
        return request

    def forget(self, request: _Request) -> None:
        with self._waiting_lock:
            self._waiting = [other for other in self._waiting if other is not request]

    def take(self, request: _Request) -> list[Sequence]:
        """The request's sequences (on the worker thread): sampled with every waiting request it can join, unless
        an earlier request's batch already took it."""
        if request.result is not None:
            return request.result
        with self._waiting_lock:
            batch, samples = [request], request.settings.n
            for other in self._waiting:
                fits = samples + other.settings.n <= self._max_batch_samples
                if other is not request and request.joins(other) and fits:
                    batch.append(other)
                    samples += other.settings.n
            self._waiting = [other for other in self._waiting if all(other is not taken for taken in batch)]
        self._load(request.weights)
        # If this fails, the others of the batch have no result and their own work samples them again.
        outputs = self.engine.generate([member.prompt for member in batch], request.settings)
        for member, samples in zip(batch, outputs, strict=True):
            member.result = [Sequence(tokens=s.token_ids, logprobs=s.logprobs, stopped=s.finish_reason == "stop")
                             for s in samples]
        return request.result

    def _load(self, weights: SamplerWeights) -> None:
        if weights.key == self._loaded:
            return
        adapter = weights.adapter
        if adapter is None:
            if self._last_adapter is None:
                return  # no adapter was ever merged: the engine holds the base
            # The base again: the last adapter with B = 0 puts each layer it changed back to its kept base.
            adapter = [(name, torch.zeros_like(t) if name.endswith(LORA_B) else t) for name, t in self._last_adapter]
        else:
            self._last_adapter = adapter
        self._version += 1
        self.engine.load_weights(adapter, version=self._version)
        self._loaded = weights.key
