"""A loop per episode over the transformers engine's continuous batcher: each episode goes on as soon as its own
step returns (a slow environment holds only its own episode), its turns reuse its kept KV cache, and what it
trains on is the same masked token-in/token-out response as in lockstep."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
from engine_cases import recompute_logprobs
from transformers import AutoModelForCausalLM

from zerobubble.common.episodes import EpisodeSpec
from zerobubble.rollout.engine import Sample, SamplingSettings
from zerobubble.rollout.engine_transformers import TransformersEngine
from zerobubble.rollout.episodes.driver import EpisodeDriver, EpisodePrompt
from zerobubble.rollout.episodes.render import TurnRenderer
from zerobubble.rollout.episodes.sessions import Opening, StepOutcome
from zerobubble.rollout.prompting import PromptBuilder
from zerobubble.v1 import common_pb2

ROUTE = {"environment": "echo"}
SAMPLING = SamplingSettings(n=2, temperature=1.0, max_new_tokens=8, seed=5)


class Environments:
    """Each episode answers `turns` steps with an observation, then ends; `hold` blocks one episode's first step
    until every other episode has ended (or 60 s have gone)."""

    def __init__(self, turns: int = 3, hold: str | None = None):
        self.turns, self.hold = turns, hold
        self.steps: dict[str, int] = {}
        self.ended: list[str] = []
        self.others_ended = threading.Event()
        self.lock = threading.Lock()
        self.count = 0

    def open(self, environment, row):
        with self.lock:
            episode_id = f"{row['prompt_id']}-{self.count}"
            self.count += 1
            self.steps[episode_id] = 0
        return Opening(episode_id, "", [])

    def step(self, episode_id, assistant_text):
        if episode_id == self.hold and self.steps[episode_id] == 0:
            self.others_ended.wait(60)
        with self.lock:
            self.steps[episode_id] += 1
            done = self.steps[episode_id] >= self.turns
            if done:
                self.ended.append(episode_id)
                if len(self.ended) == self.count - 1 and self.hold not in self.ended:
                    self.others_ended.set()
        return StepOutcome(None if done else f"seen {self.steps[episode_id]}", reward=1.0, done=done)

    def close(self, episode_id):
        pass


@pytest.fixture(scope="module")
def engine(varied_model):
    engine = TransformersEngine(varied_model, seed=0)
    yield engine
    engine.close()


def play(engine, environments, *, count=2, at_turn=None, sampling=SAMPLING, max_new_tokens=200, max_turns=64):
    spec = EpisodeSpec(default=ROUTE, max_turn_tokens=8, max_turns=max_turns)
    driver = EpisodeDriver(environments, TurnRenderer(engine.tokenizer, 64), spec, max_new_tokens=max_new_tokens)
    builder = PromptBuilder(engine.tokenizer, "", 64)
    items = [EpisodePrompt(common_pb2.Prompt(prompt_id=f"p{i}", messages_json=json.dumps(
        [{"role": "user", "content": f"{i}+1="}])), spec.default, builder) for i in range(count)]
    try:
        return driver.play(engine, items, sampling, at_turn)
    finally:
        driver.close()


def test_a_slow_step_holds_only_its_own_episode(engine):
    environments = Environments(turns=3, hold="p0-0")
    _, samples = play(engine, environments)
    # The held episode's first step returned only once the three others had played all their turns: in lockstep
    # they would have waited for it at their second turn, and the hold would have run out.
    assert environments.others_ended.is_set()
    assert environments.ended[-1] == "p0-0" and len(environments.ended) == 4
    assert all(s.episode.turns == 3 and s.episode.ended_reason == "done" for group in samples for s in group)


def test_each_turn_reuses_the_episodes_cache_and_the_response_is_what_the_model_sampled(engine, varied_model):
    batcher = engine.continuous()
    reused = batcher.stats.reused_tokens
    prompt_ids, samples = play(engine, Environments(turns=3))
    assert batcher.stats.reused_tokens > reused
    plain = AutoModelForCausalLM.from_pretrained(varied_model).eval()
    for prompt, group in zip(prompt_ids, samples, strict=True):
        for sample in group:
            model = sample.loss_mask == 1
            assert model.any() and (~model).any() and sample.episode.turns == 3
            # Every model token's log-prob is a plain forward's over the whole episode so far, and nothing else
            # carries one: observations are context, not samples.
            response = Sample(token_ids=sample.response_ids, logprobs=sample.logprobs, finish_reason="stop")
            whole = recompute_logprobs(plain, prompt, response, 1.0)
            np.testing.assert_allclose(sample.logprobs[model], whole[model], atol=2e-4)
            assert not sample.logprobs[~model].any()
            assert "seen 1" in engine.tokenizer.decode(sample.response_ids[~model].tolist())
    # The kept caches went with their episodes.
    assert len(batcher.kept) == 0


def test_seeded_loops_replay_and_the_episodes_of_one_prompt_differ(engine):
    _, first = play(engine, Environments(turns=2))
    _, again = play(engine, Environments(turns=2))
    tokens = [[s.response_ids.tolist() for s in group] for group in first]
    assert tokens == [[s.response_ids.tolist() for s in group] for group in again]
    assert all(group[0] != group[1] for group in tokens)


def test_weights_taken_before_an_episodes_later_turn_are_the_versions_of_its_tokens(engine, varied_model):
    taken = []

    def at_turn():   # the run's between_turns hook: here the same weights as a new version
        version = engine.policy_version + 1
        engine.load_weights(((n, t) for n, t in engine.model.state_dict().items()), version=version)
        taken.append(version)
    try:
        _, samples = play(engine, Environments(turns=2), count=1, at_turn=at_turn)
    finally:
        engine.load_weights(engine.model.state_dict().items(), version=0)
    assert len(taken) == 2     # once before each episode's second turn
    for sample in samples[0]:
        model = sample.loss_mask == 1
        versions = sample.versions[model]
        first_turn = int(np.argmax(versions > 0))
        assert first_turn > 0 and (versions[:first_turn] == 0).all() and (versions[first_turn:] >= 1).all()


class Closing(Environments):
    """Records closes, and lets the test know when the first step has come."""

    def __init__(self):
        super().__init__(turns=10 ** 6)   # episodes that go on until the engine closes
        self.closed: list[str] = []
        self.stepped = threading.Event()

    def step(self, episode_id, assistant_text):
        self.stepped.set()
        return super().step(episode_id, assistant_text)

    def close(self, episode_id):
        with self.lock:
            self.closed.append(episode_id)


def test_closing_the_engine_mid_play_ends_every_loop_and_closes_every_episode(varied_model):
    from zerobubble.rollout.continuous import BatcherClosed

    engine = TransformersEngine(varied_model, seed=0)
    environments = Closing()
    outcome = {}

    def playing():
        try:
            play(engine, environments, count=3, max_new_tokens=10 ** 6, max_turns=10 ** 6)
        except BaseException as exc:   # what the worker's play would see
            outcome["error"] = exc
    thread = threading.Thread(target=playing)
    thread.start()
    assert environments.stepped.wait(60)
    engine.close()
    thread.join(60)
    assert not thread.is_alive()
    assert isinstance(outcome.get("error"), BatcherClosed)
    assert sorted(environments.closed) == sorted(environments.steps) and len(environments.closed) == 6
