"""A real rollout worker at the buffer's edges: restarted with the same id (kill -9, as compose restarts it),
pushing into a buffer whose disk is full, and joining a trainer that is not there."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from small_disk import fill, small_disk
from stack import start_buffer, start_reward, tiny_assets

from zerobubble.common.clients.buffer import BufferClient
from zerobubble.common.config import load_config
from zerobubble.rollout.app import build
from zerobubble.rollout.config import RolloutServiceConfig

GENERATIONS = 4
# The buffer's run spec, which the services here must agree with.
RUN_SPEC = {"run_spec.num_generations": GENERATIONS, "run_spec.max_new_tokens": 8}
PROMPTS = 12


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return tiny_assets(tmp_path_factory.mktemp("tiny"), train_size=PROMPTS, eval_size=2)


def worker_settings(model, buffer_address, reward_address) -> dict:
    return {
        "server.listen": "127.0.0.1:0", "server.metrics_port": 0, "server.grace_seconds": 0.5,
        "worker_id": "worker-a", "model.path": str(model), "trainer": None, "torch_threads": 1,
        "generation.num_generations": GENERATIONS, "generation.prompts_per_batch": 4,
        "buffer.address": buffer_address,
        "reward_service.address": reward_address, "backoff_max_seconds": 0.5, "lease_wait_seconds": 0.1,
    }


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


class WorkerProcess:
    """`zerobubble serve rollout` in a process of its own."""

    def __init__(self, settings: dict, folder):
        tree: dict = {}
        for dotted, value in settings.items():
            *sections, key = dotted.split(".")
            node = tree
            for section in sections:
                node = node.setdefault(section, {})
            node[key] = value
        folder.mkdir()
        config = folder / "rollout.yaml"
        config.write_text(yaml.safe_dump(tree))
        self.log = folder / "rollout.log"
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "zerobubble", "serve", "rollout", "--config", str(config)],
                stdout=subprocess.PIPE, stderr=log, text=True, cwd=folder,
            )
        line = self.process.stdout.readline()
        assert line, f"the worker did not start:\n{self.log.read_text()}"
        self.metrics_port = json.loads(line)["metrics_port"]

    def metric(self, name: str) -> float:
        """The sum of every series of a metric, scraped from the worker's /metrics."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as reply:
            text = reply.read().decode()
        return sum(sample.value for family in text_string_to_metric_families(text)
                   for sample in family.samples if sample.name == name)

    def stop(self, sig: int) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(30)


@pytest.mark.slow  # a whole-service restart or storm: make test runs it, make test-fast leaves it out
def test_a_worker_restarted_with_the_same_id_has_its_groups_stored(assets, tmp_path):
    model, train, _ = assets
    reward = start_reward()
    buffer = start_buffer(train, tmp_path / "wal", **{**RUN_SPEC,
                                                      "leases.timeout_seconds": 3.0})
    settings = worker_settings(model, buffer.address, reward.address)
    workers = []
    try:
        workers.append(WorkerProcess(settings, tmp_path / "first"))
        wait_for(lambda: buffer.core.stats()["groups_in"] >= 4, 180, "the first life to push a batch")
        workers[0].stop(signal.SIGKILL)
        first_life = buffer.core.stats()["groups_in"]

        workers.append(WorkerProcess(settings, tmp_path / "second"))
        wait_for(lambda: buffer.core.stats()["end_of_data"], 180, "the second life to finish the data")
        second = workers[1]
        assert second.metric("zerobubble_rollout_groups_not_stored_total") == 0, \
            "no group of the new life passes for a retry of the old one's"
        assert second.metric("zerobubble_rollout_groups_pushed_total") == PROMPTS - first_life
        with BufferClient(buffer.address) as client:
            pulled = client.pull(0, 1, 100, wait_seconds=1)
        assert sorted(g.group.prompt.prompt_id for g in pulled.groups) == sorted(str(i) for i in range(PROMPTS))
        incarnations = {g.group.producer_incarnation for g in pulled.groups}
        assert len(incarnations) == 2 and "" not in incarnations
    finally:
        for worker in workers:
            worker.stop(signal.SIGTERM)
        buffer.stop(0.5)
        reward.stop(0.5)


def test_a_worker_sends_groups_refused_for_a_full_disk_again_without_generating_them_again(assets, tmp_path):
    model, train, _ = assets
    with small_disk(tmp_path / "disk", megabytes=4) as disk:
        reward = start_reward()
        # Groups of a few KiB: the log file's last page, already allocated, takes at most one of them.
        buffer = start_buffer(train, disk / "wal", **{"run_spec.num_generations": GENERATIONS,
                                                      "run_spec.max_new_tokens": 64})
        filler = fill(disk)
        settings = worker_settings(model, buffer.address, reward.address)
        settings.update({"server.metrics_port": None})
        host = build(load_config(RolloutServiceConfig, None, settings)).start()
        prompts = lambda: host.registry.get_sample_value("zerobubble_rollout_prompts_total")  # noqa: E731
        try:
            wait_for(lambda: prompts() >= 8, 180, "two batches to be generated while the disk is full")
            time.sleep(1)
            assert buffer.core.stats()["groups_in"] < 4 and host.worker.error is None
            filler.unlink()
            wait_for(host.worker.drained.is_set, 180, "the worker to finish once the disk has room")
            assert buffer.core.stats()["groups_in"] == PROMPTS and host.worker.groups_pushed == PROMPTS
            assert prompts() == PROMPTS, "the refused groups were sent again, not generated again"
        finally:
            host.stop(0.5)
            buffer.stop(0.5)
            reward.stop(0.5)


def test_the_weight_sync_is_joined_again_within_backoff_max_seconds(assets, tmp_path):
    """A worker that finds no trainer keeps joining, no slower than the bound its config sets for every lost peer
    (a fixed 5 s outlasted a short run, which then ended with the worker never having had new weights)."""
    model, train, _ = assets
    reward, buffer = start_reward(), start_buffer(train, tmp_path / "wal", **RUN_SPEC)
    settings = {**worker_settings(model, buffer.address, reward.address), "server.metrics_port": None,
                "backoff_max_seconds": 0.25}
    settings.pop("trainer")
    settings["trainer.address"] = "127.0.0.1:1"
    host = build(load_config(RolloutServiceConfig, None, settings)).start()
    try:
        assert host.receiver is not None and host.receiver.max_backoff_s == 0.25
    finally:
        host.stop(0.5)
        buffer.stop(0.5)
        reward.stop(0.5)
