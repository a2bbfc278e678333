"""The Tinker API's plain core: sessions, training clients, weights saved for samplers, sampling sessions and the
futures their work answers through. app.py puts HTTP around it. Ids follow the client's own scheme
(`{session}:train:{n}`, `{session}:sample:{n}`, `tinker://{model_id}/sampler_weights/{name}`)."""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from zerobubble.tooling.tinker import schema
from zerobubble.tooling.tinker.config import TinkerServerConfig
from zerobubble.tooling.tinker.errors import Refused, invalid, unknown
from zerobubble.tooling.tinker.futures import Futures
from zerobubble.tooling.tinker.models import SavedState, TrainingModels
from zerobubble.tooling.tinker.sampler import Sampler, SamplerWeights
from zerobubble.tooling.tinker.wire import ForwardBackwardCall, encode_sample

CHECKPOINT_PREFIX = "tinker://"


@dataclass(frozen=True)
class SamplingSession:
    session_id: str
    base_model: str
    model_path: str | None
    weights: SamplerWeights


class TinkerService:
    def __init__(self, config: TinkerServerConfig, clock: Callable[[], float] = time.monotonic):
        self.config = config
        self._clock = clock
        self.models = TrainingModels(config.model_dir, max_models=config.max_models, max_rank=config.max_lora_rank,
                                     alpha=config.lora_alpha, max_tokens=config.max_tokens_per_request)
        self.sampler = Sampler(config.model_dir, seed=config.seed, max_new_tokens=config.max_new_tokens,
                               default_max_new_tokens=config.default_max_new_tokens,
                               max_batch_samples=config.max_samples_per_request)
        self.futures = Futures(config.max_pending_per_session, config.max_finished)
        self.sessions: dict[str, float] = {}   # session id -> when it was last heard from
        self.checkpoints: OrderedDict[str, SamplerWeights] = OrderedDict()
        self.states: OrderedDict[str, SavedState] = OrderedDict()
        self.sampling_sessions: OrderedDict[str, SamplingSession] = OrderedDict()

    def capabilities(self) -> dict:
        return {"supported_models": [{"model_name": self.config.model_name, "trainable": True, "sampleable": True,
                                      "max_context_length": self.models.context_length or None}]}

    def create_session(self) -> str:
        session_id = uuid.uuid4().hex
        self.sessions[session_id] = self._clock()
        return session_id

    def session(self, session_id: str) -> str:
        if session_id not in self.sessions:
            raise unknown("session_id", session_id)
        return session_id

    def heartbeat(self, session_id: str) -> None:
        if session_id not in self.sessions:
            # 410 is how the client learns its session is over (it stops its heartbeats).
            raise Refused(410, "session_id", f"{session_id[:100]!r} has ended or was never opened here")
        self.sessions[session_id] = self._clock()

    def expire(self) -> list[str]:
        """End the sessions not heard from for session_timeout_s: their training clients are unloaded (after the
        work they queued) and their samplers dropped. States and weights they saved stay (the newest are kept)."""
        cutoff = self._clock() - self.config.session_timeout_s
        ended = [session_id for session_id, seen in self.sessions.items() if seen < cutoff]
        for session_id in ended:
            del self.sessions[session_id]
            # Copied at once: the worker thread adds and removes clients meanwhile.
            for model_id in [m for m, model in list(self.models.models.items()) if model.session_id == session_id]:
                self.futures.submit(session_id, lambda model_id=model_id: self.models.unload(model_id), bounded=False)
            for sampling_id in [i for i, s in list(self.sampling_sessions.items()) if s.session_id == session_id]:
                self.sampling_sessions.pop(sampling_id, None)
        return ended

    def _base_model(self, name: str, field: str) -> str:
        if name != self.config.model_name:
            raise invalid(field, f"{name!r} is not served; this server serves {self.config.model_name!r}")
        return name

    def create_model(self, request: schema.CreateModel) -> str:
        session_id = self.session(request.session_id)
        self._base_model(request.base_model, "base_model")
        lora = self.models.check_create(request.lora_config)
        self._check_session_room(session_id)
        model_id = f"{session_id}:train:{request.model_seq_id}"
        if model_id in self.models.models:
            raise invalid("model_seq_id",
                          f"{request.model_seq_id} is already a training client of ServiceClient {session_id}")
        seed = request.lora_config.seed
        return self.futures.submit(session_id, lambda: self.models.create(model_id, session_id, lora, seed))

    def _check_session_room(self, session_id: str) -> None:
        held = sum(model.session_id == session_id for model in list(self.models.models.values()))
        if held >= self.config.max_models_per_session:
            raise Refused(403, "max_models_per_session", f"session {session_id!r} holds {held} training clients, "
                          "the most one session may")

    def info(self, model_id: str) -> dict:
        model = self.models.get(model_id)
        return {"type": "get_info", "model_id": model_id, "is_lora": True, "lora_rank": model.lora.rank,
                "model_name": self.config.model_name,
                "model_data": {"arch": type(self.models.base).__name__, "model_name": self.config.model_name,
                               "tokenizer_id": str(self.config.model_dir)}}

    def unload_model(self, model_id: str) -> str:
        model = self.models.get(model_id)
        return self.futures.submit(model.session_id, lambda: self.models.unload(model_id))

    def forward_backward(self, call: ForwardBackwardCall) -> str:
        model = self.models.get(call.model_id)
        surrogate = self.models.check_forward_backward(call)
        return self.futures.submit(model.session_id, lambda: self.models.forward_backward(call, surrogate))

    def optim_step(self, request: schema.OptimStep) -> str:
        model = self.models.get(request.model_id)
        return self.futures.submit(model.session_id, lambda: self.models.optim_step(request.model_id,
                                                                                      request.adam_params))

    def save_for_sampler(self, request: schema.SaveForSampler) -> str:
        model = self.models.get(request.model_id)
        if (request.path is None) == (request.sampling_session_seq_id is None):
            raise invalid("path", "give a path (a named checkpoint) or a sampling_session_seq_id, not both")

        def save() -> dict:
            adapter = self.models.adapter(request.model_id)
            if request.path is not None:
                path = f"{CHECKPOINT_PREFIX}{request.model_id}/sampler_weights/{request.path}"
                self.checkpoints.pop(path, None)
                self.checkpoints[path] = SamplerWeights(path, adapter)
                while len(self.checkpoints) > self.config.max_sampler_weights:
                    self.checkpoints.popitem(last=False)
                return {"path": path, "type": "save_weights_for_sampler"}
            sampling_id = f"{model.session_id}:sample:{request.sampling_session_seq_id}"
            key = f"{CHECKPOINT_PREFIX}{request.model_id}/sampler_weights/{sampling_id}"
            self._add_sampler(sampling_id, SamplingSession(model.session_id, self.config.model_name, None,
                                                           SamplerWeights(key, adapter)))
            return {"sampling_session_id": sampling_id, "type": "save_weights_for_sampler"}

        return self.futures.submit(model.session_id, save)

    def save_state(self, request: schema.SaveState) -> str:
        model = self.models.get(request.model_id)
        path = f"{CHECKPOINT_PREFIX}{request.model_id}/weights/{request.path}"

        def save() -> dict:
            self.states.pop(path, None)
            self.states[path] = self.models.save_state(request.model_id)
            while len(self.states) > self.config.max_saved_states:
                self.states.popitem(last=False)
            return {"path": path, "type": "save_weights"}

        return self.futures.submit(model.session_id, save)

    def load_state(self, request: schema.LoadState) -> str:
        """Into an existing client (model_id), or into a new one made from the checkpoint (session_id and
        model_seq_id: create_training_client_from_state)."""
        state = self.states.get(request.path)
        if state is None:
            raise unknown("path", request.path)
        if request.model_id is not None:
            model_id, session_id = request.model_id, self.models.get(request.model_id).session_id
            create = None
        elif request.session_id is not None and request.model_seq_id is not None:
            session_id = self.session(request.session_id)
            if request.base_model is not None:
                self._base_model(request.base_model, "base_model")
            model_id = f"{session_id}:train:{request.model_seq_id}"
            self.models.check_room()
            self._check_session_room(session_id)
            create = state.lora
        else:
            raise invalid("model_id", "give the model_id to load into, or a session_id and model_seq_id")

        def load() -> dict:
            if create is not None:
                self.models.create(model_id, session_id, create, seed=None)
            self.models.load_state(model_id, state, request.optimizer)
            return {"path": request.path, "model_id": model_id, "type": "load_weights"}

        return self.futures.submit(session_id, load)

    def create_sampling_session(self, request: schema.CreateSamplingSession) -> str:
        session_id = self.session(request.session_id)
        if request.model_path is not None:
            weights = self.checkpoints.get(request.model_path)
            if weights is None:
                raise unknown("model_path", request.model_path)
        elif request.base_model is not None:
            self._base_model(request.base_model, "base_model")
            weights = SamplerWeights("", None)
        else:
            raise invalid("model_path", "give a model_path or a base_model")
        sampling_id = f"{session_id}:sample:{request.sampling_session_seq_id}"
        self._add_sampler(sampling_id, SamplingSession(session_id, self.config.model_name, request.model_path,
                                                       weights))
        return sampling_id

    def _add_sampler(self, sampling_id: str, session: SamplingSession) -> None:
        """Each sampler holds its weights: an RL loop that makes one a step would otherwise grow without end. The
        oldest go first (a loop samples its newest)."""
        self.sampling_sessions.pop(sampling_id, None)
        self.sampling_sessions[sampling_id] = session
        while len(self.sampling_sessions) > self.config.max_samplers:
            self.sampling_sessions.popitem(last=False)

    def sampling_session(self, sampling_id: str) -> SamplingSession:
        session = self.sampling_sessions.get(sampling_id)
        if session is None:
            raise unknown("sampling_session_id", sampling_id)
        return session

    def sample(self, request: schema.Sample) -> tuple[str, list[str]]:
        if request.sampling_session_id is None:
            raise invalid("sampling_session_id", "sampling needs a sampling session (create_sampling_session)")
        session = self.sampling_session(request.sampling_session_id)
        if request.prompt_logprobs:
            raise invalid("prompt_logprobs", "prompt log-probs are not served; compute them with forward")
        if request.num_samples > self.config.max_samples_per_request:
            raise invalid("num_samples", f"{request.num_samples} is over max_samples_per_request="
                          f"{self.config.max_samples_per_request}")
        prompt = [token for chunk in request.prompt.chunks for token in chunk.tokens]
        vocabulary = self.models.vocabulary
        if not prompt:
            raise invalid("prompt", "no tokens")
        if min(prompt) < 0 or max(prompt) >= vocabulary:
            raise invalid("prompt", f"a token id outside the vocabulary [0, {vocabulary})")
        settings = self.sampler.settings(request.sampling_params, request.num_samples)
        context = self.models.context_length
        if context and len(prompt) + settings.max_new_tokens > context:
            raise invalid("prompt", f"{len(prompt)} tokens and max_tokens {settings.max_new_tokens} are over the "
                          f"model's context of {context}")
        queued = self.sampler.queue(session.weights, prompt, settings)
        try:
            request_id = self.futures.submit(session.session_id,
                                             lambda: encode_sample(self.sampler.take(queued), None))
        except Refused:
            self.sampler.forget(queued)
            raise
        return request_id, [f"{request_id}:{i}" for i in range(request.num_samples)]

    def close(self) -> None:
        self.futures.close()
