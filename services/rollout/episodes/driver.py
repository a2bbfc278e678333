"""Plays a batch of episodes turn by turn, token-in/token-out.

With an engine that batches continuously (the transformers engine's `continuous()`), each episode runs a loop of
its own: it asks for its next turn as soon as its own step returned, the engine takes the request between two
decode steps of the others and keeps the episode's KV cache between its turns, so a slow environment delays only
its own episode. With any other engine the episodes go in lockstep: every live episode's next turn in one engine
call (the first turn of a group's episodes as one prompt with n samples, as single-turn rows are), then every live
episode steps its environment at once.

A response is the model's turns and the observations between them, as tokens: the model's exactly as sampled
(loss mask 1, their behaviour log-probs), the observations as the chat template renders them (loss mask 0).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field

import numpy as np

from zerobubble.common.episodes import EpisodeRoute, EpisodeSpec
from zerobubble.common.trajectory import FINISH_LENGTH, FINISH_STOP, EpisodeRecord, Trajectory, carried_versions
from zerobubble.rollout.engine import Engine, Sample, SamplingSettings
from zerobubble.rollout.episodes.record import DONE, MAX_TOKENS, MAX_TURNS, TRUNCATING
from zerobubble.rollout.episodes.render import TurnRenderer, observation_messages
from zerobubble.rollout.episodes.sessions import EnvironmentSessions, Opening, StepOutcome
from zerobubble.rollout.prompting import PromptBuilder
from zerobubble.v1 import common_pb2

log = logging.getLogger(__name__)
LOOPS_AT_ONCE = 4096


@dataclass
class EpisodeTimings:
    """Where a driver's time went, for `zerobubble bench episodes`: generating, and waiting on environments
    (the engine idles then), with each environment call's latency."""

    engine_seconds: float = 0.0
    environment_seconds: float = 0.0
    step_seconds: deque[float] = field(default_factory=lambda: deque(maxlen=100_000))   # the latest ones


@dataclass
class EpisodePrompt:
    """One leased row to play as `n` episodes."""

    prompt: common_pb2.Prompt
    route: EpisodeRoute
    builder: PromptBuilder


@dataclass
class _Live:
    """One episode being played."""

    session: Opening
    record: EpisodeRecord
    prefix: list[int]                       # the prompt's ids
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)      # the policy version that drew each sampled token
    support: list[int] = field(default_factory=list)       # tokens kept when each was drawn (0: the whole vocab)
    last_text: str = ""
    last_finish: str = FINISH_STOP

    @property
    def ended(self) -> bool:
        return bool(self.record.ended_reason)

    def add(self, ids, logprobs, versions, *, sampled: bool, support=None) -> None:
        """`versions`: of each sampled token (an observation's are filled in by the trajectory's rule).
        `support`: what the engine kept of each sampled token's distribution (top-p, top-k), None for all of it."""
        self.support.extend([0] * len(ids) if support is None else (int(k) for k in support))
        self.tokens.extend(int(t) for t in ids)
        self.logprobs.extend(float(x) for x in logprobs) if sampled else self.logprobs.extend([0.0] * len(ids))
        self.mask.extend([int(sampled)] * len(ids))
        self.versions.extend(int(v) for v in versions) if sampled else self.versions.extend([0] * len(ids))


def row_of(prompt: common_pb2.Prompt) -> dict:
    """The prompt row as an environment's reset sees it."""
    kind = prompt.WhichOneof("ground_truth")
    truth = prompt.gt_answer if kind == "gt_answer" else None
    if kind == "test_cases":
        truth = {"inputs": list(prompt.test_cases.inputs), "outputs": list(prompt.test_cases.outputs)}
    return {"prompt_id": prompt.prompt_id, "messages": json.loads(prompt.messages_json), "ground_truth": truth,
            "data_source": prompt.data_source if prompt.HasField("data_source") else None}


def opening_messages(messages: list[dict], opening: str | list[dict] | None) -> list[dict]:
    """A string opening is appended to the last user message's content; a list of messages follows them."""
    if opening is None or opening == "":
        return messages
    if isinstance(opening, list):
        return [*messages, *opening]
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
    if last_user is None:
        return [*messages, {"role": "user", "content": opening}]
    extended = dict(messages[last_user], content=messages[last_user]["content"] + opening)
    return [*messages[:last_user], extended, *messages[last_user + 1:]]


class EpisodeDriver:
    def __init__(self, sessions: EnvironmentSessions, renderer: TurnRenderer, spec: EpisodeSpec, *,
                 max_new_tokens: int, parallel: int = 32, loops: bool = True):
        """`parallel`: environment calls at once; `loops`: a loop per episode where the engine batches
        continuously (False: lockstep with every engine)."""
        self.sessions = sessions
        self.renderer = renderer
        self.spec = spec
        self.max_new_tokens = max_new_tokens
        self.turn_tokens = min(spec.max_turn_tokens or max_new_tokens, max_new_tokens)
        self.loops = loops
        self._pool = ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="episode")
        # Every episode of a batch loops at once (a thread each, started as needed), as every one of them is in
        # a lockstep batch; the engine's batcher bounds the requests it runs together.
        self._loops = ThreadPoolExecutor(max_workers=LOOPS_AT_ONCE, thread_name_prefix="episode-loop")
        self._stepping = threading.BoundedSemaphore(parallel)
        self.timings = EpisodeTimings()

    def play(self, engine: Engine, prompts: Sequence[EpisodePrompt], sampling: SamplingSettings,
             at_turn: Callable[[], None] | None = None) -> tuple[list[list[int]], list[list[Trajectory]]]:
        """Each prompt's ids (with its environment's opening and tools) and its `sampling.n` episodes. Turns are
        as long as the episode limits allow, whatever `sampling.max_new_tokens` says. `at_turn` is called before
        every turn after the first (where the run takes new weights between turns)."""
        if self.plays_loops(engine):
            return self._play_loops(engine, prompts, sampling, at_turn)
        n = sampling.n
        sessions = list(self._pool.map(self._open, [p for p in prompts for _ in range(n)]))
        try:
            groups = [self._group(item, sessions[i * n:(i + 1) * n]) for i, item in enumerate(prompts)]
            self._play_lockstep(engine, [ids for ids, _ in groups], [e for _, group in groups for e in group],
                                sampling, at_turn)
            return self._played(groups, sampling.temperature)
        finally:
            list(self._pool.map(self.sessions.close, [s.episode_id for s in sessions if not s.failed]))

    def plays_loops(self, engine: Engine) -> bool:
        """A loop per episode needs an engine that batches continuously (the transformers engine's)."""
        return self.loops and hasattr(engine, "continuous")

    def _open(self, item: EpisodePrompt) -> Opening:
        return self.sessions.open(item.route.environment, row_of(item.prompt))

    def _group(self, item: EpisodePrompt, sessions: list[Opening]) -> tuple[list[int], list[_Live]]:
        """A prompt's ids (its environment's opening and tools rendered in) and its episodes."""
        opened = [s for s in sessions if not s.failed] or [Opening("", None)]
        # A group compares answers to one prompt: its first episode's opening is the prompt of all of them.
        if any(s.opening != opened[0].opening for s in opened[1:]):
            log.warning("environment %s opened the episodes of prompt %s differently; the first opening is "
                        "the group's prompt", item.route.environment, item.prompt.prompt_id)
        messages = opening_messages(item.builder.messages(item.prompt.messages_json), opened[0].opening)
        ids = item.builder.fit(messages, opened[0].tools)
        return ids, [_Live(s, EpisodeRecord(item.route.environment), ids) for s in sessions]

    def _play_loops(self, engine, prompts: Sequence[EpisodePrompt], sampling: SamplingSettings, at_turn):
        """A group's loops start as soon as its episodes are open, and each episode closes when its loop ends."""
        batcher = engine.continuous()
        turn = dataclasses.replace(sampling, n=1, max_new_tokens=self.turn_tokens)
        opening = [[self._pool.submit(self._open, item) for _ in range(sampling.n)] for item in prompts]
        groups, loops = [], []
        try:
            for item, futures in zip(prompts, opening, strict=True):
                ids, episodes = self._group(item, [f.result() for f in futures])
                groups.append((ids, episodes))
                loops.extend(self._loops.submit(self._loop, batcher, episode, turn, len(loops), at_turn)
                             for episode in episodes)
        except BaseException:
            # The loops close their own sessions; those of the groups not looping yet are closed here.
            looping = {id(e.session) for _, group in groups for e in group}
            for future in [f for futures in opening for f in futures]:
                if not future.cancel() and future.exception() is None:
                    opened = future.result()
                    if id(opened) not in looping and not opened.failed:
                        self.sessions.close(opened.episode_id)
            raise
        finally:
            wait(loops)   # every loop has ended, even when one failed
        for loop in loops:
            loop.result()
        return self._played(groups, sampling.temperature)

    def _loop(self, batcher, episode: _Live, turn: SamplingSettings, index: int, at_turn) -> None:
        """One episode to its end: a turn, its step, the next turn as soon as the step returned. Seeded runs
        give each episode and turn a seed of its own, so episodes of one prompt differ and replay the same."""
        try:
            while not episode.ended:
                if episode.record.turns and at_turn is not None:
                    at_turn()
                seed = None if turn.seed is None else \
                    int(np.random.SeedSequence([turn.seed, index, episode.record.turns]).generate_state(1)[0])
                room = self.max_new_tokens - len(episode.tokens)
                own = dataclasses.replace(turn, seed=seed, max_new_tokens=min(self.turn_tokens, room))
                sample = batcher.submit(episode.prefix + episode.tokens, own, key=id(episode)).result()
                self._record_turn(episode, sample, sample.versions[-1])
                self._end_if_failed(episode)
                if not episode.ended:
                    with self._stepping:
                        outcome = self._step(episode)
                    self._after_step(episode, outcome)
        finally:
            batcher.forget(id(episode))
            if not episode.session.failed:
                self.sessions.close(episode.session.episode_id)

    def _play_lockstep(self, engine, prompt_ids, episodes: list[_Live], sampling: SamplingSettings, at_turn) -> None:
        turn = dataclasses.replace(sampling, max_new_tokens=self.turn_tokens)
        first = self._generate(engine, prompt_ids, turn)
        self._take_turn(episodes, [s for per_prompt in first for s in per_prompt], engine.policy_version)
        while live := [e for e in episodes if not e.ended]:
            if at_turn is not None:
                at_turn()
            budget = max(self.max_new_tokens - len(e.tokens) for e in live)
            later = dataclasses.replace(turn, n=1, max_new_tokens=min(self.turn_tokens, budget),
                                        seed=None if turn.seed is None else turn.seed + live[0].record.turns)
            samples = self._generate(engine, [e.prefix + e.tokens for e in live], later)
            self._take_turn(live, [per_context[0] for per_context in samples], engine.policy_version)

    def _generate(self, engine: Engine, contexts: list[list[int]], sampling: SamplingSettings) -> list[list[Sample]]:
        started = time.perf_counter()
        try:
            return engine.generate(contexts, sampling)
        finally:
            self.timings.engine_seconds += time.perf_counter() - started

    def _step(self, episode: _Live) -> StepOutcome:
        started = time.perf_counter()
        outcome = self.sessions.step(episode.session.episode_id, episode.last_text)
        self.timings.step_seconds.append(time.perf_counter() - started)
        return outcome

    def _take_turn(self, live: list[_Live], samples: list[Sample], version: int) -> None:
        """`version`: the engine's when the turn's call returned, for engines that do not say per token."""
        for episode, sample in zip(live, samples, strict=True):
            self._record_turn(episode, sample, version)
            self._end_if_failed(episode)
        stepping = [e for e in live if not e.ended]
        started = time.perf_counter()
        outcomes = list(self._pool.map(self._step, stepping))
        self.timings.environment_seconds += time.perf_counter() - started
        for episode, outcome in zip(stepping, outcomes, strict=True):
            self._after_step(episode, outcome)

    def _record_turn(self, episode: _Live, sample: Sample, version: int) -> None:
        room = self.max_new_tokens - len(episode.tokens)
        ids, logprobs = sample.token_ids[:room], sample.logprobs[:room]
        versions = sample.versions[:room] if sample.versions is not None else [version] * len(ids)
        support = sample.support[:room] if sample.support is not None else None
        episode.add(ids, logprobs, versions, sampled=True, support=support)
        episode.record.turns += 1
        episode.last_finish = sample.finish_reason if len(ids) == len(sample.token_ids) else FINISH_LENGTH
        episode.last_text = sample.text if len(ids) == len(sample.token_ids) else \
            self.renderer.tokenizer.decode(ids.tolist(), skip_special_tokens=True)

    @staticmethod
    def _end_if_failed(episode: _Live) -> None:
        if episode.session.failed:
            episode.record.ended_reason = episode.session.failed
            episode.record.error = episode.session.error

    def _after_step(self, episode: _Live, outcome: StepOutcome) -> None:
        record = episode.record
        record.step_rewards.append(float(outcome.reward))
        record.tool_calls += outcome.tool_calls
        record.info = outcome.info
        if outcome.ended_reason:
            record.ended_reason = outcome.ended_reason
            record.error = str(outcome.info.get("error", ""))
        elif outcome.done:
            record.ended_reason = DONE
        elif record.turns >= self.spec.max_turns:
            record.ended_reason = MAX_TURNS
        elif len(episode.tokens) >= self.max_new_tokens:
            record.ended_reason = MAX_TOKENS
        if record.ended_reason:
            return
        observation = self.renderer.observation_tokens(
            observation_messages(outcome.observation),
            ended_with_eos=episode.last_finish == FINISH_STOP and self.renderer.ends_with_eos(episode.tokens))
        # An observation that leaves no room for another turn would only be context nobody answers.
        if len(episode.tokens) + len(observation) >= self.max_new_tokens:
            record.ended_reason = MAX_TOKENS
            return
        episode.add(observation, (), (), sampled=False)

    def _played(self, groups: list[tuple[list[int], list[_Live]]], temperature: float):
        return [ids for ids, _ in groups], [[self._trajectory(e, temperature) for e in group] for _, group in groups]

    def _trajectory(self, episode: _Live, temperature: float) -> Trajectory:
        record = episode.record
        record.transcript = self.renderer.tokenizer.decode(episode.tokens, skip_special_tokens=False)
        truncated = record.ended_reason in TRUNCATING or episode.last_finish == FINISH_LENGTH
        return Trajectory(prompt_ids=episode.prefix, response_ids=episode.tokens, logprobs=episode.logprobs,
                          loss_mask=episode.mask, versions=carried_versions(episode.versions, episode.mask),
                          finish_reason=FINISH_LENGTH if truncated else FINISH_STOP, temperature=temperature,
                          text=episode.last_text, support=episode.support, episode=record)

    def close(self) -> None:
        self._loops.shutdown(wait=False, cancel_futures=True)
        self._pool.shutdown(wait=False, cancel_futures=True)
