"""A batch of leased rows played and judged: single-turn rows in one engine call as ever, episode rows through the
episode driver, and each response's reward from the verifier, its environment, or both (the row's route)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from zerobubble.common.config import ClientConfig, ConfigError
from zerobubble.common.episodes import EpisodeRoute, EpisodeSpec
from zerobubble.common.persistence import until_done
from zerobubble.common.run_spec import RunSpec
from zerobubble.common.trajectory import Trajectory
from zerobubble.rollout.engine import Engine, SamplingSettings
from zerobubble.rollout.episodes.driver import EpisodeDriver, EpisodePrompt
from zerobubble.rollout.episodes.render import TurnRenderer
from zerobubble.rollout.experience import score_requests, single_turn
from zerobubble.rollout.prompting import RoutedPrompts
from zerobubble.v1 import common_pb2, reward_pb2

ScoreBatch = Callable[[list[reward_pb2.ScoreRequest]], list[reward_pb2.ScoreResult]]


def episode_score(route: EpisodeRoute, trajectory: Trajectory,
                  verdict: reward_pb2.ScoreResult | None) -> reward_pb2.ScoreResult:
    """The verifier's verdict (when the route asks for one) plus or instead of the environment's reward. Without a
    verifier, the answer counts as right when the last step's info says `answer_ok`, else when the reward is
    above 0; the format is right when the environment ended the episode."""
    record = trajectory.episode
    from_environment = record.environment_reward(route.environment_reward)
    if route.reward == "verifier":
        return verdict
    if route.reward == "both":
        return reward_pb2.ScoreResult(id=verdict.id, reward=verdict.reward + from_environment,
                                      format_ok=verdict.format_ok, answer_ok=verdict.answer_ok)
    answer_ok = record.info.get("answer_ok")
    return reward_pb2.ScoreResult(
        reward=from_environment, format_ok=record.ended_reason == "done",
        answer_ok=bool(answer_ok) if isinstance(answer_ok, bool) else from_environment > 0)


class Player:
    def __init__(self, prompts: RoutedPrompts, episodes: EpisodeSpec, driver: EpisodeDriver | None):
        if episodes.enabled and driver is None:
            raise ValueError("the run has episodes (run_spec.episodes) but this worker has no environment service")
        self.prompts = prompts
        self.episodes = episodes
        self.driver = driver

    def plays_loops(self, engine: Engine) -> bool:
        """Whether this player's episodes run a loop each over `engine` (else in lockstep, or no episodes)."""
        return self.driver is not None and self.driver.plays_loops(engine)

    def route(self, prompt: common_pb2.Prompt) -> EpisodeRoute | None:
        return self.episodes.route(prompt.data_source if prompt.HasField("data_source") else None)

    def play(self, engine: Engine, prompts: Sequence[common_pb2.Prompt], sampling: SamplingSettings,
             at_turn: Callable[[], None] | None = None) -> tuple[list[list[int]], list[list[Trajectory]]]:
        """Each prompt's ids and its `sampling.n` trajectories, in the prompts' order; `at_turn` between an
        episode's turns (see EpisodeDriver.play)."""
        routes = [self.route(p) for p in prompts]
        single = [i for i, r in enumerate(routes) if r is None]
        episodic = [i for i, r in enumerate(routes) if r is not None]
        prompt_ids: list[list[int] | None] = [None] * len(prompts)
        samples: list[list[Trajectory] | None] = [None] * len(prompts)
        if single:
            ids = [self.prompts.build(prompts[i]) for i in single]
            generated = engine.generate(ids, sampling)
            version = engine.policy_version
            for i, own_ids, own in zip(single, ids, generated, strict=True):
                prompt_ids[i] = own_ids
                samples[i] = [single_turn(own_ids, sample, policy_version=version, temperature=sampling.temperature)
                              for sample in own]
        if episodic:
            items = [EpisodePrompt(prompts[i], routes[i], self.prompts.builder(prompts[i])) for i in episodic]
            ids, played = self.driver.play(engine, items, sampling, at_turn)
            for i, own_ids, own in zip(episodic, ids, played, strict=True):
                prompt_ids[i], samples[i] = own_ids, own
        return prompt_ids, samples

    def score(self, score_batch: ScoreBatch, prompts: Sequence[common_pb2.Prompt],
              samples: Sequence[Sequence[Trajectory]], *, partial_credit: bool = False,
              prompt_texts: Sequence[str] | None = None) -> list[list[reward_pb2.ScoreResult]]:
        """Every response's score; the verifier is asked only for those whose route wants its verdict."""
        requests, asked = [], set()
        for index, (prompt, per_prompt) in enumerate(zip(prompts, samples, strict=True)):
            route = self.route(prompt)
            if route is None or route.reward != "environment":
                text = prompt_texts[index] if prompt_texts is not None else ""
                requests.extend(score_requests(self.prompts.verifier(prompt), prompt, per_prompt,
                                               partial_credit=partial_credit, prompt_text=text))
                asked.add(index)
        verdicts = iter(score_batch(requests) if requests else [])
        scores = []
        for index, (prompt, per_prompt) in enumerate(zip(prompts, samples, strict=True)):
            route = self.route(prompt)
            own = [next(verdicts) for _ in per_prompt] if index in asked else [None] * len(per_prompt)
            scores.append(own if route is None else
                          [episode_score(route, s, v) for s, v in zip(per_prompt, own, strict=True)])
        return scores


def make_player(tokenizer, spec: RunSpec, *, system_prompt: str | None,
                environment: ClientConfig | None) -> Player:
    """The worker's, its evaluator's and a final evaluation's player: the run spec's verifier routing and system
    prompts, and its episodes played in the environment service at `environment`."""
    prompts = RoutedPrompts(tokenizer, spec, system_prompt, spec.max_prompt_tokens)
    driver = None
    if spec.episodes.enabled:
        if environment is None:
            raise ConfigError("environment: run_spec.episodes plays rows in environments "
                              f"({', '.join(spec.episodes.environments())}), so the rollout worker needs the "
                              "environment service's address")
        from zerobubble.rollout.episodes.remote import RemoteSessions

        sessions = RemoteSessions(environment)
        served = until_done(sessions.environments, what="list the environments", stop=threading.Event(),
                            max_backoff=5.0, give_up_seconds=environment.retry_seconds)
        if missing := [name for name in spec.episodes.environments() if name not in served]:
            raise ConfigError(f"run_spec.episodes: the environment service at {environment.address} has no "
                              f"environment {', '.join(map(repr, missing))} (it has: {', '.join(served) or 'none'})")
        renderer = TurnRenderer(tokenizer, spec.episodes.max_observation_tokens)
        driver = EpisodeDriver(sessions, renderer, spec.episodes,
                               max_new_tokens=spec.max_new_tokens)
    return Player(prompts, spec.episodes, driver)
