"""Weight sync end to end: a real trainer service on loopback, rollout workers in their own processes,
real gloo groups between them. Workers load into a transformers Qwen2 model and report sha256 digests."""

from __future__ import annotations

import signal
import threading
import time

import grpc
import pytest
import torch
from sync_helpers import WorkerProcess, digests, tiny_model, trainer_service

from zerobubble.common.clients.trainer import TrainerClient
from zerobubble.common.names import MAX_ID_CHARS
from zerobubble.common.sync_protocol import Sender
from zerobubble.rollout.weight_receiver import WeightReceiver

TIMEOUT_S = 3.0


def _perturb(model: torch.nn.Module, amount: float) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.add_(amount)


@pytest.fixture
def workers():
    started: list[WorkerProcess] = []

    def start(address: str, *ids: str) -> list[WorkerProcess]:
        new = [WorkerProcess(address, worker_id) for worker_id in ids]
        started.extend(new)
        return new

    yield start
    for worker in started:
        worker.stop()


@pytest.mark.slow  # a whole-service restart or storm: make test runs it, make test-fast leaves it out
def test_versions_arrive_bit_exactly_a_late_joiner_gets_the_last_at_once_and_all_rejoin_a_restarted_trainer(workers):
    with trainer_service(member_timeout_s=TIMEOUT_S, bucket_mb=0.05) as trainer:
        w1, w2 = workers(trainer.address, "w1", "w2")
        trainer.wait_members({"w1", "w2"})
        model = tiny_model(seed=1)
        trainer.broadcaster.publish(model.named_parameters(), 1)
        expected = digests(model.named_parameters())
        first = {w.worker_id: w.applied(1) for w in (w1, w2)}
        for event in first.values():
            assert event["version"] == 1 and event["digests"] == expected
        assert len(first["w1"]["pointers"]) > 1, "several buckets at bucket_mb=0.05"

        _perturb(model, 0.25)
        trainer.broadcaster.publish(model.named_parameters(), 2)
        expected = digests(model.named_parameters())
        for worker in (w1, w2):
            event = worker.applied(2)
            assert event["digests"] == expected
            assert event["pointers"] == first[worker.worker_id]["pointers"], "bucket buffers are reused"

        (w3,) = workers(trainer.address, "w3")
        trainer.wait_members({"w1", "w2", "w3"})
        # Without a new publish: a worker must not wait for a training step that may need its experience.
        assert w3.applied(2)["digests"] == expected
        _perturb(model, -0.5)
        trainer.broadcaster.publish(model.named_parameters(), 3)
        expected = digests(model.named_parameters())
        for worker in (w1, w2, w3):
            assert worker.applied(3)["digests"] == expected
        assert trainer.broadcaster.wait_synced(3, timeout=30)

        with TrainerClient(trainer.address) as client:
            status = client.status()
            assert (status.sync_members, status.synced_version, status.group_epoch) == (3, 3, 2)
            assert client.save_checkpoint("best").path == "/checkpoints/best"
        total = sum(t.numel() * t.element_size() for t in model.parameters())
        assert trainer.metric("zerobubble_trainer_weight_sync_bytes_total") >= 7 * total
        assert trainer.metric("zerobubble_trainer_sync_members") == 3
        assert trainer.metric("zerobubble_trainer_weight_sync_seconds_count") == 4
        address = trainer.address

    # The trainer goes away and comes back at the same address, resumed from the checkpoint of version 2:
    # every worker joins again and takes its weights, although it already has a higher version.
    with trainer_service(listen=address, member_timeout_s=TIMEOUT_S) as restarted:
        restarted.wait_members({"w1", "w2", "w3"})
        _perturb(model, 1.0)
        restarted.broadcaster.publish(model.named_parameters(), 2)
        expected = digests(model.named_parameters())
        for worker in (w1, w2, w3):
            event = worker.expect(lambda e: e["event"] == "applied" and e["version"] == 2 and e["digests"] == expected)
            assert event["version"] == 2


@pytest.mark.slow  # a whole-service restart, stop or run: make test runs it, make test-fast leaves it out
def test_killed_and_stalled_workers_are_dropped_and_the_survivor_goes_on(workers):
    with trainer_service(member_timeout_s=TIMEOUT_S, bucket_mb=0.05) as trainer:
        survivor, victim, stalled = workers(trainer.address, "survivor", "victim", "stalled")
        trainer.wait_members({"survivor", "victim", "stalled"})
        model = tiny_model(seed=2)
        trainer.broadcaster.publish(model.named_parameters(), 1)
        for worker in (survivor, victim, stalled):
            worker.applied(1)
        bound = 3 * TIMEOUT_S + 5

        victim.signal(signal.SIGKILL)
        _perturb(model, 1.0)
        started = time.monotonic()
        trainer.broadcaster.publish(model.named_parameters(), 2)
        assert trainer.broadcaster.wait_synced(2, timeout=bound), "a dead member must not hang the sync"
        assert time.monotonic() - started < bound
        expected = digests(model.named_parameters())
        assert survivor.applied(2)["digests"] == expected and stalled.applied(2)["digests"] == expected
        assert set(trainer.broadcaster.members) == {"survivor", "stalled"}
        # The dead member broke the broadcast, or left it unacknowledged: the epoch was given up and re-formed.
        sender = trainer.broadcaster.sender_state
        assert sender.took(Sender.BROADCASTING, Sender.FORMING) or sender.took(Sender.AWAITING_ACKS, Sender.FORMING)

        stalled.signal(signal.SIGSTOP)
        _perturb(model, 1.0)
        trainer.broadcaster.publish(model.named_parameters(), 3)
        assert survivor.applied(3)["digests"] == digests(model.named_parameters())
        assert trainer.broadcaster.wait_synced(3, timeout=bound)
        assert trainer.broadcaster.members == ["survivor"], "no ack within the member timeout: dropped"
        assert trainer.metric("zerobubble_trainer_sync_dropped_total") == 2

        stalled.signal(signal.SIGCONT)
        trainer.wait_members({"survivor", "stalled"})
        _perturb(model, 1.0)
        trainer.broadcaster.publish(model.named_parameters(), 4)
        expected = digests(model.named_parameters())
        assert stalled.applied(4)["digests"] == expected and survivor.applied(4)["digests"] == expected


def test_refusals_name_the_problem():
    with trainer_service() as trainer, TrainerClient(trainer.address) as client:
        with pytest.raises(grpc.RpcError) as refused:
            client.join("", "cpu")
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "worker_id" in refused.value.details()
        # Ids end up in the store's keys, and the store drops the connection of a key of 16 KB.
        for worker_id in ("w" * 16_400, "w" * (MAX_ID_CHARS + 1)):
            with pytest.raises(grpc.RpcError) as too_long:
                client.join(worker_id, "cpu")
            assert too_long.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "worker_id" in too_long.value.details()
        with pytest.raises(grpc.RpcError) as unknown:
            next(iter(client.watch("stranger")))
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND and "JoinWeightSync" in unknown.value.details()
        reply = client.join("w1", "cpu")
        assert (reply.rank, reply.store_port, reply.backend) == (-1, trainer.broadcaster.store_port, "gloo")
        assert reply.member_timeout_seconds == trainer.broadcaster.config.member_timeout_s


class WedgedReceiver(WeightReceiver):
    """Receives a version and then hangs before acknowledging it, until `release` is set."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.received = threading.Event()
        self.release = threading.Event()

    def _receive(self, announcement, abandoned):
        times = super()._receive(announcement, abandoned)
        self.received.set()
        assert self.release.wait(120)
        return times


def test_a_member_that_leaves_before_acknowledging_ends_the_trainers_wait_at_once(workers):
    member_timeout = 60.0
    with trainer_service(member_timeout_s=member_timeout, bucket_mb=0.05) as trainer, \
            TrainerClient(trainer.address) as client:
        (survivor,) = workers(trainer.address, "survivor")
        wedged = WedgedReceiver(client, "wedged").start()
        try:
            trainer.wait_members({"survivor", "wedged"})
            model = tiny_model(seed=4)
            published = time.monotonic()
            trainer.broadcaster.publish(model.named_parameters(), 1)
            assert wedged.received.wait(30)
            assert trainer.broadcaster.status()["synced_version"] == -1, "the trainer awaits the wedged member's ack"
            with wedged._call_lock:
                wedged._call.cancel()  # its watch stream closes: it leaves the group
            # The trainer stops waiting for that acknowledgement now, not at the member timeout, and sends the version
            # again to the one member left.
            assert trainer.broadcaster.wait_synced(1, timeout=member_timeout / 2)
            assert time.monotonic() - published < member_timeout / 2
            assert survivor.applied(1)["digests"] == digests(model.named_parameters())
            assert "wedged" not in trainer.broadcaster.members
            assert trainer.broadcaster.sender_state.took(Sender.AWAITING_ACKS, Sender.FORMING)
        finally:
            wedged.release.set()
            wedged.close()


def test_closing_ends_a_broadcast_in_flight_to_a_stalled_member_instead_of_waiting_out_its_timeout(workers):
    """A trainer that finishes while a member has stopped reading (its process stalled) closes its weight sync at
    once, not at the broadcast's member timeout: its way out does not wait for a worker that is going too."""
    member_timeout_s = 120.0
    with trainer_service(member_timeout_s=member_timeout_s, bucket_mb=1.0) as trainer:
        [stalled] = workers(trainer.address, "stalled")
        trainer.wait_members({"stalled"})
        trainer.broadcaster.publish(tiny_model(seed=5).named_parameters(), 1)
        stalled.applied(1)

        stalled.signal(signal.SIGSTOP)
        # Far more than the sockets between them hold, so the broadcast waits on the stalled member's reads.
        trainer.broadcaster.publish([("model.embed_tokens.weight", torch.ones(16, 1024, 1024))], 2)
        deadline = time.monotonic() + 60
        while trainer.broadcaster.sender_state.state is not Sender.BROADCASTING:
            assert time.monotonic() < deadline, f"the sender is {trainer.broadcaster.sender_state.state}"
            time.sleep(0.05)
        time.sleep(1.0)
        assert trainer.broadcaster.sender_state.state is Sender.BROADCASTING, "the broadcast did not wait"

        closed = threading.Thread(target=trainer.broadcaster.close)
        closed.start()
        # Well within the member timeout that bounds the broadcast otherwise.
        closed.join(timeout=member_timeout_s / 4)
        assert not closed.is_alive(), "close waited for the broadcast in flight"
        assert trainer.broadcaster.status()["synced_version"] == 1
        stalled.signal(signal.SIGCONT)
