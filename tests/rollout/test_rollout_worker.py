"""A real rollout worker (tiny model, transformers engine) between a real reward service and a real buffer."""

from __future__ import annotations

import argparse
import json
import logging
import time

import grpc
import numpy as np
import pytest
from stack import start_buffer, start_reward, tiny_assets

from zerobubble.common.clients.buffer import BufferClient
from zerobubble.common.codec import decode_array
from zerobubble.common.config import load_config
from zerobubble.common.data import DataSpec, load_data
from zerobubble.common.run_spec import RunSpecMismatch, model_identity
from zerobubble.rollout.app import build
from zerobubble.rollout.config import RolloutServiceConfig
from zerobubble.tooling.launcher.commands import register, up_config
from zerobubble.tooling.launcher.run import build_run_spec
from zerobubble.tooling.ports import free_port
from zerobubble.v1 import rollout_pb2, rollout_pb2_grpc

GENERATIONS = 4


def parse_up(*argv: str):
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["up", *argv])
# The buffer's run spec, which the services here must agree with.
RUN_SPEC = {"run_spec.num_generations": GENERATIONS, "run_spec.max_new_tokens": 8}


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return tiny_assets(tmp_path_factory.mktemp("tiny"), train_size=12, eval_size=4)


def rollout_config(model, buffer_address, reward_address, tmp_path, **overrides) -> RolloutServiceConfig:
    settings = {
        "server.listen": "127.0.0.1:0", "server.metrics_port": None, "server.grace_seconds": 0.5,
        "worker_id": "worker-a", "model.path": str(model), "trainer": None,
        "generation.num_generations": GENERATIONS, "generation.prompts_per_batch": 4,
        "buffer.address": buffer_address,
        "reward_service.address": reward_address, "reward_service.retry_seconds": 120,
        "backoff_max_seconds": 0.5, "lease_wait_seconds": 0.1, **overrides,
    }
    return load_config(RolloutServiceConfig, None, settings)


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_worker_turns_every_prompt_into_one_scored_group(assets, tmp_path):
    model, train, held_out = assets
    reward = start_reward()
    buffer = start_buffer(train, tmp_path / "wal", **RUN_SPEC)
    config = rollout_config(model, buffer.address, reward.address, tmp_path, **{
        "eval.datasets": {"heldout": str(held_out)}, "eval.samples_per_prompt": 2,
        "eval.output_dir": str(tmp_path / "eval"),
    })
    host = build(config).start()
    try:
        wait_for(host.worker.drained.is_set, 120, "the worker to finish the data")
        with BufferClient(buffer.address) as client:
            pulled = client.pull(0, 1, 1000, wait_seconds=0.5)
        prompt_ids = [g.group.prompt.prompt_id for g in pulled.groups]
        assert sorted(prompt_ids) == sorted(set(prompt_ids)) and len(prompt_ids) == 12
        for pulled_group in pulled.groups:
            group = pulled_group.group
            assert group.producer_id == "worker-a" and len(group.trajectories) == GENERATIONS
            prompt = decode_array(group.prompt_ids, "prompt_ids")
            assert prompt.size > 0
            for trajectory in group.trajectories:
                ids = decode_array(trajectory.response_ids, "response_ids")
                logprobs = decode_array(trajectory.behaviour_logprobs, "behaviour_logprobs")
                assert 0 < ids.size <= 8 and logprobs.shape == ids.shape and np.all(logprobs <= 0)
                # The spec's preset, GRPO, anneals from 1.0 towards 0.9 over the epoch.
                assert trajectory.policy_version == 0 and 0.9 <= trajectory.temperature <= 1.0
                assert trajectory.reward == (1.0 if trajectory.answer_ok else 0.0)
        summary = [json.loads(line) for line in (tmp_path / "eval" / "summary.jsonl").read_text().splitlines()]
        assert summary[0]["version"] == 0 and summary[0]["prompts"] == 4 and 0 <= summary[0]["pass@1"] <= 1
        answers = [json.loads(line) for line in (tmp_path / "eval" / "heldout" / "version-000000.jsonl").open()]
        assert len(answers) == 8
        # Each question's text and ground truth come once, with its first sample, as the held-out file has them.
        held = {row.prompt_id: row for row in load_data(DataSpec(path=held_out), field="held", default_split="test")}
        firsts = [a for a in answers if a["sample"] == 0]
        assert [a["prompt_id"] for a in firsts] == list(held)[:4]
        for answer in firsts:
            messages = json.loads(held[answer["prompt_id"]].messages_json)
            assert answer["question"] == messages[-1]["content"] and answer["gt_answer"] == held[
                answer["prompt_id"]].gt_answer
        assert not any("question" in a for a in answers if a["sample"] != 0)

        with grpc.insecure_channel(host.address) as channel:
            stub = rollout_pb2_grpc.RolloutServiceStub(channel)
            messages = json.dumps([{"role": "user", "content": "3+4="}])
            reply = stub.Generate(rollout_pb2.GenerateRequest(
                prompts=[messages], sampling=rollout_pb2.SamplingParams(n=3, temperature=1.0, max_new_tokens=5)),
                timeout=60)
            assert len(reply.completions) == 3
            assert all(0 < decode_array(c.token_ids, "token_ids").size <= 5 for c in reply.completions)
            with pytest.raises(grpc.RpcError) as refused:
                stub.Generate(rollout_pb2.GenerateRequest(prompts=["not json"]), timeout=30)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "prompts[0]" in refused.value.details()
            stub.Pause(rollout_pb2.PauseRequest(), timeout=5)
            status = stub.Status(rollout_pb2.RolloutStatusRequest(), timeout=5)
            assert status.paused and status.groups_pushed == 12 and status.worker_id == "worker-a"
            stub.Resume(rollout_pb2.ResumeRequest(), timeout=5)
            assert not stub.Status(rollout_pb2.RolloutStatusRequest(), timeout=5).paused
    finally:
        host.stop(0.5)
        buffer.stop(0.5)
        reward.stop(0.5)


def test_a_worker_refuses_a_run_spec_its_config_or_model_contradicts(assets, tmp_path):
    model, train, _ = assets
    buffer = start_buffer(train, tmp_path / "wal", **{"run_spec.num_generations": 8, "run_spec.model.vocab_size": 7})
    try:
        config = rollout_config(model, buffer.address, "127.0.0.1:1", tmp_path)
        with pytest.raises(RunSpecMismatch) as refused:
            build(config)
        message = str(refused.value)
        assert f"generation.num_generations is {GENERATIONS} but the run spec from the buffer at {buffer.address} " \
               f"has num_generations 8" in message
        assert f"model.path {model}: its vocab_size is {model_identity(model).vocab_size}" in message
        assert "has model.vocab_size 7" in message
        assert buffer.core.stats()["groups_in"] == 0 and not buffer.core.leases.leases
    finally:
        buffer.stop(0)


def test_the_grpo_preset_anneals_the_workers_temperature(assets, tmp_path):
    """`zerobubble up -a GRPO` puts annealing in the run spec; the worker samples the first epoch from 1.0 towards
    0.9 and the second at 0.9."""
    model, train, _ = assets
    up = up_config(parse_up("-a", "GRPO", "-g", str(GENERATIONS), "-mnt", "8"))
    spec = build_run_spec(up, model)
    assert spec.sampling.temperature_annealing
    reward = start_reward()
    buffer = start_buffer(train, tmp_path / "wal", **{"run_spec": spec.model_dump(mode="json"), "prompts.epochs": 2})
    host = build(rollout_config(model, buffer.address, reward.address, tmp_path)).start()
    try:
        wait_for(host.worker.drained.is_set, 120, "the worker to finish the data")
        with BufferClient(buffer.address) as client:
            groups = [g.group for g in client.pull(0, 1, 1000, wait_seconds=0.5).groups]
        temperatures = {epoch: [g.trajectories[0].temperature for g in groups if g.prompt.epoch == epoch]
                        for epoch in (0, 1)}
        assert len(temperatures[0]) == len(temperatures[1]) == 12
        assert max(temperatures[0]) == pytest.approx(1.0) and all(0.9 <= t <= 1.0 for t in temperatures[0])
        assert temperatures[1] == pytest.approx([0.9] * 12)
    finally:
        host.stop(0.5)
        buffer.stop(0)
        reward.stop(0)


def test_worker_waits_for_a_missing_reward_service_and_resumes(assets, tmp_path):
    model, train, _ = assets
    port = free_port()
    buffer = start_buffer(train, tmp_path / "wal", **{**RUN_SPEC,
                                                      "leases.timeout_seconds": 60})
    host = build(rollout_config(model, buffer.address, f"127.0.0.1:{port}", tmp_path)).start()
    reward = None
    try:
        time.sleep(3)
        assert host.worker.error is None and host.worker.groups_pushed == 0
        assert buffer.core.stats()["groups_in"] == 0
        reward = start_reward(**{"server.listen": f"127.0.0.1:{port}"})
        wait_for(host.worker.drained.is_set, 120, "the worker to finish once the reward service is back")
        assert buffer.core.stats()["groups_in"] == 12 and host.worker.error is None
    finally:
        host.stop(0.5)
        buffer.stop(0.5)
        if reward is not None:
            reward.stop(0.5)


def test_a_worker_stops_generating_once_training_has_finished_and_says_so(assets, tmp_path, caplog):
    """The trainer's last step reaches the buffer (SetPolicyVersion with training_finished): the worker makes no
    more groups a later run would only drop as stale, says so, and starts again when a trainer trains again."""
    model, train, _ = assets
    reward = start_reward()
    buffer = start_buffer(train, tmp_path / "wal", **RUN_SPEC)
    with BufferClient(buffer.address) as client:
        client.set_policy_version(0, training_finished=True)
        host = build(rollout_config(model, buffer.address, reward.address, tmp_path)).start()
        try:
            with caplog.at_level(logging.INFO, logger="zerobubble.rollout.worker"):
                wait_for(lambda: "training has finished" in caplog.text, 60, "the worker to say training finished")
                time.sleep(1.0)
                assert buffer.core.stats()["groups_in"] == 0 and host.worker.groups_pushed == 0
                client.set_policy_version(0)   # a resumed trainer
                wait_for(lambda: host.worker.groups_pushed > 0, 120, "the worker to generate again")
                assert "training goes on: generating again" in caplog.text
        finally:
            host.stop(0.5)
            buffer.stop(0)
            reward.stop(0)
