"""Batches played at once (generation.batches_in_flight): the scheduling piece on its own, the setting refused where
it cannot hold, and a real rollout worker (tiny model, continuous batcher) between a real buffer, reward service and
environment service, whose next batch is leased and pushed while one slow episode of the batch before still plays."""

from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager

import pytest
from stack import start_buffer, start_reward, tiny_assets
from test_rollout_worker import rollout_config, wait_for

from zerobubble.common.clients.buffer import BufferClient
from zerobubble.common.config import ConfigError, load_config
from zerobubble.environment.app import build as build_environment
from zerobubble.environment.config import EnvironmentServiceConfig
from zerobubble.rollout.app import build
from zerobubble.rollout.batches_in_flight import BatchesInFlight, check_batches_in_flight

# The rows whose question says "slow" take 4 s a step; every other episode ends at its first step at once.
SLOW_ROWS = '''
import time


class SlowRows:
    def reset(self, row):
        self.slow = "slow" in row["messages"][-1]["content"]
        return ""

    def step(self, assistant_text):
        if self.slow:
            time.sleep(4)
        return {"observation": None, "reward": 1.0, "done": True, "info": {}}
'''


def test_no_more_than_the_limit_play_at_once_and_each_result_is_handed_on_as_it_finishes():
    playing, most, lock = 0, 0, threading.Lock()
    finished: list[float] = []

    def play(seconds: float) -> float:
        nonlocal playing, most
        with lock:
            playing += 1
            most = max(most, playing)
        time.sleep(seconds)
        with lock:
            playing -= 1
        return seconds

    batches = BatchesInFlight(2, play, finished.append)
    never = threading.Event()
    for seconds in (0.6, 0.05, 0.05, 0.05):
        assert batches.take_slot(never)
        batches.start(seconds)
    batches.drain()
    assert most == 2
    # The quick batches went on past the slow one, which was handed on when it finished.
    assert finished[:3] == [0.05, 0.05, 0.05] and finished[3] == 0.6
    assert batches.playing == 0 and batches.error is None


def test_a_failed_batch_is_kept_as_the_error_and_gives_its_slot_back():
    batches = BatchesInFlight(1, lambda _: 1 / 0, lambda result: None)
    never = threading.Event()
    assert batches.take_slot(never)
    batches.start(None)
    batches.drain()
    assert isinstance(batches.error, ZeroDivisionError)
    assert batches.take_slot(never), "the failed batch kept its slot"


def test_taking_a_slot_gives_up_when_the_worker_stops():
    batches = BatchesInFlight(1, lambda _: time.sleep(5), lambda result: None)
    stop = threading.Event()
    assert batches.take_slot(stop)
    batches.start(None)
    threading.Timer(0.3, stop.set).start()
    started = time.monotonic()
    assert not batches.take_slot(stop)
    assert time.monotonic() - started < 4


def test_overlapping_batches_are_refused_where_weights_are_taken_only_between_batches():
    with pytest.raises(ConfigError, match="generation.batches_in_flight"):
        check_batches_in_flight(2, "between_batches")
    check_batches_in_flight(1, "between_batches")
    check_batches_in_flight(3, "between_turns")


@pytest.fixture
def slow_rows_environment(tmp_path):
    folder = tmp_path / "envs"
    folder.mkdir()
    (folder / "slow_rows.py").write_text(SLOW_ROWS)
    host = build_environment(load_config(EnvironmentServiceConfig, overrides={
        "server.listen": "127.0.0.1:0", "server.metrics_port": None, "limits.step_timeout_s": 30.0,
        "environments": [{"name": "slow_rows", "environment": "slow_rows:SlowRows", "path": str(folder)}]})).start()
    try:
        yield host
    finally:
        host.stop()


@contextmanager
def overlapping_worker(tmp_path, environment, questions: tuple[str, ...]):
    """A worker overlapping two batches of two rows (leased in the order of `questions`, one episode each of at most
    one turn in the slow-rows environment) between a real buffer and reward service: (host, buffer address)."""
    model, _, _ = tiny_assets(tmp_path / "tiny", train_size=2, eval_size=2)
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"messages": [{"role": "user", "content": question}], "gt_answer": "1"}) + "\n"
                             for question in questions))
    reward = start_reward()
    buffer = start_buffer(train, tmp_path / "wal", **{
        "prompts.shuffle": False, "run_spec.num_generations": 2, "run_spec.max_new_tokens": 24,
        "run_spec.weight_updates": "between_turns",
        "run_spec.episodes.default": {"environment": "slow_rows", "reward": "environment"},
        "run_spec.episodes.max_turns": 1, "run_spec.episodes.max_turn_tokens": 8})
    config = rollout_config(model, buffer.address, reward.address, tmp_path, **{
        "generation.num_generations": 2, "generation.prompts_per_batch": 2, "generation.batches_in_flight": 2,
        "generation.max_new_tokens": 24, "environment.address": environment.address})
    host = build(config).start()
    try:
        yield host, buffer.address
    finally:
        host.stop()
        buffer.stop()
        reward.stop()


def test_the_worker_pushes_the_next_batch_while_a_slow_episode_of_the_one_before_plays(
        tmp_path, slow_rows_environment):
    # The first batch holds the slow row.
    with overlapping_worker(tmp_path, slow_rows_environment,
                            ("slow 1+0=", "1+0=", "2-1=", "3-2=", "4-3=", "5-4=")) as (host, buffer):
        wait_for(host.worker.drained.is_set, 180, "the worker to finish the data")
        assert host.worker.batches.limit == 2
        with BufferClient(buffer) as client:
            pulled = client.pull(0, 1, 1000, wait_seconds=0.5)
    sequences = {json.loads(g.group.prompt.messages_json)[-1]["content"]: g.group.sequence for g in pulled.groups}
    assert len(sequences) == 6
    # Scored and pushed in the order batches finished: the slow row's batch after the one leased behind it.
    assert sequences["slow 1+0="] > 2, sequences


def test_a_worker_asked_to_overlap_batches_between_batches_refuses_to_start(tmp_path):
    model, train, _ = tiny_assets(tmp_path / "tiny", train_size=2, eval_size=2)
    reward = start_reward()
    buffer = start_buffer(train, tmp_path / "wal", **{"run_spec.num_generations": 2, "run_spec.max_new_tokens": 8})
    config = rollout_config(model, buffer.address, reward.address, tmp_path, **{
        "generation.num_generations": 2, "generation.batches_in_flight": 2, "generation.max_new_tokens": 8})
    try:
        with pytest.raises(ConfigError, match="generation.batches_in_flight"):
            build(config)
    finally:
        buffer.stop()
        reward.stop()


def test_a_worker_stopped_with_two_batches_in_flight_finishes_and_pushes_both_and_leases_no_more(
        tmp_path, slow_rows_environment):
    # A slow row in each of the first two batches: both are still playing when the stop comes.
    questions = ("slow 1+0=", "1+0=", "slow 2-1=", "3-2=", "4-3=", "5-4=")
    with overlapping_worker(tmp_path, slow_rows_environment, questions) as (host, buffer):
        wait_for(lambda: host.worker.batches.playing == 2, 120, "two batches in flight")
        started = time.monotonic()
        host.stop(grace=20.0)
        stopping_took = time.monotonic() - started
        with BufferClient(buffer) as client:
            pulled = client.pull(0, 1, 1000, wait_seconds=0.5)
            # What the stopped worker never leased is the next worker's.
            after = [json.loads(p.messages_json)[-1]["content"] for p in client.lease("rollout-next", 10).prompts]
    pushed = sorted(json.loads(g.group.prompt.messages_json)[-1]["content"] for g in pulled.groups)
    # Both batches played to their end and were pushed, each group whole; no third batch was leased.
    assert pushed == sorted(questions[:4]), pushed
    assert all(len(g.group.trajectories) == 2 for g in pulled.groups)
    assert not host.worker.batches.playing and host.worker.error is None
    # The stop waited for the slow steps (4 s), not for its whole grace.
    assert stopping_took < 15, stopping_took
    assert after == list(questions[4:]), after
