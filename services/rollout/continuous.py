"""Continuous batching for the transformers engine: requests join the running batch between decode steps and leave
it as each finishes, and a request's KV cache can be kept under a key (an episode) for that key's next request.

One thread runs the loop. Each iteration (1) lets the run hand over new weights (`engine.between_steps`), (2) runs
one decode step of every running request and the prefill of every request admitted now, under the engine's step
lock so that no step sees two versions, (3) draws each request's token from its own distribution with its own
generator, and (4) hands back the requests that finished. The batch's KV cache holds the requests right-aligned
(left padding), as the engine's static batches do: a request joining is written into rows of its own at the batch's
width, a request leaving has the batch's last row moved into its place, and columns no request uses any more are
dropped (kv_cache.BatchLayer: only the rows that change are copied).

Samples keep engine.py's conventions: the log-probs, the supports and the per-token versions of what was drawn.
A request's tokens depend on its seed and on its own logits only; those logits can differ from a lone run's in the
last bits with the batch around it, as any batched engine's do.
"""

from __future__ import annotations

import random
import threading
import time
from collections import deque
from collections.abc import Hashable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers.cache_utils import DynamicCache

from zerobubble.common.trajectory import FINISH_LENGTH, FINISH_STOP
from zerobubble.rollout.engine import Sample, SamplingSettings
from zerobubble.rollout.engine_transformers import StopStringWatch, processed_logprobs
from zerobubble.rollout.kv_cache import KV, BatchLayer, Kept, KeptCaches, common_prefix, left_pad


class BatcherClosed(RuntimeError):
    """The engine closed before the request finished."""


@dataclass
class _Request:
    context: list[int]
    sampling: SamplingSettings
    key: Hashable | None
    generator: torch.Generator
    watch: StopStringWatch | None
    future: Future
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    support: list[int] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    kv_length: int = 0            # positions in the cache: the context and every drawn token but the last
    finish: str | None = None

    def covered(self) -> list[int]:
        """The ids whose keys and values the cache holds."""
        return (self.context + self.tokens)[:self.kv_length]


@dataclass
class BatcherStats:
    """What the loop did, for `zerobubble bench episodes` and the rollout metrics."""

    busy_seconds: float = 0.0     # in forwards and draws
    decode_steps: int = 0
    decoded_rows: int = 0         # over all decode steps: their mean width is this over decode_steps
    prefills: int = 0
    prefilled_tokens: int = 0
    reused_tokens: int = 0        # context tokens a kept cache spared the prefill of
    peak_running: int = 0


class ContinuousBatcher:
    def __init__(self, engine, *, seed: int = 0, max_batch: int | None = None, max_kept_tokens: int = 1 << 16):
        """`max_batch`: requests running at once (None: the engine's max_batch_size, else 256); `max_kept_tokens`:
        what the kept caches may hold together."""
        self._engine = engine
        self._device = engine.device
        self._eos = {int(t) for t in engine._eos_ids.tolist()}
        self._vocabulary = engine.model.get_input_embeddings().num_embeddings
        self.max_batch = max_batch or engine.max_batch_size or 256
        self.kept = KeptCaches(max_kept_tokens)
        self.stats = BatcherStats()
        self._seeds = random.Random(seed)
        self._waiting: deque[_Request] = deque()
        self._running: list[_Request] = []
        self._cache: DynamicCache | None = None
        self._mask: torch.Tensor | None = None      # [running, width]: 1 where a row has a position
        self._version = engine.policy_version
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="continuous-batcher", daemon=True)
        self._thread.start()

    def submit(self, context: Sequence[int], sampling: SamplingSettings, *, key: Hashable | None = None
               ) -> Future[Sample]:
        """One response to `context`; with `key`, the cache a finished request of that key left is reused for the
        prefix they share, and this request's is kept in turn."""
        if sampling.n != 1:
            raise ValueError(f"a request is one response (n=1), got n={sampling.n}")
        if not context:
            raise ValueError("a request needs at least one context token")
        # Refused here, not in the forward: a bad id there would fail every request in the batch with it.
        if min(context) < 0 or max(context) >= self._vocabulary:
            raise ValueError(f"context holds token ids outside the model's vocabulary of {self._vocabulary}")
        tokenizer = self._engine.tokenizer
        with self._cond:
            if self._closed:
                raise BatcherClosed("the engine is closed")
            seed = sampling.seed if sampling.seed is not None else self._seeds.getrandbits(62)
            request = _Request(list(context), sampling, key,
                               torch.Generator(device=self._device).manual_seed(seed),
                               StopStringWatch(tokenizer, sampling.stop) if sampling.stop else None, Future())
            self._waiting.append(request)
            self._cond.notify()
        return request.future

    @property
    def running(self) -> int:
        """Requests in the running batch."""
        return len(self._running)

    def forget(self, key: Hashable) -> None:
        """The key will ask no more (its episode ended): free its kept cache."""
        with self._cond:
            self.kept.take(key)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._waiting and not self._running:
                    self._cond.wait()
                if self._closed:
                    break
                room = max(0, self.max_batch - len(self._running))
                admitted = [self._waiting.popleft() for _ in range(min(room, len(self._waiting)))]
            try:
                self._iterate(admitted)
            except Exception as exc:   # a failed forward (out of memory, say) fails its batch, never the loop
                for request in [*self._running, *admitted]:
                    if not request.future.done():
                        request.future.set_exception(exc)
                self._running, self._cache, self._mask = [], None, None
        with self._cond:
            left = [*self._running, *self._waiting]
            self._running, self._waiting = [], deque()
            self.kept.clear()
        for request in left:
            if not request.future.done():
                request.future.set_exception(BatcherClosed("the engine closed before the request finished"))

    @torch.inference_mode()
    def _iterate(self, admitted: list[_Request]) -> None:
        engine = self._engine
        if engine.between_steps is not None:
            engine.between_steps()
        started = time.perf_counter()
        with engine._step_lock:
            version = engine.policy_version
            if version != self._version:
                self._on_new_weights()
                self._version = version
            logits = [self._decode()] if self._running else []
            if admitted:
                joining, last = self._prefill(admitted)
                logits.append(last)
            self._draw([*self._running, *admitted], torch.cat(logits), version)
        if admitted:
            self._join(admitted, *joining)
        self.stats.busy_seconds += time.perf_counter() - started
        self.stats.peak_running = max(self.stats.peak_running, len(self._running))
        finished = [i for i, request in enumerate(self._running) if request.finish]
        if finished:
            self._leave(finished)

    def _decode(self) -> torch.Tensor:
        """One step of every running request: its last drawn token in, the next token's logits out."""
        mask = torch.cat([self._mask, self._mask.new_ones((len(self._running), 1))], dim=1)
        ids = torch.tensor([[r.tokens[-1]] for r in self._running], device=self._device)
        positions = torch.tensor([[r.kv_length] for r in self._running], device=self._device)
        out = self._engine.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                                 past_key_values=self._cache, use_cache=True)
        self._mask = mask
        for request in self._running:
            request.kv_length += 1
        self.stats.decode_steps += 1
        self.stats.decoded_rows += len(self._running)
        return out.logits[:, -1, :]

    def _prefill(self, requests: list[_Request]) -> tuple[tuple[KV, torch.Tensor], torch.Tensor]:
        """The requests' contexts through the model in one batch, each without the prefix its key's kept cache
        already holds: the kept prefixes left-padded to the longest, then the rest left-padded likewise (the
        mask marks the holes). Their cache and mask, and the next token's logits of each."""
        with self._cond:
            kept = [self.kept.take(r.key) if r.key is not None else None for r in requests]
        starts = [min(common_prefix(k.ids, r.context), len(r.context) - 1) if k else 0
                  for k, r in zip(kept, requests, strict=True)]
        rests = [r.context[start:] for r, start in zip(requests, starts, strict=True)]
        head, tail = max(starts), max(len(rest) for rest in rests)
        device = self._device
        mask = torch.zeros((len(requests), head + tail), dtype=torch.long, device=device)
        ids = torch.full((len(requests), tail), self._engine._pad_id, dtype=torch.long, device=device)
        positions = torch.zeros((len(requests), tail), dtype=torch.long, device=device)
        for i, (start, rest) in enumerate(zip(starts, rests, strict=True)):
            mask[i, head - start:head] = 1
            mask[i, head + tail - len(rest):] = 1
            ids[i, tail - len(rest):] = torch.tensor(rest)
            positions[i, tail - len(rest):] = torch.arange(start, start + len(rest))
        cache = DynamicCache()
        if head:
            some = next(k for k in kept if k is not None).kv
            batch, heads, _, width = some[0][0].shape
            empty = torch.zeros((batch, heads, 0, width), dtype=self._engine.dtype, device=device)
            cache = DynamicCache(ddp_cache_data=[tuple(
                torch.cat([left_pad(k.kv[layer][part][:, :, :start] if start else empty, head)
                           for k, start in zip(kept, starts, strict=True)])
                for part in (0, 1)) for layer in range(len(some))])
        out = self._engine.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                                 past_key_values=cache, use_cache=True, logits_to_keep=1)
        for request in requests:
            request.kv_length = len(request.context)
        self.stats.reused_tokens += sum(starts)
        self.stats.prefills += 1
        self.stats.prefilled_tokens += sum(len(rest) for rest in rests)
        return ([(layer.keys, layer.values) for layer in cache.layers], mask), out.logits[:, -1, :]

    def _draw(self, rows: list[_Request], logits: torch.Tensor, version: int) -> None:
        """Each row's next token from its own distribution (engine.py's conventions), and whether it ends there.
        A sampled token is the inverse CDF of one uniform draw from the row's own generator."""
        by_settings: dict[tuple, list[int]] = {}
        for i, request in enumerate(rows):
            s = request.sampling
            by_settings.setdefault((s.temperature, s.top_k, s.top_p), []).append(i)
        for indices in by_settings.values():
            sampling = rows[indices[0]].sampling
            logp = processed_logprobs(logits[indices], sampling)
            if sampling.greedy:
                tokens = logp.argmax(dim=-1)
            else:
                uniform = torch.cat([torch.rand(1, generator=rows[i].generator, device=self._device)
                                     for i in indices])
                cdf = logp.exp().cumsum(dim=-1)
                tokens = torch.searchsorted(cdf, (uniform * cdf[:, -1])[:, None], right=True).squeeze(-1)
                tokens = tokens.clamp(max=logp.shape[-1] - 1)
                # Rounding can carry a draw at the top of the CDF onto a token the distribution excludes.
                excluded = torch.isinf(logp.gather(-1, tokens[:, None])).squeeze(-1)
                tokens = torch.where(excluded, logp.argmax(dim=-1), tokens)
            chosen = logp.gather(-1, tokens[:, None]).squeeze(-1).tolist()
            kept = torch.isfinite(logp).sum(dim=-1).tolist() if sampling.truncates else [0] * len(indices)
            for row, token, logprob, support in zip(indices, tokens.tolist(), chosen, kept, strict=True):
                request = rows[row]
                request.tokens.append(token)
                request.logprobs.append(logprob)
                request.support.append(support)
                request.versions.append(version)
                if token in self._eos or (request.watch is not None and request.watch.hit(request.tokens)):
                    request.finish = FINISH_STOP
                elif len(request.tokens) >= request.sampling.max_new_tokens:
                    request.finish = FINISH_LENGTH

    def _join(self, admitted: list[_Request], kv: KV, mask: torch.Tensor) -> None:
        """The admitted requests' cache into the batch's, right-aligned at the wider of the two."""
        if self._cache is None:
            self._cache, self._mask = DynamicCache(), mask
            self._cache.layers = [BatchLayer(keys, values) for keys, values in kv]
        else:
            width = max(mask.shape[1], self._mask.shape[1])
            for layer, (keys, values) in zip(self._cache.layers, kv, strict=True):
                layer.add_rows(keys, values)
            self._mask = torch.cat([F.pad(self._mask, (width - self._mask.shape[1], 0)),
                                    F.pad(mask, (width - mask.shape[1], 0))])
        self._running.extend(admitted)

    def _leave(self, finished: list[int]) -> None:
        """Hand back the finished requests (keeping the caches of those with a key) and cut them out of the batch."""
        done = [self._running[i] for i in finished]
        with self._cond:
            for i, request in zip(finished, done, strict=True):
                if request.key is not None:
                    # The row's positions where the mask has them: the columns before it and any holes left out.
                    where = self._mask[i].nonzero().squeeze(-1)
                    kv = [(layer.keys[i:i + 1, :, where], layer.values[i:i + 1, :, where])
                          for layer in self._cache.layers]
                    self.kept.put(request.key, Kept(request.covered(), kv))
        # Each finished row, from the last, takes the batch's last row: one row copied per request that left.
        order = list(range(len(self._running)))
        for i in sorted(finished, reverse=True):
            order[i] = order[-1]
            order.pop()
        self._running = [self._running[i] for i in order]
        if not order:
            self._cache, self._mask = None, None
        else:
            mask = self._mask[torch.tensor(order, device=self._device)]
            unused = int(mask.any(dim=0).long().argmax())   # columns before every remaining row's first position
            moves = [(target, source) for target, source in enumerate(order) if target != source]
            for layer in self._cache.layers:
                layer.keep_rows(moves, len(order), unused)
            self._mask = mask[:, unused:]
        for request in done:
            request.future.set_result(self._sample(request))

    def _sample(self, request: _Request) -> Sample:
        text = self._engine.tokenizer.decode(request.tokens, skip_special_tokens=True)
        if request.watch is not None and request.finish == FINISH_STOP:
            text = request.watch.cut(text)
        return Sample(token_ids=request.tokens, logprobs=request.logprobs, finish_reason=request.finish, text=text,
                      versions=request.versions, support=request.support if request.sampling.truncates else None)

    def _on_new_weights(self) -> None:
        """New weights: with prefix_on_new_weights "recompute", every cache is computed again with them (the
        running requests' at once, the kept ones dropped); with "keep", the old weights' keys and values stay."""
        if self._engine.prefix_on_new_weights != "recompute":
            return
        with self._cond:
            self.kept.clear()
        running, self._running, self._cache, self._mask = self._running, [], None, None
        if running:
            again = [_Request(r.covered(), r.sampling, None, r.generator, None, Future()) for r in running]
            (kv, mask), _ = self._prefill(again)
            self._join(running, kv, mask)

