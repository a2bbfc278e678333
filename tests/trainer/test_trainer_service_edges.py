"""The trainer service's RPCs fed odd requests and asked at awkward moments, on a real buffer: no UNKNOWN, a
SaveCheckpoint that answers while the trainer waits for data, and a checkpoint taken then that loses no group."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import yaml
from stack import start_buffer, tiny_assets
from sync_helpers import trainer_service

from zerobubble.common.clients.buffer import BufferClient
from zerobubble.common.clients.trainer import TrainerClient
from zerobubble.common.codec import encode_array
from zerobubble.common.config import load_config
from zerobubble.common.run_spec import RunSpecMismatch
from zerobubble.trainer.app import build
from zerobubble.trainer.config import TrainerServiceConfig
from zerobubble.v1 import common_pb2

GENERATIONS = 2
# The buffer's run spec, which the services here must agree with.
RUN_SPEC = {"run_spec.num_generations": GENERATIONS, "run_spec.max_new_tokens": 4}
# Far beyond what any step or save of the tiny model takes: a call that does not answer within it is stalled.
DEADLINE_S = 60.0


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return tiny_assets(tmp_path_factory.mktemp("tiny"), train_size=6, eval_size=2)


def push_groups(buffer_address: str, count: int, producer: str) -> None:
    """Lease `count` prompts and push a group of GENERATIONS scored samples for each."""
    rng = np.random.default_rng(len(producer))
    with BufferClient(buffer_address) as client:
        lease = client.lease(producer, count)
        groups = []
        for sequence, prompt in enumerate(lease.prompts):
            group = common_pb2.ExperienceGroup(
                prompt=prompt, prompt_ids=encode_array(rng.integers(3, 250, size=5, dtype=np.int32)),
                producer_id=producer, sequence=sequence, lease_id=lease.lease_id)
            for i in range(GENERATIONS):
                group.trajectories.add(
                    response_ids=encode_array(rng.integers(3, 250, size=4, dtype=np.int32)),
                    behaviour_logprobs=encode_array(np.full(4, -5.0, dtype=np.float32)),
                    finish_reason=common_pb2.FINISH_REASON_STOP, reward=float(i % 2), answer_ok=bool(i % 2),
                    format_ok=True, policy_version=0, temperature=1.0)
            groups.append(group)
        assert all(ack.stored for ack in client.push(groups))
        client.complete(lease.lease_id)


def start_trainer(model: Path, buffer_address: str, run_dir: Path, **overrides):
    settings = {
        "server.listen": "127.0.0.1:0", "server.metrics_port": None, "server.grace_seconds": 0.5,
        "model": str(model), "run_dir": str(run_dir), "buffer.address": buffer_address, "weight_sync": None,
        "batch.groups_per_step": 2, "batch.micro_batch_samples": 4, "batch.max_new_tokens": 4,
        "batch.pull_wait_seconds": 0.5, "checkpoint.interval_steps": 100, "checkpoint.at_end": False,
        **overrides,
    }
    return build(load_config(TrainerServiceConfig, None, settings)).start()


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_trainer_without_weight_sync_answers_status_and_refuses_sync_calls(assets, tmp_path):
    model, train, _ = assets
    buffer = start_buffer(train, tmp_path / "wal", **RUN_SPEC)
    trainer = start_trainer(model, buffer.address, tmp_path / "run")
    try:
        with TrainerClient(trainer.address) as client:
            status = client.status(timeout=DEADLINE_S)
            assert (status.step, status.policy_version, status.sync_members, status.synced_version) == (0, 0, 0, 0)
            with pytest.raises(grpc.RpcError) as join:
                client.join("w1", "cpu", timeout=DEADLINE_S)
            assert join.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "weight_sync" in join.value.details()
            with pytest.raises(grpc.RpcError) as watch:
                next(iter(client.watch("w1")))
            assert watch.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            with pytest.raises(grpc.RpcError) as long_tag:
                client.save_checkpoint("t" * 100_000, timeout=DEADLINE_S)
            assert long_tag.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert long_tag.value.details().startswith("tag:") and len(long_tag.value.details()) < 1000
            assert client.status(timeout=DEADLINE_S).step == 0
    finally:
        trainer.stop(0.5)
        buffer.stop(0.5)


def test_save_checkpoint_answers_while_the_trainer_waits_for_data_and_the_held_groups_come_back(assets, tmp_path):
    model, train, _ = assets
    buffer = start_buffer(train, tmp_path / "wal", **RUN_SPEC)
    run_dir = tmp_path / "run"
    trainer = start_trainer(model, buffer.address, run_dir)
    try:
        with TrainerClient(trainer.address) as client:
            # The buffer has nothing: the trainer waits for the first group of its first step.
            empty = client.save_checkpoint("waiting", timeout=DEADLINE_S)
            assert empty.step == 0 and Path(empty.path).is_dir()

            # One group of the two the step needs: the trainer holds it and waits for the other.
            push_groups(buffer.address, 1, "first")
            wait_for(lambda: buffer.core.stats()["queued_groups"] == 0, "the trainer to pull the group")
            held = client.save_checkpoint("holding", timeout=DEADLINE_S)
            assert held.step == 0
            state = json.loads((Path(held.path) / "trainer_state.json").read_text())
            assert state["extra"]["tag"] == "holding"
        trainer.stop(0.5)

        # A trainer resumed from that checkpoint gets the held group again, and trains it with the next one.
        trainer = start_trainer(model, buffer.address, run_dir, resume=True)
        push_groups(buffer.address, 1, "second")
        with TrainerClient(trainer.address) as client:
            wait_for(lambda: client.status(timeout=DEADLINE_S).step == 1, "a step of the held and the new group")
            after = client.save_checkpoint("trained", timeout=DEADLINE_S)
        assert after.step == 1
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert [(row["step"], row["samples"]) for row in rows] == [(1, 2 * GENERATIONS)]
    finally:
        trainer.stop(0.5)
        buffer.stop(0.5)


def test_join_refuses_a_device_that_is_not_one():
    with trainer_service() as trainer, TrainerClient(trainer.address) as client:
        for device in ("toaster", "cuda:zero"):
            with pytest.raises(grpc.RpcError) as refused:
                client.join("w1", device, timeout=DEADLINE_S)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert refused.value.details().startswith("device:")
        assert trainer.broadcaster.members == []
        assert client.join("w1", "cpu", timeout=DEADLINE_S).rank == -1


def test_a_trainer_refuses_a_run_spec_its_config_contradicts(assets, tmp_path):
    model, train, _ = assets
    buffer = start_buffer(train, tmp_path / "wal", **RUN_SPEC, **{"run_spec.algorithm": "DAPO"})
    try:
        with pytest.raises(RunSpecMismatch) as refused:
            start_trainer(model, buffer.address, tmp_path / "run", **{"batch.max_new_tokens": 16})
        message = str(refused.value)
        assert f"algorithm.preset is 'GRPO' but the run spec from the buffer at {buffer.address} has algorithm " \
               "'DAPO'" in message
        assert "batch.max_new_tokens is 16" in message and "has max_new_tokens 4" in message
        # Refused before it trained or told the buffer anything.
        assert not (tmp_path / "run" / "metrics.jsonl").exists() and buffer.core.policy_version == 0
    finally:
        buffer.stop(0.5)


@pytest.mark.slow  # a whole-service restart, stop or run: make test runs it, make test-fast leaves it out
@pytest.mark.parametrize("weight_sync", [None, {}], ids=["alone", "with weight sync"])
def test_sigterm_stops_a_serving_trainer_with_its_checkpoint_and_says_the_run_is_not_over(assets, tmp_path,
                                                                                           weight_sync):
    # A trainer stopped mid-run by a signal (a `docker stop`, a stray kill) is not a finished run: it says so in
    # its log and exit code, and its last checkpoint lets a restart go on from the step it reached.
    model, train, _ = assets
    buffer = start_buffer(train, tmp_path / "wal", **RUN_SPEC)
    config = {"server": {"listen": "127.0.0.1:0", "metrics_port": None, "grace_seconds": 10.0},
              "model": str(model), "run_dir": str(tmp_path / "run"), "buffer": {"address": buffer.address},
              "weight_sync": weight_sync, "torch_threads": 1,
              "batch": {"groups_per_step": 2, "micro_batch_samples": 4, "max_new_tokens": 4},
              "checkpoint": {"interval_steps": 100}}
    (tmp_path / "trainer.yaml").write_text(yaml.safe_dump(config))
    log = tmp_path / "trainer.log"
    with open(log, "w") as stderr:
        trainer = subprocess.Popen([sys.executable, "-m", "zerobubble", "serve", "trainer", "--config",
                                    str(tmp_path / "trainer.yaml")], stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        line = trainer.stdout.readline()
        assert line, log.read_text()
        with TrainerClient(json.loads(line)["address"]) as client:
            push_groups(buffer.address, 2, "first")
            wait_for(lambda: client.status(timeout=DEADLINE_S).step == 1, "the first step")
            assert client.status(timeout=DEADLINE_S).state == "training"
        started = time.monotonic()
        trainer.send_signal(signal.SIGTERM)
        code = trainer.wait(60)
        seconds = time.monotonic() - started
        assert code == 128 + signal.SIGTERM, log.read_text()
        assert seconds < 10.0 + 2.0, f"exit took {seconds:.1f} s with a grace of 10 s"
        assert "training stopped by SIGTERM at step 1" in log.read_text()
        assert "training finished" not in log.read_text()
        saved = sorted((tmp_path / "run" / "checkpoints").glob("*/trainer_state.json"))
        assert saved and json.loads(saved[-1].read_text())["step"] == 1, log.read_text()
    finally:
        trainer.kill()
        trainer.wait()
        buffer.stop(0.5)
