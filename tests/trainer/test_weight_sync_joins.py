"""Who may join the weight sync, how many may, and what a member that never forms the group costs: a real trainer
service on loopback that requires a bearer token, a real rollout worker process receiving over gloo, and fake
members that join over gRPC, hold their watch streams open and never arrive at a group."""

from __future__ import annotations

import logging
import threading
import time

import grpc
import pytest
import torch
from prometheus_client import CollectorRegistry
from sync_helpers import WorkerProcess, digests, tiny_model, trainer_service

from zerobubble.common.clients.trainer import TrainerClient
from zerobubble.common.config import ClientConfig
from zerobubble.common.sync_protocol import Member
from zerobubble.rollout.weight_receiver import WeightReceiver
from zerobubble.trainer.broadcaster import LEFT

TOKEN = "weight-sync-test-token"
FORMATION_S = 2.0
FAKES = 8


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    return path


@pytest.fixture
def workers():
    started: list[WorkerProcess] = []

    def start(address: str, worker_id: str, token: str) -> WorkerProcess:
        started.append(WorkerProcess(address, worker_id, token=token))
        return started[-1]

    yield start
    for worker in started:
        worker.stop()


def refusal(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as refused:
        call()
    return refused.value


def test_a_stranger_can_neither_join_nor_watch(token_file):
    with trainer_service(token_file=token_file) as trainer:
        for token in (None, "wrong-token"):
            stranger = ClientConfig(address=trainer.address, auth_token=token, retry_seconds=0)
            with TrainerClient(stranger) as client:
                assert refusal(lambda: client.join("stranger")).code() == grpc.StatusCode.UNAUTHENTICATED
                watch = refusal(lambda: next(iter(client.watch("stranger"))))
                assert watch.code() == grpc.StatusCode.UNAUTHENTICATED
        assert trainer.broadcaster.members == []
        with TrainerClient(ClientConfig(address=trainer.address, auth_token_file=token_file)) as member:
            member.join("w1")
        assert trainer.broadcaster.members == ["w1"]


def test_a_worker_refused_for_its_token_says_so_in_its_log(token_file, caplog):
    caplog.set_level(logging.WARNING, logger="zerobubble.rollout.weight_receiver")
    with trainer_service(token_file=token_file) as trainer:
        client = TrainerClient(ClientConfig(address=trainer.address, auth_token="wrong-token"))
        receiver = WeightReceiver(client, "w1", first_backoff_s=0.05).start()
        try:
            deadline = time.monotonic() + 30
            while not any("UNAUTHENTICATED" in r.getMessage() for r in caplog.records):
                assert time.monotonic() < deadline, "no warning about the refused join"
                time.sleep(0.05)
        finally:
            receiver.close()
            client.close()
        assert trainer.broadcaster.members == []


def test_joins_beyond_the_maximum_are_refused(token_file):
    with trainer_service(token_file=token_file, max_members=3) as trainer, \
            TrainerClient(ClientConfig(address=trainer.address, auth_token_file=token_file)) as client:
        for i in range(3):
            client.join(f"w{i}")
        full = refusal(lambda: client.join("w3", retry=False))
        assert full.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_members" in full.details()
        client.join("w1")  # a restarted worker joins again under its id: not one more member
        assert sorted(trainer.broadcaster.members) == ["w0", "w1", "w2"]
        trainer.broadcaster.drop("w2", "it left")
        client.join("w3")
        assert sorted(trainer.broadcaster.members) == ["w0", "w1", "w3"]


class FakeMembers:
    """Members that join and watch but never arrive at a group epoch; each joins again as soon as it is dropped.
    `ended` records, per fake, when each of its watch streams ended."""

    def __init__(self, address: str, token_file, count: int):
        self.config = ClientConfig(address=address, auth_token_file=token_file, retry_seconds=0)
        self.ended: dict[str, list[float]] = {f"fake-{i}": [] for i in range(count)}
        self._stop = threading.Event()
        self._calls: dict[str, grpc.Future] = {}
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._member, args=(name,), daemon=True) for name in self.ended]

    def __enter__(self) -> FakeMembers:
        for thread in self._threads:
            thread.start()
        return self

    def _member(self, name: str) -> None:
        with TrainerClient(self.config) as client:
            while not self._stop.is_set():
                client.join(name, retry=False)
                with self._lock:
                    if self._stop.is_set():
                        return
                    call = self._calls[name] = client.watch(name)
                try:
                    for _ in call:
                        pass  # announcements are read and ignored: this member never arrives
                except grpc.RpcError:
                    pass
                self.ended[name].append(time.monotonic())

    def wait_ends(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while any(len(ends) < count for ends in self.ended.values()):
            assert time.monotonic() < deadline, f"fakes' streams ended {[len(e) for e in self.ended.values()]} times"
            time.sleep(0.05)

    def __exit__(self, *exc) -> None:
        with self._lock:
            self._stop.set()
            for call in self._calls.values():
                call.cancel()
        for thread in self._threads:
            thread.join(timeout=30)


def _perturb(model: torch.nn.Module, amount: float) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.add_(amount)


@pytest.mark.slow  # a whole-service restart, stop or run: make test runs it, make test-fast leaves it out
def test_members_that_never_form_the_group_are_dropped_within_the_formation_timeout(token_file, workers):
    # member_timeout_s stays at its default (30 s): dropping the fakes by it would miss every bound below.
    with trainer_service(token_file=token_file, formation_timeout_s=FORMATION_S, bucket_mb=0.05) as trainer:
        worker = workers(trainer.address, "real", TOKEN)
        trainer.wait_members({"real"})
        model = tiny_model(seed=3)
        trainer.broadcaster.publish(model.named_parameters(), 1)
        worker.applied(1)

        with FakeMembers(trainer.address, token_file, FAKES) as fakes:
            trainer.wait_members({"real", *fakes.ended})
            # A version in flight when fakes join again may need one more sync: two formation windows, plus a
            # wide margin for a busy machine, still far below the member timeout.
            bound = 2 * FORMATION_S + 10
            for version in (2, 3, 4):
                _perturb(model, 0.5)
                published = time.monotonic()
                trainer.broadcaster.publish(model.named_parameters(), version)
                event = worker.applied(version, timeout=bound)
                assert time.monotonic() - published < bound
                assert event["digests"] == digests(model.named_parameters())
                if version == 2:
                    fakes.wait_ends(1, timeout=5)
                    first_drop = max(ends[0] for ends in fakes.ended.values()) - published
                    assert first_drop < FORMATION_S + 5, f"fakes dropped {first_drop:.1f}s after the publish"
            assert trainer.broadcaster.wait_synced(4, timeout=bound)
            fakes.wait_ends(2, timeout=bound)  # each joined again, and was dropped again
        assert trainer.metric("zerobubble_trainer_sync_dropped_total") >= 2 * FAKES


def test_a_broken_wake_up_connection_is_replaced_at_the_next_wake_up(caplog):
    """Ending the sender's wait goes through a store connection of its own. The store resets a connection sent a key
    of 16 KB: that wake-up fails (the wait then ends at its timeout), and the next one connects afresh."""
    with trainer_service() as trainer, caplog.at_level(logging.WARNING, logger="zerobubble.trainer.broadcaster"):
        sync = trainer.broadcaster
        sync._stop_awaiting(["k" * 16_400])
        assert "could not end the wait" in caplog.text
        sync._stop_awaiting(["after-reset"])
        assert sync._store.get("after-reset") == LEFT


def test_a_worker_whose_trainer_finished_stops_asking_and_a_stopping_trainer_refuses_joins_by_name():
    """The end of a run as the trainer goes through it: training finished, then the weight sync closes while the server
    still answers, then the server stops. The worker learns from its watch's end that training is over and asks
    again only after its long pause, not at its backoff's pace; joins meanwhile are refused with a status that
    says why, never UNKNOWN."""
    registry = CollectorRegistry()
    with trainer_service() as trainer:
        with TrainerClient(ClientConfig(address=trainer.address)) as client:
            receiver = WeightReceiver(client, "w1", first_backoff_s=0.05, max_backoff_s=0.2, finished_pause_s=600,
                                      registry=registry).start()
            try:
                trainer.wait_members({"w1"})
                trainer.broadcaster.publish(tiny_model(seed=4).named_parameters(), 1)
                assert receiver.wait_for(1, timeout=60)
                joins = registry.get_sample_value("zerobubble_rollout_weight_sync_joins_total")

                trainer.control.state = "finished"
                trainer.broadcaster.close()
                # At the old backoff (0.05 s doubling to 0.2 s) the worker would ask about ten times in this window.
                deadline = time.monotonic() + 30
                while not receiver.not_syncing:
                    assert time.monotonic() < deadline, "the worker never learned that training has finished"
                    time.sleep(0.05)
                time.sleep(2.0)
                assert registry.get_sample_value("zerobubble_rollout_weight_sync_joins_total") == joins
                assert receiver.state.state is Member.JOINING

                finished = refusal(lambda: client.join("w2", retry=False))
                assert finished.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert "training has finished" in finished.details()
                trainer.control.state = "stopped by SIGTERM"
                stopping = refusal(lambda: client.join("w2", retry=False))
                assert stopping.code() == grpc.StatusCode.UNAVAILABLE
                assert "the weight sync has closed" in stopping.details()
            finally:
                receiver.close()
