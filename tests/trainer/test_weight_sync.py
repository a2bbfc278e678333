"""Weight sync pieces: the bucket manifest (plan, pack, views, wire form), the broadcaster's snapshot and
coalescing against a real worker process, its refusals, and the `bench weights` command at a tiny size."""

from __future__ import annotations

import signal
import threading
import time

import pytest
import torch
from sync_helpers import StandInEngine, WorkerProcess, digests, tiny_model, trainer_service

from zerobubble.common.errors import InvalidInput, NotFound
from zerobubble.common.weight_sync import ALIGN, MIB, Manifest
from zerobubble.rollout import weight_receiver
from zerobubble.trainer.broadcaster import WeightBroadcaster
from zerobubble.trainer.sync_config import WeightSyncConfig
from zerobubble.v1 import trainer_pb2


def _mixed() -> list[tuple[str, torch.Tensor]]:
    return [
        ("a.weight", torch.randn(3, 5)),
        ("b.bias", torch.randn(7, dtype=torch.bfloat16)),
        ("c.steps", torch.arange(5, dtype=torch.int64)),
        ("d.scalar", torch.tensor(2.5, dtype=torch.float16)),
        ("e.empty", torch.empty(0, 4)),
        ("f.big", torch.randn(64, 64)),
        ("g.tail", torch.randn(9, dtype=torch.bfloat16).view(3, 3).t()),  # not contiguous
    ]


def test_manifest_packs_every_dtype_into_aligned_buckets_and_views_them_back_bit_exactly():
    named = _mixed()
    manifest = Manifest.plan(named, bucket_bytes=1024)
    assert manifest.names == [name for name, _ in named]
    big = next(b for b in manifest.buckets if any(s.name == "f.big" for s in b.slots))
    assert len(big.slots) == 1 and big.nbytes == 64 * 64 * 4, "a tensor larger than a bucket gets its own"
    for bucket in manifest.buckets:
        assert all(slot.offset % ALIGN == 0 for slot in bucket.slots)
        if bucket is not big:
            assert bucket.nbytes <= 1024
    buffers = manifest.allocate()
    manifest.pack(named, buffers)
    assert digests(manifest.views(buffers)) == digests(named)
    assert Manifest.from_proto(manifest.to_proto()) == manifest


def test_manifest_refuses_what_it_does_not_describe():
    named = _mixed()
    manifest = Manifest.plan(named, bucket_bytes=MIB)
    buffers = manifest.allocate()
    with pytest.raises(ValueError, match="a.weight"):
        manifest.pack([("a.weight", torch.randn(5, 3)), *named[1:]], buffers)
    with pytest.raises(ValueError, match="not given"):
        manifest.pack(named[1:], buffers)
    wire = manifest.to_proto()
    wire[0].tensors[0].offset = 3
    with pytest.raises(ValueError, match="a.weight"):
        Manifest.from_proto(wire)


def test_publish_without_members_completes_and_join_refuses_bad_requests():
    broadcaster = WeightBroadcaster(WeightSyncConfig(member_timeout_s=2)).start()
    try:
        broadcaster.publish(_mixed(), 7)
        assert broadcaster.wait_synced(7, timeout=10)
        with pytest.raises(InvalidInput, match="worker_id"):
            broadcaster.join("", "cpu")
        with pytest.raises(NotFound, match="JoinWeightSync"):
            broadcaster.watch("nobody")
    finally:
        broadcaster.close()


def test_a_later_copy_runs_on_its_own_thread_and_the_caller_waits_for_it_before_changing_the_weights(
        monkeypatch):
    copying, release, threads = threading.Event(), threading.Event(), []
    pack = Manifest.pack

    def held_pack(self, named, buffers):
        threads.append(threading.current_thread().name)
        copying.set()
        assert release.wait(30)
        pack(self, named, buffers)

    monkeypatch.setattr(Manifest, "pack", held_pack)
    broadcaster = WeightBroadcaster(WeightSyncConfig(member_timeout_s=2)).start()
    try:
        model = tiny_model(seed=3)
        snapshot = digests(model.named_parameters())
        broadcaster.publish(model.named_parameters(), 1)
        assert copying.wait(10) and threads == ["weight-copy"], "the copy is not the caller's"
        waiter = threading.Thread(target=broadcaster.wait_copied)
        waiter.start()
        waiter.join(0.2)
        assert waiter.is_alive() and broadcaster.status()["published_version"] == -1, "not copied yet"
        release.set()
        waiter.join(10)
        assert not waiter.is_alive() and broadcaster.status()["published_version"] == 1
        _step(model, 1.0)  # what the optimizer does once the copy is made: the copy keeps the weights of before
        assert broadcaster.wait_synced(1, timeout=10)
        sent = broadcaster._sending
        assert digests(sent.manifest.views(sent.buffers)) == snapshot
    finally:
        release.set()
        broadcaster.close()


def test_a_later_copy_that_fails_raises_in_the_caller_at_its_wait():
    broadcaster = WeightBroadcaster(WeightSyncConfig(member_timeout_s=2)).start()
    try:
        broadcaster.publish([("a.weight", torch.empty(3, device="meta"))], 1)
        with pytest.raises(NotImplementedError):
            broadcaster.wait_copied()
        broadcaster.wait_copied()  # raised once; the next publish goes ahead
        broadcaster.publish(_mixed(), 2)
        broadcaster.wait_copied()
        assert broadcaster.wait_synced(2, timeout=10)
    finally:
        broadcaster.close()


def _step(model: torch.nn.Module, amount: float) -> None:
    """What an optimizer step does to the weights right after a publish."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(amount)


def _wait_sending(trainer, version: int) -> None:
    deadline = time.monotonic() + 10
    while trainer.broadcaster.status()["sending_version"] != version:
        assert time.monotonic() < deadline, f"version {version} was not taken up"
        time.sleep(0.01)


def test_publish_returns_at_once_snapshots_the_weights_and_coalesces_to_the_newest():
    with trainer_service(member_timeout_s=30, bucket_mb=0.05) as trainer:
        worker = WorkerProcess(trainer.address, "w1")
        try:
            trainer.wait_members({"w1"})
            model = tiny_model(seed=5)
            trainer.broadcaster.publish(model.named_parameters(), 1)
            worker.applied(1)

            # A stopped worker cannot acknowledge: version 2 stays in flight while the trainer goes on.
            worker.signal(signal.SIGSTOP)
            snapshot_2 = digests(model.named_parameters())
            trainer.broadcaster.publish(model.named_parameters(), 2)
            trainer.broadcaster.wait_copied()
            _step(model, 1.0)
            _wait_sending(trainer, 2)
            assert trainer.broadcaster.status()["synced_version"] == 1, "publish does not wait for the broadcast"
            worker.signal(signal.SIGCONT)
            assert worker.applied(2)["digests"] == snapshot_2, "a step after publish does not change what is sent"

            worker.signal(signal.SIGSTOP)
            trainer.broadcaster.publish(model.named_parameters(), 3)
            trainer.broadcaster.wait_copied()
            _step(model, 1.0)
            _wait_sending(trainer, 3)
            trainer.broadcaster.publish(model.named_parameters(), 4)
            trainer.broadcaster.wait_copied()
            _step(model, 1.0)
            snapshot_5 = digests(model.named_parameters())
            trainer.broadcaster.publish(model.named_parameters(), 5)
            trainer.broadcaster.wait_copied()
            _step(model, 1.0)
            worker.signal(signal.SIGCONT)
            assert worker.applied(5)["digests"] == snapshot_5
            assert trainer.broadcaster.wait_synced(5, timeout=60)
            assert trainer.metric("zerobubble_trainer_weight_sync_seconds_count") == 4, "1, 2, 3, 5: 4 coalesced"
        finally:
            worker.stop()


def test_a_receive_that_fails_over_a_version_not_yet_loaded_leaves_the_engine_nothing_to_load(monkeypatch):
    """The receiver's bookkeeping alone: the broadcast into its buffers is replaced by writing the bytes it would
    deliver (one version completes), then by a peer's failure midway through the next one."""
    model = tiny_model(seed=6)
    manifest = Manifest.plan(model.named_parameters(), MIB)
    sent = manifest.allocate()
    manifest.pack(model.named_parameters(), sent)
    receiver = weight_receiver.WeightReceiver(trainer=None, worker_id="w1")

    def deliver(works, **_):
        for target, source in zip(receiver.buffers, sent, strict=True):
            target.copy_(source)

    def fail_midway(works, **_):
        receiver.buffers[0].zero_()
        raise RuntimeError("Connection closed by peer")

    def announcement(version: int) -> trainer_pb2.WeightAnnouncement:
        return trainer_pb2.WeightAnnouncement(version=version, buckets=manifest.to_proto())

    monkeypatch.setattr(weight_receiver, "start_broadcast", lambda group, buffers: [])
    monkeypatch.setattr(weight_receiver, "wait_broadcast", deliver)
    receiver._receive(announcement(1), lambda: False)
    assert receiver.latest_version == 1
    monkeypatch.setattr(weight_receiver, "wait_broadcast", fail_midway)
    with pytest.raises(RuntimeError):
        receiver._receive(announcement(2), lambda: False)
    engine = StandInEngine(tiny_model(seed=7))
    before = digests(engine.model.named_parameters())
    assert not receiver.apply_to(engine), "version 1's buffers were half overwritten: nothing is complete"
    assert engine.policy_version == 0 and digests(engine.model.named_parameters()) == before
    assert receiver.latest_version is None
