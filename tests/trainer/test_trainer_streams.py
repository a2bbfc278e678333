"""The trainer's streams through real services: a thousand idle WatchWeights streams leave it answering,
and SIGTERM ends a trainer process within its grace whatever streams are open."""

from __future__ import annotations

import json
import signal
import statistics
import subprocess
import sys
import time

import pytest
import yaml
from idle_streams import health_check_seconds, idle_streams
from stack import start_buffer, tiny_assets
from sync_helpers import trainer_service

from zerobubble.common.clients.trainer import TrainerClient
from zerobubble.common.config import ClientConfig
from zerobubble.v1 import trainer_pb2

WATCH = "/zerobubble.v1.TrainerService/WatchWeights"


@pytest.mark.slow  # a whole-service restart or storm: make test runs it, make test-fast leaves it out
def test_a_thousand_idle_watch_streams_leave_health_checks_and_status_answering():
    with trainer_service(max_members=1000) as trainer, TrainerClient(trainer.address) as client:
        members = [f"w{i}" for i in range(1000)]
        for worker_id in members:
            client.join(worker_id)
        watches = [trainer_pb2.WatchRequest(worker_id=w).SerializeToString() for w in members]
        # No weights are published: each stream only waits, after the headers that say it is registered.
        with idle_streams(trainer.address, WATCH, watches, client_streaming=False, within=120):
            seconds = health_check_seconds(trainer.address)
            assert statistics.median(seconds) < 0.1, seconds
            with TrainerClient(ClientConfig(address=trainer.address, timeout_seconds=5, retry_seconds=0)) as probe:
                started = time.monotonic()
                assert probe.status().step == 0
                assert time.monotonic() - started < 1.0


GRACE_SECONDS = 4.0


@pytest.mark.slow  # a whole-service restart, stop or run: make test runs it, make test-fast leaves it out
def test_sigterm_ends_a_trainer_within_its_grace_with_watch_streams_open_and_a_pull_waiting(tmp_path):
    model, train, _ = tiny_assets(tmp_path)
    # An empty buffer: the trainer sits in a pull that would wait far longer than the grace.
    buffer = start_buffer(train, tmp_path / "wal")
    config = {"server": {"listen": "127.0.0.1:0", "metrics_port": None, "grace_seconds": GRACE_SECONDS},
              "model": str(model), "run_dir": str(tmp_path / "run"), "buffer": {"address": buffer.address},
              "batch": {"pull_wait_seconds": 60.0}, "torch_threads": 1}
    (tmp_path / "trainer.yaml").write_text(yaml.safe_dump(config))
    log = open(tmp_path / "trainer.log", "w")
    trainer = subprocess.Popen([sys.executable, "-m", "zerobubble", "serve", "trainer",
                                "--config", str(tmp_path / "trainer.yaml")], stdout=subprocess.PIPE, stderr=log,
                               text=True)
    try:
        line = trainer.stdout.readline()
        assert line, (tmp_path / "trainer.log").read_text()
        address = json.loads(line)["address"]
        with TrainerClient(address) as client:
            members = [f"w{i}" for i in range(8)]
            for worker_id in members:
                client.join(worker_id)
            watches = [trainer_pb2.WatchRequest(worker_id=w).SerializeToString() for w in members]
            # Not waiting for headers: a trainer need not send them before its first announcement.
            with idle_streams(address, WATCH, watches, client_streaming=False, headers=False) as streams:
                time.sleep(2.0)
                started = time.monotonic()
                trainer.send_signal(signal.SIGTERM)
                code = trainer.wait(120)
                seconds = time.monotonic() - started
                ended = streams.codes(timeout=10)
        # Stopped before the end of its run: the shell's code for SIGTERM, not a finished run's 0.
        assert code == 128 + signal.SIGTERM, (tmp_path / "trainer.log").read_text()
        # The margin is for the signal's delivery and the process's exit on a busy machine.
        assert seconds < GRACE_SECONDS + 2.0, f"exit took {seconds:.1f}s with a grace of {GRACE_SECONDS}s"
        assert len(ended) == len(members)
    finally:
        trainer.kill()
        trainer.wait()
        log.close()
        buffer.stop(0)
