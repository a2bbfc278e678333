"""A whole run on loopback that loses a rollout worker and the buffer to kill -9 and still finishes: every
prompt is trained on once (or accounted for), and no group the buffer acknowledged is lost."""

from __future__ import annotations

import time

import grpc
from e2e_helpers import (
    GENERATIONS,
    GROUPS_PER_STEP,
    RunFigures,
    buffer_tree,
    loaded_versions,
    log_tail,
    metrics_rows,
    reward_tree,
    rollout_tree,
    start_all,
    stop_all,
    trainer_tree,
    wait_for,
    write_config,
)
from stack import tiny_assets

from zerobubble.common.clients.buffer import BufferClient
from zerobubble.tooling.launcher.processes import ServiceProcess
from zerobubble.tooling.ports import free_port
from zerobubble.v1 import rollout_pb2, rollout_pb2_grpc

PROMPTS = 48
STEPS = PROMPTS // GROUPS_PER_STEP


def rollout_control(address: str, method: str) -> None:
    """Pause or Resume a rollout worker over its RPC."""
    with grpc.insecure_channel(address) as channel:
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)
        request = rollout_pb2.PauseRequest() if method == "Pause" else rollout_pb2.ResumeRequest()
        getattr(stub, method)(request, timeout=10)


def queue_settled(buffer_address: str, seconds: float = 1.5) -> bool:
    """Nothing queued, and nothing arrived for `seconds`: the trainer is waiting in a pull."""
    with BufferClient(buffer_address) as client:
        before = client.stats()
        time.sleep(seconds)
        after = client.stats()
    return after.queued_groups == 0 and after.groups_in == before.groups_in


def test_run_survives_kill_9_of_a_rollout_worker_and_of_the_buffer(tmp_path):
    model, train, _ = tiny_assets(tmp_path / "assets", train_size=PROMPTS, eval_size=4)
    run_dir, logs = tmp_path / "run", tmp_path / "run" / "logs"
    address = {name: f"127.0.0.1:{free_port()}" for name in ("reward", "buffer", "trainer", "rollout-0", "rollout-1")}
    # A small queue keeps the workers in step with the trainer, so the kills land mid-run; short leases
    # bring back the prompts the killed worker held.
    buffer_config = write_config(run_dir, "buffer", "buffer", buffer_tree(
        address["buffer"], train, run_dir / "buffer-wal", leases={"timeout_seconds": 10.0},
        capacity={"max_groups": 8}))
    configs = {
        "reward": write_config(run_dir, "reward", "reward", reward_tree(address["reward"])),
        "buffer": buffer_config,
        "trainer": write_config(run_dir, "trainer", "trainer", trainer_tree(
            address["trainer"], model, run_dir / "trainer", address["buffer"], "127.0.0.1")),
    }
    for i in range(2):
        name = f"rollout-{i}"
        configs[name] = write_config(run_dir, name, "rollout", rollout_tree(
            address[name], name, model, buffer=address["buffer"], reward=address["reward"],
            trainer=address["trainer"], seed=1000 * i))
    service = {"reward": "reward", "buffer": "buffer", "trainer": "trainer"}
    processes = {name: ServiceProcess(name, service.get(name, "rollout"), path, logs) for name, path in configs.items()}
    first = [processes[n] for n in ("reward", "buffer", "trainer", "rollout-0")]
    running = list(first)
    trainer = processes["trainer"]
    try:
        start_all(first)
        wait_for(lambda: len(metrics_rows(run_dir)) >= 2, 90, "two training steps", running)

        processes["rollout-0"].kill()
        running.remove(processes["rollout-0"])
        # The new worker pauses at once and the trainer empties the queue, so the trainer is inside a pull (a
        # stream, which the client does not retry) when the buffer dies; the worker resumes while it is down.
        running.append(processes["rollout-1"].start(60))
        rollout_control(address["rollout-1"], "Pause")
        wait_for(lambda: queue_settled(address["buffer"]), 60, "the trainer to empty the queue", running)
        steps_before = len(metrics_rows(run_dir))
        assert steps_before < STEPS - 2, "the run ended before the buffer could be killed mid-run"

        processes["buffer"].kill()
        running.remove(processes["buffer"])
        rollout_control(address["rollout-1"], "Resume")
        wait_for(lambda: "pull: UNAVAILABLE" in trainer.log_path.read_text(errors="replace"), 30,
                 "the trainer to retry its pull", running)
        buffer = ServiceProcess("buffer", "buffer", buffer_config, logs)
        running.append(buffer.start(60))
        assert buffer.address == address["buffer"]

        wait_for(lambda: trainer.exit_code is not None, 120, "the trainer to finish",
                 [p for p in running if p is not trainer])
        assert trainer.exit_code == 0, log_tail(trainer)
        with BufferClient(buffer.address) as client:
            stats = client.stats()
    finally:
        stop_all(running)

    figures = RunFigures.read(run_dir, trainer.log_path)
    assert figures.steps == list(range(1, len(figures.steps) + 1))
    assert len(figures.steps) > steps_before, "no step was trained after the buffer restart"
    assert stats.end_of_data and stats.queued_groups == 0
    # Every prompt was trained on once, dropped by a filter, or left over at the end (fewer than a step).
    assert figures.leftover < GROUPS_PER_STEP
    assert figures.trained_groups + stats.filtered + stats.stale_dropped + figures.leftover == PROMPTS
    # Nothing acknowledged was lost: every stored group was delivered and trained on (or left over / stale).
    assert stats.groups_in == figures.trained_groups + stats.stale_dropped + figures.leftover
    assert stats.groups_out == figures.trained_groups + figures.leftover
    assert figures.trained_groups * GENERATIONS == sum(r["samples"] for r in metrics_rows(run_dir))
    assert "buffer recovered" in buffer.log_path.read_text()
    # The replacement worker joined the weight sync and followed the policy past the restart.
    assert max(loaded_versions(processes["rollout-1"].log_path)) > steps_before
