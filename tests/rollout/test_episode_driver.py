"""The episode driver on the real transformers engine and the tiny model: a response is the model's turns exactly
as sampled and the observations between them as the chat template renders them, masked; every live episode takes
its turn in one engine call; each limit ends an episode with its reason.

The environments here are plain objects in the test's process, so that what the driver does with each reply is
checked alone; the same paths through the real environment service are in tests/environment."""

from __future__ import annotations

import json

import numpy as np
import pytest

from zerobubble.common.episodes import EpisodeSpec
from zerobubble.rollout.engine import SamplingSettings
from zerobubble.rollout.engine_transformers import TransformersEngine
from zerobubble.rollout.episodes.driver import EpisodeDriver, EpisodePrompt
from zerobubble.rollout.episodes.render import TurnRenderer
from zerobubble.rollout.episodes.sessions import Opening, StepOutcome
from zerobubble.rollout.prompting import PromptBuilder
from zerobubble.v1 import common_pb2

ROUTE = {"environment": "echo"}


class Recording:
    """The real engine, with every call's contexts and samples kept."""

    def __init__(self, engine):
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.policy_version = 0
        self.calls = []

    def generate(self, prompts, sampling):
        out = self.engine.generate(prompts, sampling)
        self.calls.append(([list(p) for p in prompts], sampling, out))
        return out


class ScriptedEnvironments:
    """Each episode answers its turns with `replies` in order (a StepOutcome, or an exception to raise)."""

    def __init__(self, replies, opening="", tools=()):
        self.replies = replies
        self.opening = opening
        self.tools = list(tools)
        self.steps: dict[str, list[str]] = {}
        self.closed: list[str] = []

    def open(self, environment, row):
        episode_id = f"{row['prompt_id']}-{len(self.steps)}"
        self.steps[episode_id] = []
        return Opening(episode_id, self.opening, self.tools)

    def step(self, episode_id, assistant_text):
        self.steps[episode_id].append(assistant_text)
        return self.replies[len(self.steps[episode_id]) - 1]

    def close(self, episode_id):
        self.closed.append(episode_id)


@pytest.fixture(scope="module")
def engine(tiny_model):
    return TransformersEngine(tiny_model, seed=0)


def prompts(engine, count):
    builder = PromptBuilder(engine.tokenizer, "", 64)
    return [EpisodePrompt(common_pb2.Prompt(prompt_id=f"p{i}", messages_json=json.dumps(
        [{"role": "user", "content": f"{i}+1="}])), EpisodeSpec(default=ROUTE).default, builder)
        for i in range(count)]


def play(engine, environments, *, n=3, count=2, max_new_tokens=96, top_p=1.0, **limits):
    spec = EpisodeSpec(default=ROUTE, **({"max_turn_tokens": 8} | limits))
    recording = Recording(engine)
    driver = EpisodeDriver(environments, TurnRenderer(engine.tokenizer, spec.max_observation_tokens), spec,
                           max_new_tokens=max_new_tokens)
    sampling = SamplingSettings(n=n, temperature=1.0, max_new_tokens=8, seed=3, top_p=top_p)
    prompt_ids, samples = driver.play(recording, prompts(engine, count), sampling)
    return recording, prompt_ids, samples


def test_a_two_turn_episode_is_the_sampled_tokens_and_the_rendered_observation_masked_between_them(engine):
    environments = ScriptedEnvironments([StepOutcome("obs!", reward=0.25),
                                         StepOutcome(None, reward=1.0, done=True, info={"answer_ok": True})])
    recording, prompt_ids, samples = play(engine, environments)
    # One call per turn across all six episodes: the first as two prompts of n=3, the second as six contexts.
    assert len(recording.calls) == 2
    (first_contexts, first_sampling, first), (second_contexts, second_sampling, second) = recording.calls
    assert first_contexts == prompt_ids and first_sampling.n == 3
    assert second_sampling.n == 1 and len(second_contexts) == 6
    observation = TurnRenderer(engine.tokenizer, 256)
    for index, sample in enumerate(s for per_prompt in samples for s in per_prompt):
        turn1 = first[index // 3][index % 3]
        turn2 = second[index][0]
        rendered = observation.observation_tokens([{"role": "user", "content": "obs!"}],
                                                  ended_with_eos=turn1.finish_reason == "stop")
        expected = [*turn1.token_ids, *rendered, *turn2.token_ids]
        assert sample.response_ids.tolist() == expected
        assert sample.loss_mask.tolist() == [1] * len(turn1.token_ids) + [0] * len(rendered) + \
            [1] * len(turn2.token_ids)
        # Behaviour log-probs exactly as sampled where the model sampled, nothing where it did not.
        np.testing.assert_array_equal(sample.logprobs[sample.loss_mask == 1],
                                      np.concatenate([turn1.logprobs, turn2.logprobs]))
        assert not sample.logprobs[sample.loss_mask == 0].any()
        # The second turn was generated from the prompt, the first turn and the observation, as tokens.
        assert second_contexts[index] == prompt_ids[index // 3] + [*turn1.token_ids, *rendered]
        assert "obs!" in engine.tokenizer.decode(rendered)
        record = sample.episode
        assert (record.turns, record.step_rewards, record.ended_reason) == (2, [0.25, 1.0], "done")
        assert sample.text == turn2.text
    # Every turn's text reached its episode, and every episode was closed.
    assert all(len(turns) == 2 for turns in environments.steps.values())
    assert sorted(environments.closed) == sorted(environments.steps)


def test_the_limits_end_episodes_with_their_reasons(engine):
    going_on = ScriptedEnvironments([StepOutcome("more")] * 10)
    _, _, samples = play(engine, going_on, n=2, count=1, max_turns=3)
    assert {s.episode.ended_reason for s in samples[0]} == {"max_turns"}
    assert all(s.episode.turns == 3 and s.finish_reason == "length" for s in samples[0])

    # A budget of 20 tokens: turns of up to 8 and observations of about 20 cannot all fit.
    _, _, samples = play(engine, ScriptedEnvironments([StepOutcome("x" * 10)] * 10), n=2, count=1,
                         max_new_tokens=20)
    for sample in samples[0]:
        assert sample.episode.ended_reason == "max_tokens" and len(sample.response_ids) <= 20

    # An observation's content is cut to max_observation_tokens (the byte tokenizer: one token per character).
    recording, _, samples = play(engine, ScriptedEnvironments([StepOutcome("y" * 100),
                                                               StepOutcome(None, done=True)]),
                                 n=1, count=1, max_observation_tokens=5)
    observed = engine.tokenizer.decode(samples[0][0].response_ids[samples[0][0].loss_mask == 0].tolist())
    assert "yyyyy" in observed and "yyyyyy" not in observed


def test_an_environment_failure_ends_its_episode_with_the_reason_and_keeps_the_model_tokens(engine):
    environments = ScriptedEnvironments([StepOutcome(None, reward=0.0, done=True, ended_reason="timeout")])
    _, _, samples = play(engine, environments, n=2, count=1)
    for sample in samples[0]:
        assert sample.episode.ended_reason == "timeout" and sample.episode.turns == 1
        assert sample.loss_mask.all() and len(sample.response_ids) > 0


def test_an_opening_and_tools_reach_the_prompt(engine):
    tools = [{"type": "function", "function": {"name": "calc", "description": "adds",
                                               "parameters": {"type": "object", "properties": {}}}}]
    environments = ScriptedEnvironments([StepOutcome(None, done=True)], opening=" Use calc.", tools=tools)
    _, prompt_ids, _ = play(engine, environments, n=1, count=1)
    assert "0+1= Use calc." in engine.tokenizer.decode(prompt_ids[0])


def test_weights_taken_between_turns_are_the_versions_of_the_later_turns_tokens(engine):
    spec = EpisodeSpec(default=ROUTE, max_turn_tokens=8)
    recording = Recording(engine)
    driver = EpisodeDriver(ScriptedEnvironments([StepOutcome("obs!"), StepOutcome(None, done=True)]),
                           TurnRenderer(engine.tokenizer, 256), spec, max_new_tokens=96)

    def new_weights():   # as a weight load tags the engine's later samples
        recording.engine.policy_version += 1
        recording.policy_version = recording.engine.policy_version

    _, samples = driver.play(recording, prompts(engine, 1), SamplingSettings(n=2, temperature=1.0, max_new_tokens=8,
                                                                             seed=3), at_turn=new_weights)
    first_turn = len(recording.calls[0][2][0][0].token_ids)
    recording.engine.policy_version = 0
    for sample in samples[0]:
        second_start = len(sample.response_ids) - int(sample.loss_mask[::-1].argmin())
        # The first turn and the observation after it: version 0; the turn after the new weights: version 1.
        assert sample.versions.tolist() == [0] * second_start + [1] * (len(sample.response_ids) - second_start)
        assert sample.loss_mask[:first_turn].all()


def test_at_top_p_each_model_token_keeps_its_support_and_observations_none(engine):
    # The trainer replays each token's support; without it an episode's weights would carry the mass top-p cut.
    environments = ScriptedEnvironments([StepOutcome("obs!", reward=0.0), StepOutcome(None, reward=1.0, done=True)])
    recording, _, samples = play(engine, environments, top_p=0.7)
    (_, _, first), (_, _, second) = recording.calls
    for index, sample in enumerate(s for per_prompt in samples for s in per_prompt):
        turn1, turn2 = first[index // 3][index % 3], second[index][0]
        model = sample.loss_mask == 1
        np.testing.assert_array_equal(sample.support[model], np.concatenate([turn1.support, turn2.support]))
        assert (sample.support[model] >= 1).all() and not sample.support[~model].any()
    _, _, whole = play(engine, ScriptedEnvironments([StepOutcome(None, reward=1.0, done=True)]))
    assert all(sample.support is None for per_prompt in whole for sample in per_prompt)
