"""An environment's failures are visible: through a real environment service the exception's message and the
user's own frames reach the episode record, the trained group (EpisodeInfo.error), rollouts.jsonl's fields and the
step's counts by reason (metrics.jsonl) and Prometheus; the rollout worker's watch logs the first error of each
kind once, warns of a batch whose episodes all failed, and stops after run.episodes.max_failed_batches of them
naming the environment and the reason."""

from __future__ import annotations

import json
import logging
import textwrap

import pytest
from prometheus_client import CollectorRegistry

from zerobubble.common.config import ClientConfig, load_config
from zerobubble.common.episodes import EpisodeSpec
from zerobubble.common.trajectory import EpisodeRecord, Trajectory
from zerobubble.environment.app import build
from zerobubble.environment.config import EnvironmentServiceConfig
from zerobubble.rollout.engine import SamplingSettings
from zerobubble.rollout.engine_transformers import TransformersEngine
from zerobubble.rollout.episodes.driver import EpisodeDriver, EpisodePrompt
from zerobubble.rollout.episodes.failures import EnvironmentsFailing, FailureWatch
from zerobubble.rollout.episodes.remote import RemoteSessions
from zerobubble.rollout.episodes.render import TurnRenderer
from zerobubble.rollout.experience import experience_group
from zerobubble.rollout.metrics import RolloutMetrics
from zerobubble.rollout.prompting import PromptBuilder
from zerobubble.trainer.tracking import add_counts, episode_endings, episode_fields
from zerobubble.v1 import common_pb2, reward_pb2

BROKEN = '''
def helper(text):
    raise ValueError(f"cannot parse {text[:3]!r}")


class StepRaises:
    def reset(self, row):
        return None

    def step(self, assistant_text):
        return helper(assistant_text)


class ResetRaises:
    def reset(self, row):
        raise KeyError("no such level")

    def step(self, assistant_text):
        return {"done": True}
'''


@pytest.fixture(scope="module")
def broken_service(tmp_path_factory):
    folder = tmp_path_factory.mktemp("my_envs")
    (folder / "broken_envs.py").write_text(textwrap.dedent(BROKEN))
    host = build(load_config(EnvironmentServiceConfig, overrides={
        "server.listen": "127.0.0.1:0", "limits.step_timeout_s": 5.0,
        "environments": [{"name": "step_raises", "environment": "broken_envs:StepRaises", "path": str(folder)},
                         {"name": "reset_raises", "environment": "broken_envs:ResetRaises", "path": str(folder)}],
    })).start()
    sessions = RemoteSessions(ClientConfig(address=host.address, timeout_seconds=30, retry_seconds=5))
    yield sessions
    sessions.client.close()
    host.stop(grace=1.0)


@pytest.fixture(scope="module")
def engine(tiny_model):
    return TransformersEngine(tiny_model, seed=0)


def play(engine, sessions, environment: str, n: int = 2):
    spec = EpisodeSpec(default={"environment": environment}, max_turn_tokens=8)
    driver = EpisodeDriver(sessions, TurnRenderer(engine.tokenizer, 64), spec, max_new_tokens=32)
    prompt = common_pb2.Prompt(prompt_id="p0", gt_answer="2",
                               messages_json=json.dumps([{"role": "user", "content": "1+1="}]))
    item = EpisodePrompt(prompt, spec.default, PromptBuilder(engine.tokenizer, "", 64))
    try:
        ids, samples = driver.play(engine, [item], SamplingSettings(n=n, temperature=1.0, max_new_tokens=8, seed=1))
    finally:
        driver.close()
    return prompt, ids[0], samples[0]


def trained_group(prompt, ids, samples):
    scores = [reward_pb2.ScoreResult(reward=0.0) for _ in samples]
    return experience_group(prompt, ids, samples, scores, producer_id="w", producer_incarnation="i", sequence=1,
                            lease_id="l")


def test_a_step_that_raises_brings_its_message_and_the_users_frames_to_the_record_and_the_trained_group(
        engine, broken_service):
    prompt, ids, samples = play(engine, broken_service, "step_raises")
    for sample in samples:
        record = sample.episode
        assert record.ended_reason == "error" and record.failed
        assert record.error.startswith("step raised ValueError: cannot parse"), record.error
        # The user's own lines, not the service's: where to look.
        assert "broken_envs.py" in record.error and "in helper" in record.error, record.error
        assert "services/environment" not in record.error
    group = trained_group(prompt, ids, samples)
    fields = [episode_fields(t)["episode"] for t in group.trajectories]
    assert all(f["ended_reason"] == "error" and "cannot parse" in f["error"] for f in fields)
    assert episode_endings([group]) == {"episodes": 2, "episodes_failed": 2, "episodes_failed_error": 2}


def test_a_reset_that_raises_ends_the_episode_reset_failed_with_its_message(engine, broken_service, caplog):
    with caplog.at_level(logging.DEBUG, logger="zerobubble.rollout.episodes.remote"):
        prompt, ids, samples = play(engine, broken_service, "reset_raises", n=3)
    # One warning for the batch's failed openings, not one per episode; the rest at debug level.
    said = [r.levelno for r in caplog.records if "could not be opened" in r.getMessage()]
    assert said == [logging.WARNING, logging.DEBUG, logging.DEBUG], said
    for sample in samples:
        assert sample.episode.ended_reason == "reset_failed"
        assert "reset raised KeyError: 'no such level'" in sample.episode.error, sample.episode.error
        assert "broken_envs.py" in sample.episode.error
    group = trained_group(prompt, ids, samples)
    assert group.trajectories[0].episode.error == samples[0].episode.error


def test_counts_by_reason_add_up_over_ranks_and_a_healthy_episode_is_not_a_failure():
    def group(*reasons):
        return common_pb2.ExperienceGroup(trajectories=[
            common_pb2.Trajectory(episode=common_pb2.EpisodeInfo(environment="e", ended_reason=r)) for r in reasons])

    single_turn = common_pb2.ExperienceGroup(trajectories=[common_pb2.Trajectory()])
    assert episode_endings([single_turn]) == {}
    shares = [episode_endings([group("done", "timeout")]), episode_endings([group("max_turns", "max_steps")]),
              episode_endings([group("bad_reply", "timeout")])]
    assert add_counts(shares) == {"episodes": 6, "episodes_failed": 3, "episodes_failed_timeout": 2,
                                  "episodes_failed_bad_reply": 1}


def played(episode: EpisodeRecord | None = None) -> Trajectory:
    return Trajectory(prompt_ids=[3], response_ids=[0], logprobs=[0.0], loss_mask=[1], versions=[0],
                      finish_reason="stop", temperature=1.0, episode=episode)


def sample(environment: str, reason: str, error: str = "") -> Trajectory:
    return played(EpisodeRecord(environment, turns=1, ended_reason=reason, error=error))


def test_prometheus_counts_episodes_by_environment_and_reason():
    registry = CollectorRegistry()
    RolloutMetrics(registry).observe_episodes([sample("e", "error", "boom"), sample("e", "error"),
                                               sample("e", "done")])
    assert registry.get_sample_value("zerobubble_rollout_episodes_total", {"environment": "e", "ended": "error"}) == 2
    assert registry.get_sample_value("zerobubble_rollout_episodes_total", {"environment": "e", "ended": "done"}) == 1


def test_the_watch_logs_each_first_error_once_warns_and_stops_after_the_set_number_of_batches(tmp_path, caplog):
    report = tmp_path / "failures.jsonl"
    watch = FailureWatch("rollout-0", 2, report)
    failing = [[sample("broken", "error", "step raised ValueError: boom\nTraceback ..."),
                sample("broken", "timeout", "no answer within 5 s")]]
    with caplog.at_level(logging.WARNING, logger="zerobubble.rollout.episodes.failures"):
        watch.observe(failing)
        # A batch with one healthy episode breaks the run of failed batches.
        watch.observe([[sample("broken", "error", "step raised ValueError: boom"), sample("broken", "done")]])
        watch.observe(failing)
        with pytest.raises(EnvironmentsFailing) as stopped:
            watch.observe(failing)
    message = str(stopped.value)
    assert "'broken'" in message and "error" in message and "step raised ValueError: boom" in message
    assert "max_failed_batches=2" in message
    firsts = [r for r in caplog.records if "for the first time" in r.getMessage()]
    assert len(firsts) == 2 and "Traceback" in firsts[0].getMessage()
    assert sum("every episode of the batch" in r.getMessage() for r in caplog.records) == 3
    kinds = [json.loads(line)["kind"] for line in report.read_text().splitlines()]
    assert kinds == ["first_error", "first_error", "all_failed", "all_failed", "all_failed", "stopped"]


def test_a_watch_without_a_limit_never_stops_and_batches_without_episodes_change_nothing():
    watch = FailureWatch("rollout-0", None)
    for _ in range(5):
        watch.observe([[sample("broken", "unavailable", "the environment service answered UNAVAILABLE")]])
    watch.observe([[played()]])
    assert watch.failed_batches == 5
