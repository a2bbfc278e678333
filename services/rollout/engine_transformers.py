"""Generation with plain transformers: a batched sampling loop over the model's KV cache.

Runs anywhere torch runs (the CPU demo, tests, a GPU without vLLM). The loop is written out rather than
delegated to `model.generate` so that the log-probs it returns are, by construction, those of the
exact distribution each token was drawn from (see the conventions in engine.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from zerobubble.common.lora_adapter import AdapterMerger, is_adapter, is_peft_adapter, read_peft_adapter
from zerobubble.rollout.attention import use_grouped_sdpa
from zerobubble.rollout.engine import (
    FINISH_LENGTH,
    FINISH_STOP,
    Sample,
    SamplingSettings,
    WeightLoadError,
    WeightSpec,
    resolve_dtype,
)


def processed_logprobs(logits: torch.Tensor, sampling: SamplingSettings) -> torch.Tensor:
    """Log-probabilities of the distribution sampled from: temperature, then top-k, then top-p (float32)."""
    logits = logits.float()
    if sampling.greedy:
        return torch.log_softmax(logits, dim=-1)
    logits = logits / sampling.temperature
    if sampling.top_k_enabled and sampling.top_k < logits.shape[-1]:
        kth = torch.topk(logits, sampling.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p < 1.0:
        ascending, order = torch.sort(logits, dim=-1)
        cumulative = torch.softmax(ascending, dim=-1).cumsum(dim=-1)
        drop = cumulative <= 1.0 - sampling.top_p
        drop[..., -1] = False   # the most likely token always survives
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return torch.log_softmax(logits, dim=-1)


class StopStringWatch:
    """Finds, step by step, the rows whose response now contains a stop string.

    Only the tail of each response is decoded: an occurrence is seen at the step that completes it, and
    a window of four tokens per character (a UTF-8 character is at most four byte tokens) plus slack covers it.
    """

    def __init__(self, tokenizer, stop: tuple[str, ...]):
        self._tokenizer = tokenizer
        self._stop = stop
        self._window = 4 * max((len(s) for s in stop), default=0) + 8

    def hits(self, steps: list[np.ndarray], rows: Iterable[int]) -> list[int]:
        """`steps`: the token of every row at each step so far."""
        tail = np.stack(steps[-self._window:], axis=1)
        return [row for row in rows if self.hit(tail[row].tolist())]

    def hit(self, tokens: Sequence[int]) -> bool:
        """Whether one response, its tokens so far, now contains a stop string."""
        text = self._tokenizer.decode(list(tokens[-self._window:]), skip_special_tokens=True)
        return any(s in text for s in self._stop)

    def cut(self, text: str) -> str:
        """The text up to the end of the earliest-ending stop string."""
        ends = [text.find(s) + len(s) for s in self._stop if s in text]
        return text[:min(ends)] if ends else text


class TransformersEngine:
    name = "transformers"

    def __init__(self, model_dir: str | Path, *, device: str = "cpu", dtype: str | torch.dtype = "auto",
                 seed: int = 0, max_batch_size: int | None = None, prefix_on_new_weights: str = "keep"):
        """`model_dir` is an HF model folder, or a peft adapter folder (a LoRA checkpoint): its base with the
        adapter merged."""
        self.device = torch.device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        self.policy_version = 0
        self.max_batch_size = max_batch_size
        # Held by each decode step and by every weight load (services/rollout/in_flight.py says who loads when).
        self._step_lock = threading.RLock()
        # Called by the generating thread at every decode-step boundary (in flight: the weight receiver's
        # apply_to); None: weights change only between generate calls.
        self.between_steps: Callable[[], object] | None = None
        # After new weights mid-sequence: "keep" the prefix's KV cache (the old weights' keys and values) or
        # "recompute" it with the new ones (one prefill of the sequence so far).
        self.prefix_on_new_weights: str = prefix_on_new_weights
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        adapter = read_peft_adapter(model_dir) if is_peft_adapter(model_dir) else None
        base_dir = adapter[0] if adapter else model_dir
        self.model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=self.dtype).to(self.device).eval()
        use_grouped_sdpa(self.model)
        self._generator = torch.Generator(device=self.device).manual_seed(seed)
        self._seed = seed
        self._batcher = None
        self._batcher_lock = threading.Lock()
        self._eos_ids = torch.tensor(sorted(self._eos_token_ids()), dtype=torch.long, device=self.device)
        pad = self.tokenizer.pad_token_id
        self._pad_id = pad if pad is not None else int(self._eos_ids[0])
        self._params = self.model.state_dict(keep_vars=True)
        self._spec = self._weight_spec()
        # The base of each layer a LoRA adapter changed: the weights before the first adapter (or the last full load).
        self._adapters = AdapterMerger(self._current_weight)
        if adapter:
            self.load_weights(adapter[1], version=0)

    def _current_weight(self, name: str) -> torch.Tensor:
        if name not in self._spec.shapes:
            raise WeightLoadError(f"an adapter targets {name!r}, which is not a weight of this model")
        return self._params[name]

    def _eos_token_ids(self) -> set[int]:
        ids = {self.tokenizer.eos_token_id} if self.tokenizer.eos_token_id is not None else set()
        configured = getattr(self.model.generation_config, "eos_token_id", None)
        if configured is not None:
            ids |= set(configured) if isinstance(configured, list) else {configured}
        if not ids:
            raise ValueError("the model has no EOS token (neither the tokenizer nor generation_config names one)")
        return ids

    def _weight_spec(self) -> WeightSpec:
        shapes, aliases, seen = {}, {}, {}
        for name, tensor in self._params.items():
            # Tied weights are one tensor under two names: either name loads into that one tensor.
            first = seen.setdefault(tensor.data_ptr(), name)
            if first == name:
                shapes[name] = tuple(tensor.shape)
            else:
                aliases[name] = first
        return WeightSpec(shapes=shapes, aliases=aliases)

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingSettings) -> list[list[Sample]]:
        rows = [list(prompt) for prompt in prompts for _ in range(sampling.n)]
        if any(not row for row in rows):
            raise ValueError("every prompt needs at least one token")
        generator = self._generator
        if sampling.seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(sampling.seed)
        chunk = self.max_batch_size or len(rows)
        samples: list[Sample] = []
        for start in range(0, len(rows), chunk):
            samples.extend(self._generate_rows(rows[start:start + chunk], sampling, generator))
        return [samples[i * sampling.n:(i + 1) * sampling.n] for i in range(len(prompts))]

    @torch.inference_mode()
    def _generate_rows(self, rows: list[list[int]], sampling: SamplingSettings,
                       generator: torch.Generator) -> list[Sample]:
        batch, width, steps = len(rows), max(len(row) for row in rows), sampling.max_new_tokens
        prompt_ids = torch.full((batch, width), self._pad_id, dtype=torch.long)
        mask = torch.zeros((batch, width), dtype=torch.long)
        for i, row in enumerate(rows):
            prompt_ids[i, width - len(row):] = torch.tensor(row)
            mask[i, width - len(row):] = 1
        prompt_ids, mask = prompt_ids.to(self.device), mask.to(self.device)

        # One column per step, so memory follows the tokens produced, never max_new_tokens.
        token_steps: list[np.ndarray] = []
        logprob_steps: list[np.ndarray] = []
        # Tokens kept at each step, for the trainer's replay of the same support (engine.py's conventions).
        support_steps: list[np.ndarray] | None = [] if sampling.truncates else None
        version_steps: list[int] = []
        generated: list[torch.Tensor] = []
        lengths = np.zeros(batch, dtype=np.int64)
        stopped = np.zeros(batch, dtype=bool)
        watch = StopStringWatch(self.tokenizer, sampling.stop) if sampling.stop else None
        out, cache_version, next_position = None, None, None
        for step in range(steps):
            if step and self.between_steps is not None:
                self.between_steps()
            # A decode step (its forward and the draw from its logits) runs whole under the lock that loads take:
            # new weights land between steps, never inside one.
            with self._step_lock:
                version = self.policy_version
                if out is None or (version != cache_version and self.prefix_on_new_weights == "recompute"):
                    ids = torch.cat([prompt_ids, *(t[:, None] for t in generated)], dim=1)
                    positions = (mask.cumsum(-1) - 1).clamp(min=0)
                    out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                                     logits_to_keep=1)
                    next_position = positions[:, -1:] + 1
                else:
                    out = self.model(input_ids=generated[-1][:, None], attention_mask=mask,
                                     position_ids=next_position, past_key_values=out.past_key_values,
                                     use_cache=True)
                    next_position = next_position + 1
                cache_version = version
                logp = processed_logprobs(out.logits[:, -1, :], sampling)
                if sampling.greedy:
                    token = logp.argmax(dim=-1)
                else:
                    token = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)
            chosen = logp.gather(-1, token[:, None]).squeeze(-1)
            is_eos = torch.isin(token, self._eos_ids)
            generated.append(token)
            token_steps.append(token.cpu().numpy().astype(np.int32))
            logprob_steps.append(chosen.cpu().numpy())
            if support_steps is not None:
                support_steps.append(torch.isfinite(logp).sum(dim=-1).cpu().numpy().astype(np.int32))
            version_steps.append(version)
            ends = ~stopped & is_eos.cpu().numpy()
            if watch is not None:
                live = np.flatnonzero(~stopped & ~ends)
                ends[watch.hits(token_steps, live)] = True
            lengths[ends] = step + 1
            stopped |= ends
            if stopped.all() or step == steps - 1:
                break
            mask = torch.cat([mask, mask.new_ones((batch, 1))], dim=1)
        tokens, logprobs = np.stack(token_steps, axis=1), np.stack(logprob_steps, axis=1)
        versions = np.asarray(version_steps, dtype=np.int64)
        support = None if support_steps is None else np.stack(support_steps, axis=1)
        lengths[~stopped] = len(token_steps)

        samples = []
        for i in range(batch):
            ids = tokens[i, :lengths[i]]
            text = self.tokenizer.decode(ids.tolist(), skip_special_tokens=True)
            if watch is not None and stopped[i]:
                text = watch.cut(text)
            samples.append(Sample(token_ids=ids, logprobs=logprobs[i, :lengths[i]],
                                  finish_reason=FINISH_STOP if stopped[i] else FINISH_LENGTH, text=text,
                                  versions=versions[:lengths[i]],
                                  support=None if support is None else support[i, :lengths[i]]))
        return samples

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Copy into the existing parameters (no new allocation); a refused load changes nothing. A LoRA adapter
        (see zerobubble.common.lora_adapter) is merged into the base weights of the layers it changes."""
        weights = list(weights)
        adapter = is_adapter(name for name, _ in weights)
        if adapter:
            try:
                weights = self._adapters.merged(weights)
            except ValueError as exc:
                raise WeightLoadError(str(exc)) from None
        checked = self._spec.check_all(weights)
        with self._step_lock:
            for _, target, tensor in checked:
                self._params[target].data.copy_(tensor)
            if not adapter:
                self._adapters.forget()
            self.policy_version = version

    def continuous(self):
        """The engine's continuous batcher (rollout/continuous.py), started on first use: requests that join
        and leave between decode steps, beside `generate`'s static batches."""
        from zerobubble.rollout.continuous import ContinuousBatcher

        with self._batcher_lock:
            if self._batcher is None:
                self._batcher = ContinuousBatcher(self, seed=self._seed)
            return self._batcher

    @property
    def started_batcher(self):
        """The continuous batcher once something has used it, else None (for metrics, which must not start it)."""
        return self._batcher

    def close(self) -> None:
        with self._batcher_lock:
            if self._batcher is not None:
                self._batcher.close()
        self.model = None
        self._params = {}
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
