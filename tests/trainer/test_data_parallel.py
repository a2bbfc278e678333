"""The trainer as two gloo ranks under torch's elastic agent, against a real buffer: the same weights as one
process on the same data, and every group trained exactly once across a kill -9 of a rank and a resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from stack import start_buffer, tiny_assets
from strategy_helpers import run_ranks

from zerobubble.common.clients.buffer import BufferClient
from zerobubble.common.codec import encode_array
from zerobubble.common.config import ConfigError, load_config
from zerobubble.tooling.launcher.data_parallel import agent_command
from zerobubble.trainer.app import build
from zerobubble.trainer.config import BatchConfig, TrainerServiceConfig
from zerobubble.trainer.figures import combine_ranks
from zerobubble.trainer.loop import group_name
from zerobubble.v1 import common_pb2

GENERATIONS = 4
PROMPTS = 12
RANKS = 2
RUN_TIMEOUT_S = 180


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return tiny_assets(tmp_path_factory.mktemp("tiny"), train_size=PROMPTS, eval_size=2)


def fill(buffer_address: str, prompts: int, producer: str) -> list[str]:
    """Lease `prompts` prompts and push a group for each (mixed rewards, so every group has a signal); the same
    producer gives the same groups. Returns the groups' names as metrics.jsonl gives them."""
    rng = np.random.default_rng(sum(map(ord, producer)))
    with BufferClient(buffer_address) as client:
        lease = client.lease(producer, prompts)
        groups = []
        for sequence, prompt in enumerate(lease.prompts):
            group = common_pb2.ExperienceGroup(
                prompt=prompt, prompt_ids=encode_array(rng.integers(3, 250, size=6, dtype=np.int32)),
                producer_id=producer, sequence=sequence, lease_id=lease.lease_id)
            for i in range(GENERATIONS):
                length = int(rng.integers(2, 8))
                group.trajectories.add(
                    response_ids=encode_array(rng.integers(3, 250, size=length, dtype=np.int32)),
                    behaviour_logprobs=encode_array(np.full(length, -5.0, dtype=np.float32)),
                    finish_reason=common_pb2.FINISH_REASON_STOP, reward=float((i + sequence) % 2),
                    answer_ok=bool(i % 2), format_ok=True, policy_version=0, temperature=0.8)
            groups.append(group)
        assert all(ack.stored for ack in client.push(groups))
        client.complete(lease.lease_id)
    return [group_name(group) for group in groups]


def trainer_config(model: Path, buffer_address: str, run_dir: Path, **overrides) -> TrainerServiceConfig:
    settings = {
        "server.listen": "127.0.0.1:0", "server.metrics_port": None, "server.grace_seconds": 0.5,
        "model": str(model), "run_dir": str(run_dir), "buffer.address": buffer_address, "weight_sync": None,
        "batch.micro_batch_samples": 3, "batch.max_new_tokens": 8, "batch.pull_wait_seconds": 0.5,
        "strategy.device": "cpu", "strategy.optim.lr": 1e-2, "strategy.optim.eps": 1e-4, "torch_threads": 1,
        **overrides,
    }
    return load_config(TrainerServiceConfig, None, settings)


def start_ranks(config: TrainerServiceConfig, directory: Path) -> subprocess.Popen:
    """The trainer as RANKS processes under the agent `zerobubble up` uses; its address line is read."""
    path = directory / "trainer.json"
    path.write_text(config.model_dump_json())
    agent = subprocess.Popen(agent_command(RANKS, ["--config", str(path)]), stdout=subprocess.PIPE,
                             stderr=open(directory / "trainer.log", "ab"), start_new_session=True)
    ready = json.loads(agent.stdout.readline() or "{}")
    assert ready.get("service") == "trainer", (directory / "trainer.log").read_text()[-3000:]
    return agent


def finish(agent: subprocess.Popen, directory: Path) -> int:
    try:
        return agent.wait(RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(agent.pid, signal.SIGKILL)
        pytest.fail("the trainer did not finish:\n" + (directory / "trainer.log").read_text()[-3000:])


def steps(run_dir: Path) -> list[dict]:
    """The final lineage: a resumed trainer writes the steps after its checkpoint again, replacing the old rows."""
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [row for _, row in sorted({row["step"]: row for row in rows}.items())]


def rank_of(pid: int) -> int:
    environ = dict(item.split("=", 1) for item in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in item)
    return int(environ["RANK"])


def children(pid: int) -> list[int]:
    return [int(child) for task in Path(f"/proc/{pid}/task").iterdir()
            for child in (task / "children").read_text().split()]


def wait_for(predicate, what: str, timeout: float = RUN_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    latest = run_dir / "checkpoints" / (run_dir / "checkpoints" / "latest").read_text().strip()
    return load_file(latest / "model.safetensors")


@pytest.mark.slow
def test_two_ranks_train_the_weights_one_process_trains(assets, tmp_path):
    model, train, _ = assets
    settings = {"batch.groups_per_step": 4, "max_steps": 2}
    trained = {}
    for ranks in (1, RANKS):
        buffer = start_buffer(train, tmp_path / f"wal-{ranks}", **{"run_spec.num_generations": GENERATIONS,
                                                   "run_spec.max_new_tokens": 8})
        run_dir = tmp_path / f"run-{ranks}"
        try:
            # The same groups in the same order: each step of both runs takes the same four groups.
            fill(buffer.address, 8, "producer")
            config = trainer_config(model, buffer.address, run_dir, **settings)
            if ranks == 1:
                assert build(config).start().run_until_signal() == 0
            else:
                (tmp_path / "two").mkdir()
                assert finish(start_ranks(config, tmp_path / "two"), tmp_path / "two") == 0
        finally:
            buffer.stop(0.5)
        trained[ranks] = steps(run_dir), final_weights(run_dir)

    (one_steps, one), (two_steps, two) = trained[1], trained[RANKS]
    assert [sorted(r["groups"]) for r in two_steps] == [sorted(r["groups"]) for r in one_steps]
    assert [r["samples"] for r in two_steps] == [r["samples"] for r in one_steps] == [4 * GENERATIONS] * 2
    for row_one, row_two in zip(one_steps, two_steps, strict=True):
        for name in ("loss", "grad_norm", "reward_mean", "answer_accuracy", "tokens"):
            assert row_two[name] == pytest.approx(row_one[name], rel=1e-4, abs=1e-6), name
    start = load_file(model / "model.safetensors")
    assert one.keys() == two.keys()
    assert any(not torch.equal(one[name], start[name]) for name in one), "the weights moved"
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.slow
def test_a_killed_two_rank_trainer_resumes_and_trains_every_group_once(assets, tmp_path):
    model, train, _ = assets
    buffer = start_buffer(train, tmp_path / "wal", **{"run_spec.num_generations": GENERATIONS,
                                                   "run_spec.max_new_tokens": 8})
    run_dir = tmp_path / "run"
    # One group per rank and step, a checkpoint (and Commit) after every step.
    config = trainer_config(model, buffer.address, run_dir, **{
        "batch.groups_per_step": RANKS, "checkpoint.interval_steps": 1, "checkpoint.keep": 10})
    try:
        pushed = fill(buffer.address, PROMPTS // 2, "first")
        agent = start_ranks(config, tmp_path)
        # Three steps trained, then the ranks wait for data: rank 1 dies there, and the agent ends the trainer.
        wait_for(lambda: len(steps(run_dir)) == 3, "three steps")
        time.sleep(1.0)
        rank1 = next(pid for pid in children(agent.pid) if rank_of(pid) == 1)
        os.kill(rank1, signal.SIGKILL)
        assert finish(agent, tmp_path) != 0
        # Each checkpoint commits what both ranks trained: step k's deliveries are 2k-1 and 2k, one per rank, so
        # the newest delivery trained is 2k whichever rank received it.
        for step in (1, 2, 3):
            state = json.loads((run_dir / "checkpoints" / f"step-{step:06d}" / "trainer_state.json").read_text())
            assert state["buffer_delivery"] == 2 * step
        first_run = [group for row in steps(run_dir) for group in row["groups"]]

        pushed += fill(buffer.address, PROMPTS - PROMPTS // 2, "second")
        resumed = start_ranks(config.model_copy(update={"resume": True}), tmp_path)
        assert finish(resumed, tmp_path) == 0
    finally:
        buffer.stop(0.5)

    lineage = steps(run_dir)
    assert [row["step"] for row in lineage] == list(range(1, PROMPTS // RANKS + 1))
    trained = [group for row in lineage for group in row["groups"]]
    assert len(set(pushed)) == PROMPTS and sorted(trained) == sorted(pushed), "every group once, none twice"
    assert set(first_run) <= set(trained)
    assert buffer.core.stats()["end_of_data"] and buffer.core.store.committed == buffer.core.store.next_delivery - 1


def checkpoint_rank(rank: int, config: TrainerServiceConfig, delivered: list[int]) -> None:
    """One rank of a trainer that has trained up to delivery `delivered[rank]` takes a checkpoint."""
    from prometheus_client import CollectorRegistry

    from zerobubble.common.clients.buffer import BufferClient
    from zerobubble.trainer.loop import TrainingLoop
    from zerobubble.trainer.metrics import TrainerMetrics
    from zerobubble.trainer.strategies import make_strategy
    from zerobubble.trainer.update import PolicyUpdate, UpdateSettings

    strategy = make_strategy(config.strategy, config.model)
    update = PolicyUpdate(strategy, config.algorithm, UpdateSettings(1, 4, 8))
    with BufferClient(config.buffer) as buffer:
        loop = TrainingLoop(config, strategy, update, buffer, pad_id=0, metrics=TrainerMetrics(CollectorRegistry()))
        loop.delivered = delivered[rank]
        loop.save_checkpoint()
    strategy.close()


def test_a_checkpoint_commits_the_newest_delivery_of_any_rank(assets, tmp_path):
    """Rank 1 trained the newest delivery (5), rank 0 older ones (up to 3): the commit, made by rank 0, and the
    checkpoint cover 5, or a resume would train rank 1's groups again."""
    model, train, _ = assets
    buffer = start_buffer(train, tmp_path / "wal", **{"run_spec.num_generations": GENERATIONS,
                                                   "run_spec.max_new_tokens": 8})
    run_dir = tmp_path / "run"
    try:
        fill(buffer.address, 6, "producer")
        with BufferClient(buffer.address) as client:
            assert [g.delivery for g in client.pull(0, 1, 5).groups] == [1, 2, 3, 4, 5]
        run_ranks(checkpoint_rank, RANKS, trainer_config(model, buffer.address, run_dir), [3, 5])
        assert buffer.core.store.committed == 5 and list(buffer.core.store.delivered) == []
    finally:
        buffer.stop(0.5)
    state = json.loads((run_dir / "checkpoints" / "step-000000" / "trainer_state.json").read_text())
    assert state["buffer_delivery"] == 5


def test_the_step_splits_evenly_over_the_ranks():
    batch = BatchConfig(groups_per_step=8, mini_batch_groups=4)
    assert batch.groups_per_rank(2) == 4 and batch.groups_per_rank(4) == 2
    with pytest.raises(ConfigError, match="batch.groups_per_step"):
        batch.groups_per_rank(3)
    with pytest.raises(ConfigError, match="batch.mini_batch_groups"):
        BatchConfig(groups_per_step=8, mini_batch_groups=2).groups_per_rank(4)


def test_rank_figures_combine_into_the_steps():
    ranks = [{"samples": 4.0, "tokens": 40.0, "loss": 0.25, "grad_norm": 2.0, "reward_mean": 1.0,
              "response_length_max": 7.0},
             {"samples": 12.0, "tokens": 60.0, "loss": 0.5, "grad_norm": 2.0, "reward_mean": 0.0,
              "response_length_max": 9.0}]
    step = combine_ranks(ranks)
    assert step == {"samples": 16.0, "tokens": 100.0, "loss": 0.75, "grad_norm": 2.0, "reward_mean": 0.25,
                    "response_length_max": 9.0}
