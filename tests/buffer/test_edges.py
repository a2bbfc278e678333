"""The buffer at its edges, through a real server: cut pull streams, poisoned groups, restarted producers,
a full disk and absurd policy versions."""

from __future__ import annotations

import math
import queue
import signal
import statistics
import threading
import time

import grpc
import numpy as np
import pytest
from buffer_helpers import BufferProcess, CuttableProxy, make_group, prompt_key
from idle_streams import health_check_seconds, idle_streams
from small_disk import fill, small_disk

from zerobubble.common.clients.buffer import BufferClient
from zerobubble.common.codec import encode_array
from zerobubble.common.config import ClientConfig
from zerobubble.v1 import buffer_pb2, buffer_pb2_grpc

INVALID = grpc.StatusCode.INVALID_ARGUMENT
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


def push_all(client, prompts, producer="w", incarnation=""):
    groups = [make_group(p, producer, i) for i, p in enumerate(prompts)]
    for group in groups:
        group.producer_incarnation = incarnation
    return list(client.push(groups))


def wait_until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


# Groups are the receiver's once acknowledged, not once sent.

def test_groups_sent_on_cut_streams_are_delivered_again(serve):
    host, client = serve(prompts=40, pull__ack_timeout_seconds=1.0)
    prompts = list(client.lease("w", 40).prompts)
    assert all(a.stored for a in push_all(client, prompts))
    with grpc.insecure_channel(host.address) as channel:
        stub = buffer_pb2_grpc.BufferServiceStub(channel)
        for _ in range(10):
            call = stub.PullBatch(buffer_pb2.PullRequest(rank=0, world_size=1, max_groups=40, wait_seconds=10),
                                  timeout=20)
            next(call)
            call.cancel()
    received = []
    deadline = time.monotonic() + 60
    while len(received) < 40 and time.monotonic() < deadline:
        received += client.pull(0, 1, 40 - len(received), wait_seconds=5).groups
    assert sorted(prompt_key(g.group) for g in received) == sorted(prompt_key(p) for p in prompts)
    stats = client.stats()
    assert stats.returned >= 10 and stats.unacknowledged == 0 and stats.queued_groups == 0
    client.commit(max(g.delivery for g in received))
    assert client.pull(0, 1, 40).end_of_data, "everything committed: nothing comes again"


def test_a_network_drop_mid_stream_keeps_what_arrived_and_loses_nothing(serve):
    host, client = serve(prompts=20, pull__ack_timeout_seconds=1.0)
    prompts = list(client.lease("w", 20).prompts)
    assert all(a.stored for a in push_all(client, prompts[:10]))
    proxy = CuttableProxy(host.address)
    trainer = BufferClient(ClientConfig(address=proxy.address, timeout_seconds=10, retry_seconds=10))
    try:
        first: list = []
        puller = threading.Thread(target=lambda: first.append(trainer.pull(0, 1, 20, wait_seconds=30)))
        puller.start()
        wait_until(lambda: client.stats().groups_out == 10, 10, "the ten groups to be sent")
        time.sleep(0.5)
        proxy.cut()
        puller.join(20)
        assert not puller.is_alive() and len(first[0].groups) == 10, "the groups that arrived are kept"
        assert client.stats().unacknowledged == 0, "and acknowledged over a new connection"
        assert all(a.stored for a in push_all(client, prompts[10:], "v"))
        second = trainer.pull(0, 1, 20, wait_seconds=5)
        kept = [prompt_key(g.group) for g in first[0].groups + second.groups]
        assert sorted(kept) == sorted(prompt_key(p) for p in prompts), "each group exactly once"
    finally:
        trainer.close()
        proxy.close()


def test_a_buffer_killed_mid_stream_sends_the_unacknowledged_groups_again(tmp_path):
    server = BufferProcess(tmp_path, prompts=16)
    client = server.start()
    try:
        prompts = list(client.lease("w", 12).prompts)
        assert all(a.stored for a in push_all(client, prompts))
        first = client.pull(0, 1, 4)
        assert len(first.groups) == 4
        call = client.stub.PullBatch(buffer_pb2.PullRequest(rank=0, world_size=1, max_groups=12, wait_seconds=30),
                                     timeout=30)
        cut = [next(call) for _ in range(8)]
        server.process.kill()
        server.process.wait()
        with pytest.raises(grpc.RpcError):
            list(call)
        client = server.start()
        assert client.acknowledge([g.delivery for g in cut]) == [g.delivery for g in cut], \
            "a restarted buffer took them back: they are not the receiver's to keep"
        again = client.pull(0, 1, 12, wait_seconds=1)
        assert [prompt_key(g.group) for g in again.groups] == [prompt_key(g.group) for g in cut]
        client.commit(max(g.delivery for g in again.groups))
        stats = client.stats()
        assert (stats.queued_groups, stats.unacknowledged, stats.returned) == (0, 0, 8)
    finally:
        client.close()
        server.stop(signal.SIGTERM)


def test_an_acknowledgement_repeated_after_a_restart_gets_the_same_answer(tmp_path):
    # A caller whose acknowledgement got no reply repeats it until one comes: what the buffer had recorded is
    # still the caller's, what it had not went back to the queue and is refused.
    server = BufferProcess(tmp_path, prompts=8)
    client = server.start()
    try:
        prompts = list(client.lease("w", 6).prompts)
        assert all(a.stored for a in push_all(client, prompts))
        received = client.receive(0, 1, 6)
        assert len(received.groups) == 6
        first, rest = received.deliveries[:3], received.deliveries[3:]
        assert client.acknowledge(first) == [] and client.acknowledge(first) == []
        server.process.kill()
        server.process.wait()
        client = server.start()
        assert client.acknowledge(received.deliveries) == rest
        again = client.pull(0, 1, 6, wait_seconds=1)
        assert [prompt_key(g.group) for g in again.groups] == [prompt_key(g.group) for g in received.groups[3:]]
        client.commit(again.last_delivery)
        stats = client.stats()
        assert (stats.queued_groups, stats.unacknowledged) == (0, 0)
    finally:
        client.close()
        server.stop(signal.SIGTERM)


def test_acknowledge_refuses_deliveries_that_were_never_made(serve):
    _, client = serve(pull__max_groups=4)
    for deliveries, code, field in [([0], INVALID, "deliveries[0]"), ([1], INVALID, "deliveries[0]"),
                                    ([1] * 5, EXHAUSTED, "deliveries")]:
        with pytest.raises(grpc.RpcError) as refused:
            client.acknowledge(deliveries)
        assert refused.value.code() == code and refused.value.details().startswith(f"{field}:")


def test_a_rank_may_acknowledge_only_what_its_own_stream_received(serve):
    # Rank 0 claiming rank 1's groups would leave them unsent for good were rank 1's stream cut: refused whole,
    # and rank 1 still claims them.
    _, client = serve()
    prompts = list(client.lease("w", 4).prompts)
    assert all(a.stored for a in push_all(client, prompts))
    mine = client.receive(0, 2, 2)
    theirs = client.receive(1, 2, 2)
    assert len(mine.groups) == len(theirs.groups) == 2
    with pytest.raises(grpc.RpcError) as refused:
        client.acknowledge([*mine.deliveries, theirs.deliveries[1]], rank=0)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert refused.value.details().startswith("deliveries[2]:") and "rank 1" in refused.value.details()
    assert client.stats().unacknowledged == 4, "a refused acknowledgement claims nothing"
    assert client.acknowledge(theirs.deliveries, rank=1) == []
    assert client.acknowledge(mine.deliveries, rank=0) == []
    assert client.stats().unacknowledged == 0


# Nothing poisonous is stored.

def set_array(field, values, dtype):
    field.CopyFrom(encode_array(np.asarray(values, dtype=dtype)))


POISON = {
    "trajectories[0].reward": (INVALID, lambda g: setattr(g.trajectories[0], "reward", math.nan)),
    "trajectories[1].reward": (INVALID, lambda g: setattr(g.trajectories[1], "reward", math.inf)),
    "trajectories[2].behaviour_logprobs": (
        INVALID, lambda g: set_array(g.trajectories[2].behaviour_logprobs, [math.nan] * 8, np.float32)),
    "trajectories[3].behaviour_logprobs": (
        INVALID, lambda g: set_array(g.trajectories[3].behaviour_logprobs, [0.5] * 8, np.float32)),
    "trajectories[0].temperature": (INVALID, lambda g: setattr(g.trajectories[0], "temperature", math.nan)),
    "trajectories[1].temperature": (INVALID, lambda g: setattr(g.trajectories[1], "temperature", 0.0)),
    "trajectories[2].temperature": (INVALID, lambda g: setattr(g.trajectories[2], "temperature", -1.0)),
    "trajectories[3].response_ids": (
        INVALID, lambda g: set_array(g.trajectories[3].response_ids, [1, -4] + [1] * 6, np.int32)),
    "trajectories[0].response_ids": (
        INVALID, lambda g: set_array(g.trajectories[0].response_ids, [1] * 7 + [300], np.int32)),
    "prompt_ids": (INVALID, lambda g: set_array(g.prompt_ids, [1, 2, 9999], np.int32)),
    # A multi-turn response's mask: one 0/1 per token, at least one token the model's.
    "trajectories[0].loss_mask": (INVALID, lambda g: set_array(g.trajectories[0].loss_mask, [1] * 7, np.uint8)),
    "trajectories[1].loss_mask": (INVALID, lambda g: set_array(g.trajectories[1].loss_mask, [1, 2] * 4, np.uint8)),
    "trajectories[2].loss_mask": (INVALID, lambda g: set_array(g.trajectories[2].loss_mask, [0] * 8, np.uint8)),
    "trajectories[3].loss_mask.dtype": (
        INVALID, lambda g: set_array(g.trajectories[3].loss_mask, [1] * 8, np.float32)),
    "trajectories[1].finish_reason": (INVALID, lambda g: setattr(g.trajectories[1], "finish_reason", 7)),
    "trajectories[2].finish_reason": (INVALID, lambda g: setattr(g.trajectories[2], "finish_reason", 0)),
    "trajectories[3].policy_version": (INVALID, lambda g: setattr(g.trajectories[3], "policy_version", 10**12)),
    "producer_id": (INVALID, lambda g: setattr(g, "producer_id", "w\n1")),
    "trajectories": (EXHAUSTED, lambda g: [g.trajectories.add().CopyFrom(g.trajectories[0]) for _ in range(5)]),
    "trajectories[1].response_ids": (EXHAUSTED, lambda g: (
        set_array(g.trajectories[1].response_ids, [1] * 65, np.int32),
        set_array(g.trajectories[1].behaviour_logprobs, [-1.0] * 65, np.float32))),
}


def test_poisoned_groups_are_refused_in_their_own_ack_naming_the_field(serve):
    _, client = serve(prompts=len(POISON) + 1, run_spec__model__vocab_size=300, validation__max_trajectories=8,
                      validation__max_response_tokens=64, validation__max_version_ahead=10)
    prompts = list(client.lease("w", len(POISON) + 1).prompts)
    stream = []
    for i, (_, poison) in enumerate(POISON.values()):
        stream.append(make_group(prompts[i], "w", i))
        poison(stream[-1])
    stream.append(make_group(prompts[-1], "w", len(POISON)))
    acks = list(client.push(stream))
    for ack, (field, (code, _)) in zip(acks, POISON.items(), strict=False):
        assert (ack.code, ack.stored) == (code.value[0], False), field
        assert ack.error.startswith(f"{field}:"), (field, ack.error)
    assert len(acks) == len(stream) and acks[-1].stored, "the stream goes on after the refusals"
    assert client.stats().groups_in == 1
    healthy = list(client.push([make_group(p, "w", 100 + i) for i, p in enumerate(prompts[:3])]))
    assert all(a.stored for a in healthy), "nothing of a refused group was kept"


def test_bytes_that_are_no_group_are_refused_in_their_own_ack(serve):
    host, client = serve(prompts=1)
    prompt = client.lease("w", 1).prompts[0]
    with grpc.insecure_channel(host.address) as channel:
        push = channel.stream_stream("/zerobubble.v1.BufferService/PushExperience",
                                     request_serializer=bytes, response_deserializer=buffer_pb2.PushAck.FromString)
        acks = list(push(iter([b"\xff\xff\xff", make_group(prompt, "w", 0).SerializeToString()]), timeout=10))
    assert [(a.code, a.stored) for a in acks] == [(INVALID.value[0], False), (0, True)]
    assert acks[0].error.startswith("group:")


@pytest.mark.parametrize("lease_id", ["\u00b2.1", "1." + "9" * 5000])
def test_lease_ids_that_are_no_numbers_are_refused_naming_the_field(serve, lease_id):
    _, client = serve(prompts=2)
    prompt = client.lease("w", 1).prompts[0]
    ack = list(client.push([make_group(prompt, "w", 0, lease_id=lease_id)]))[0]
    assert ack.code == INVALID.value[0] and ack.error.startswith("lease_id:")
    with pytest.raises(grpc.RpcError) as refused:
        client.complete(lease_id)
    assert refused.value.code() == INVALID and refused.value.details().startswith("lease_id:")


def test_requests_with_huge_counts_are_refused_naming_the_field(serve):
    _, client = serve()
    for call, field in [(lambda: client.lease("w", 2**31 - 1), "count"),
                        (lambda: client.pull(0, 1, 2**31 - 1), "max_groups")]:
        with pytest.raises(grpc.RpcError) as refused:
            call()
        assert refused.value.code() == INVALID and refused.value.details().startswith(f"{field}:")


def test_the_policy_version_only_moves_within_bounds(serve):
    _, client = serve(validation__max_version_jump=100)
    client.set_policy_version(100)
    for version in (2**63 - 1, 201, -1):
        with pytest.raises(grpc.RpcError) as refused:
            client.set_policy_version(version)
        assert refused.value.code() == INVALID and refused.value.details().startswith("version:")
    assert client.stats().policy_version == 100
    client.set_policy_version(40)  # a trainer resumed from an older checkpoint
    assert client.stats().policy_version == 40


# A restarted producer is a new one; metric labels come from a fixed set.

def test_a_restarted_producer_counting_from_zero_again_is_stored(serve):
    host, client = serve(prompts=9, run_spec__filter_range=[0.01, 0.99])
    prompts = list(client.lease("w", 9).prompts)
    assert all(a.stored for a in push_all(client, prompts[:4], "worker-0", "first-life"))
    after_restart = push_all(client, prompts[4:8], "worker-0", "second-life")
    assert all(a.stored for a in after_restart), [a.filtered for a in after_restart]

    retried = push_all(client, prompts[4:5], "worker-0", "second-life")[0]
    assert (retried.stored, retried.not_stored) == (False, buffer_pb2.NOT_STORED_DUPLICATE)
    other = make_group(prompts[0], "worker-1", 0)
    other.producer_incarnation = "x"
    assert list(client.push([other]))[0].not_stored == buffer_pb2.NOT_STORED_PROMPT_DONE
    solved = make_group(prompts[8], "worker-1", 1, correct=4)
    assert list(client.push([solved]))[0].not_stored == buffer_pb2.NOT_STORED_ACCURACY
    labels = {sample.labels["reason"]: sample.value
              for metric in host.registry.collect() if metric.name == "zerobubble_buffer_not_stored"
              for sample in metric.samples if sample.name.endswith("_total")}
    assert labels == {"duplicate": 1, "prompt_done": 1, "accuracy": 1}, "one series per reason, never per prompt"


# A full disk refuses a group for now and keeps the stream.

def test_a_full_disk_refuses_groups_for_now_and_keeps_the_stream(serve, tmp_path):
    with small_disk(tmp_path / "disk", megabytes=4) as disk:
        _, client = serve(prompts=6, wal__directory=str(disk / "wal"))
        prompts = list(client.lease("w", 6).prompts)
        groups = [make_group(p, "w", i, tokens=4096) for i, p in enumerate(prompts)]
        outgoing: queue.Queue = queue.Queue()
        acks = client.push(iter(outgoing.get, None), timeout=60)
        outgoing.put(groups[0])
        assert next(acks).stored
        filler = fill(disk)
        refused = []
        for group in groups[1:3]:
            outgoing.put(group)
            refused.append(next(acks))
        assert [(a.code, a.stored) for a in refused] == [(UNAVAILABLE.value[0], False)] * 2
        assert all("write-ahead log" in a.error for a in refused)
        filler.unlink()
        for group in groups[1:]:
            outgoing.put(group)
            assert next(acks).stored, "the same stream goes on, and the refused groups are taken when resent"
        outgoing.put(None)
        assert list(acks) == []
        pulled = client.pull(0, 1, 10)
        assert sorted(prompt_key(g.group) for g in pulled.groups) == sorted(prompt_key(p) for p in prompts)


# Streams that wait hold no thread.

@pytest.mark.parametrize("method", ["PullBatch", "PushExperience"])
def test_a_thousand_idle_streams_leave_the_buffer_answering(serve, method):
    host, client = serve(prompts=2)
    prompt = client.lease("w", 1).prompts[0]
    assert list(client.push([make_group(prompt, "w", 0)]))[0].stored
    if method == "PullBatch":
        # Each waits (ten minutes) for a group that does not come: the one queued is taken first.
        assert len(client.pull(0, 1, 1).groups) == 1
        opening = buffer_pb2.PullRequest(rank=0, world_size=1, max_groups=1, wait_seconds=600)
    else:
        opening = make_group(prompt, "w", 0)  # a retry, acknowledged at once: then the stream waits for more
    with idle_streams(host.address, f"/zerobubble.v1.BufferService/{method}", [opening.SerializeToString()] * 1000,
                      client_streaming=method == "PushExperience"):
        assert statistics.median(health_check_seconds(host.address)) < 0.1
        started = time.monotonic()
        stats = client.stats(timeout=5)
        assert time.monotonic() - started < 1.0 and stats.groups_in == 1
