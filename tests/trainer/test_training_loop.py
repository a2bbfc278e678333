"""The trainer service on a real buffer: steps, versions, metrics, checkpoints with Commit, and resume."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from stack import start_buffer, tiny_assets
from transformers import AutoModelForCausalLM

from zerobubble.common.clients.buffer import BufferClient
from zerobubble.common.codec import encode_array
from zerobubble.common.config import load_config
from zerobubble.trainer.app import build
from zerobubble.trainer.collate import unusable
from zerobubble.trainer.config import TrainerServiceConfig
from zerobubble.trainer.figures import BY_NAME
from zerobubble.v1 import common_pb2

GENERATIONS = 4
# The buffer's run spec, which the services here must agree with.
RUN_SPEC = {"run_spec.num_generations": GENERATIONS, "run_spec.max_new_tokens": 8}
PROMPTS = 12
GROUPS_PER_STEP = 2


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return tiny_assets(tmp_path_factory.mktemp("tiny"), train_size=PROMPTS, eval_size=2)


def fill(buffer_address: str, prompts: int = PROMPTS, poison=None) -> None:
    """Lease every prompt and push a group for each, with mixed rewards so every group has a signal;
    `poison(groups)` may spoil some first."""
    rng = np.random.default_rng(0)
    with BufferClient(buffer_address) as client:
        lease = client.lease("producer", prompts)
        groups = []
        for sequence, prompt in enumerate(lease.prompts):
            group = common_pb2.ExperienceGroup(
                prompt=prompt, prompt_ids=encode_array(rng.integers(3, 250, size=6, dtype=np.int32)),
                producer_id="producer", sequence=sequence, lease_id=lease.lease_id)
            for i in range(GENERATIONS):
                length = int(rng.integers(2, 8))
                group.trajectories.add(
                    response_ids=encode_array(rng.integers(3, 250, size=length, dtype=np.int32)),
                    behaviour_logprobs=encode_array(np.full(length, -5.0, dtype=np.float32)),
                    finish_reason=common_pb2.FINISH_REASON_STOP, reward=float(i % 2), answer_ok=bool(i % 2),
                    format_ok=True, policy_version=0, temperature=0.8)
            groups.append(group)
        if poison is not None:
            poison(groups)
        acks = list(client.push(groups))
        assert all(ack.stored for ack in acks)
        client.complete(lease.lease_id)


def trainer_config(model, buffer_address, run_dir, **overrides) -> TrainerServiceConfig:
    settings = {
        "server.listen": "127.0.0.1:0", "server.metrics_port": None, "server.grace_seconds": 0.5,
        "model": str(model), "run_dir": str(run_dir), "buffer.address": buffer_address, "weight_sync": None,
        "batch.groups_per_step": GROUPS_PER_STEP, "batch.micro_batch_samples": 3, "batch.max_new_tokens": 8,
        "batch.pull_wait_seconds": 0.5, "strategy.optim.lr": 1e-3, **overrides,
    }
    return load_config(TrainerServiceConfig, None, settings)


def run_trainer(config: TrainerServiceConfig) -> int:
    return build(config).start().run_until_signal()


def rows(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_trainer_steps_checkpoints_commits_and_resumes_without_losing_a_group(assets, tmp_path):
    model, train, _ = assets
    buffer = start_buffer(train, tmp_path / "wal", **RUN_SPEC)
    run_dir = tmp_path / "run"
    try:
        fill(buffer.address)
        # The first run "dies" after step 3, its last checkpoint (and Commit) at step 2.
        first = trainer_config(model, buffer.address, run_dir, max_steps=3,
                               **{"checkpoint.interval_steps": 2, "checkpoint.at_end": False})
        assert run_trainer(first) == 0
        assert buffer.core.training_finished, "the last step tells the buffer: workers stop generating"
        trained = rows(run_dir)
        assert [r["step"] for r in trained] == [1, 2, 3]
        assert [r["policy_version"] for r in trained] == [1, 2, 3]
        for row in trained:
            assert row["samples"] == GROUPS_PER_STEP * GENERATIONS
            assert row["answer_accuracy"] == pytest.approx(0.5)
            assert row["staleness_mean"] == row["step"] - 1
            assert np.isfinite(row["loss"]) and row["grad_norm"] > 0
            # Every figure the step wrote is a row of the one table (services/trainer/figures.py).
            assert {key for key in row if key not in ("step", "policy_version", "time", "groups")} <= set(BY_NAME)
        assert buffer.core.stats()["policy_version"] == 3
        checkpoint = run_dir / "checkpoints" / "step-000002"
        assert AutoModelForCausalLM.from_pretrained(checkpoint) is not None

        # Resumed from step 2: the buffer re-delivers step 3's groups; the data ends at step 12 / 2 = 6.
        second = trainer_config(model, buffer.address, run_dir, resume=True, **{"checkpoint.interval_steps": 2})
        assert run_trainer(second) == 0
        resumed = rows(run_dir)[3:]
        assert [r["step"] for r in resumed] == [3, 4, 5, 6]
        assert sum(r["samples"] for r in resumed) + 2 * GROUPS_PER_STEP * GENERATIONS == PROMPTS * GENERATIONS
        assert (run_dir / "checkpoints" / "step-000006").is_dir()
        assert buffer.core.stats()["end_of_data"]
    finally:
        buffer.stop(0.5)


def test_an_unusable_group_is_skipped_and_nothing_untrained_is_committed(assets, tmp_path):
    model, train, _ = assets
    # Six prompts, steps of two groups: the third group is refused, the sixth is left over at the end.
    six = tmp_path / "six.jsonl"
    six.write_text("".join(train.read_text().splitlines(keepends=True)[:6]))
    vocab = AutoModelForCausalLM.from_pretrained(model).config.vocab_size

    def out_of_vocabulary(groups):
        spoiled = groups[2].trajectories[1]
        spoiled.response_ids.CopyFrom(encode_array(np.full(3, vocab + 5, dtype=np.int32)))
        spoiled.behaviour_logprobs.CopyFrom(encode_array(np.full(3, -1.0, dtype=np.float32)))

    # A buffer that is not told the vocabulary size lets the id through: the trainer must skip the group (an
    # IndexError in the embedding otherwise) and count it.
    buffer = start_buffer(six, tmp_path / "wal", **RUN_SPEC)
    run_dir = tmp_path / "run"
    try:
        fill(buffer.address, prompts=6, poison=out_of_vocabulary)
        host = build(trainer_config(model, buffer.address, run_dir)).start()
        assert host.run_until_signal() == 0
        assert [r["step"] for r in rows(run_dir)] == [1, 2]
        assert host.registry.get_sample_value("zerobubble_trainer_groups_refused_total") == 1
        store = buffer.core.store
        assert store.committed == 5, "the refused group is passed over, the left-over one never committed"
        assert list(store.delivered) == [6] and not store.unacked
    finally:
        buffer.stop(0.5)


@pytest.mark.parametrize("prefetch", [True, False])
def test_with_prefetch_the_next_steps_groups_are_pulled_while_a_step_trains(assets, tmp_path, prefetch):
    model, train, _ = assets
    buffer = start_buffer(train, tmp_path / "wal", **RUN_SPEC)
    run_dir = tmp_path / "run"
    try:
        fill(buffer.address)
        host = build(trainer_config(model, buffer.address, run_dir, max_steps=3, **{"batch.prefetch": prefetch}))
        update, delivered = host.loop.update, []

        def watched(batch, version):
            """Groups the buffer has delivered when a step's update ends. With prefetch the next step's pull runs
            beside the update, so the update waits (boundedly) for it; without, nothing is pulled meanwhile."""
            step = len(delivered) + 1
            next_step_pulled = min(step + 1, 3) * GROUPS_PER_STEP
            deadline = time.monotonic() + 30
            while prefetch and buffer.core.stats()["groups_out"] < next_step_pulled and time.monotonic() < deadline:
                time.sleep(0.01)
            figures = update(batch, version)
            delivered.append(buffer.core.stats()["groups_out"])
            return figures

        host.loop.update = watched
        assert host.start().run_until_signal() == 0
        # No pull for a step past max_steps: the last step's update sees nothing more delivered.
        one, two, three = GROUPS_PER_STEP, 2 * GROUPS_PER_STEP, 3 * GROUPS_PER_STEP
        assert delivered == ([two, three, three] if prefetch else [one, two, three])
        for row in rows(run_dir):
            parts = row["collate_seconds"] + row["update_seconds"] + row["publish_seconds"]
            assert min(row["pull_wait_seconds"], row["collate_seconds"], row["update_seconds"]) >= 0
            assert parts <= row["step_seconds"]
        # What was trained is committed; nothing was pulled beyond it.
        assert buffer.core.store.committed == three and not buffer.core.store.unacked
    finally:
        buffer.stop(0.5)


def healthy_group() -> common_pb2.ExperienceGroup:
    group = common_pb2.ExperienceGroup(prompt_ids=encode_array(np.arange(3, 9, dtype=np.int32)))
    group.trajectories.add(response_ids=encode_array(np.arange(3, 7, dtype=np.int32)),
                           behaviour_logprobs=encode_array(np.full(4, -1.0, dtype=np.float32)),
                           finish_reason=common_pb2.FINISH_REASON_STOP, reward=1.0, temperature=1.0)
    return group


@pytest.mark.parametrize(("spoil", "field"), [
    (lambda t: setattr(t, "reward", float("nan")), "trajectories[0].reward"),
    (lambda t: setattr(t, "reward", float("-inf")), "trajectories[0].reward"),
    (lambda t: setattr(t, "temperature", 0.0), "trajectories[0].temperature"),
    (lambda t: t.behaviour_logprobs.CopyFrom(encode_array(np.array([-1, np.nan, -1, -1], dtype=np.float32))),
     "trajectories[0].behaviour_logprobs"),
    (lambda t: t.response_ids.CopyFrom(encode_array(np.array([3, 4, 5, -1], dtype=np.int32))),
     "trajectories[0].response_ids"),
])
def test_the_trainer_refuses_what_would_poison_a_step(spoil, field):
    assert unusable(healthy_group(), vocab_size=16) == ""
    group = healthy_group()
    spoil(group.trajectories[0])
    assert unusable(group, vocab_size=16).startswith(f"{field}:")
    assert unusable(healthy_group(), vocab_size=8).startswith("prompt_ids:"), "ids at or above the vocabulary"
