"""The buffer service over a real loopback channel."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import grpc
import pytest
from buffer_helpers import PYTHON, make_group, prompt_key, prompts_of

from zerobubble.common.clients.buffer import BufferClient
from zerobubble.v1 import buffer_pb2, buffer_pb2_grpc

INVALID = grpc.StatusCode.INVALID_ARGUMENT.value[0]


def lease_all(client, count, worker="w"):
    return list(client.lease(worker, count).prompts)


def test_lease_push_pull_commit_round_trip(serve):
    host, client = serve(prompts=4)
    reply = client.lease("w", 10)
    assert len(reply.prompts) == 4 and reply.lease_id and reply.expires_in_seconds > 0
    acks = list(client.push(make_group(p, "w", i, lease_id=reply.lease_id) for i, p in enumerate(reply.prompts)))
    assert [(a.sequence, a.stored, a.code) for a in acks] == [(i, True, 0) for i in range(4)]
    client.complete(reply.lease_id)
    pulled = client.pull(0, 1, 10, wait_seconds=5)
    assert pulled.end_of_data and pulled.last_delivery == 4
    assert sorted(prompt_key(g.group) for g in pulled.groups) == sorted(prompt_key(p) for p in reply.prompts)
    client.commit(pulled.last_delivery)
    stats = client.stats()
    assert (stats.groups_in, stats.groups_out, stats.queued_groups, stats.end_of_data) == (4, 4, 0, True)
    assert client.lease("w", 1).end_of_data
    assert host.registry.get_sample_value("zerobubble_buffer_groups_in_total") == 4
    assert host.registry.get_sample_value("zerobubble_buffer_push_seconds_count") == 4
    assert host.registry.get_sample_value("zerobubble_buffer_pull_seconds_count") == 4


@pytest.mark.parametrize("read_ahead", [0, 2])
def test_bad_messages_are_refused_alone_and_the_stream_goes_on(serve, read_ahead):
    _, client = serve(prompts=6, run_spec__num_generations=4, capacity__max_group_bytes=8192,
                      push__read_ahead=read_ahead)
    prompts = lease_all(client, 6)
    torn = make_group(prompts[1], "w", 1)
    torn.trajectories[2].response_ids.data = b"\x00" * 3
    stranger = make_group(prompts[3], "w", 3)
    stranger.prompt.prompt_id = "nobody"
    huge = make_group(prompts[4], "w", 4, tokens=2048)
    short = make_group(prompts[5], "w", 5, generations=3)
    stream = [make_group(prompts[0], "w", 0), torn, make_group(prompts[2], "w", 2), stranger, huge, short]
    acks = list(client.push(stream))
    assert [a.code for a in acks] == [0, INVALID, 0, INVALID, INVALID, INVALID]
    assert "trajectories[2].response_ids.data" in acks[1].error
    assert "prompt.prompt_id" in acks[3].error
    assert acks[4].error.startswith("group:") and "trajectories:" in acks[5].error
    assert not any(a.stored for a in acks[1::2]) and client.stats().groups_in == 2
    retry = list(client.push([make_group(prompts[1], "w", 1)]))
    assert retry[0].stored, "nothing of the refused group was kept, and the service goes on"


def test_bad_unary_requests_are_invalid_argument_naming_the_field(serve):
    _, client = serve()
    calls = [
        (lambda: client.lease("w", 0), "count"),
        (lambda: client.complete("9.9"), "lease_id"),
        (lambda: client.pull(3, 2, 1), "rank"),
        (lambda: client.commit(99), "delivery"),
        (lambda: client.set_policy_version(-2), "version"),
    ]
    for call, field in calls:
        with pytest.raises(grpc.RpcError) as refused:
            call()
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.details().startswith(f"{field}:")
    assert client.stats().groups_in == 0


def test_a_retried_push_is_stored_once(serve):
    _, client = serve(prompts=4)
    groups = [make_group(p, "w", i) for i, p in enumerate(lease_all(client, 4))]
    assert all(a.stored for a in client.push(groups[:3]))
    again = list(client.push(groups))
    assert [a.stored for a in again] == [False, False, False, True]
    assert all("duplicate" in a.filtered for a in again[:3])
    assert client.stats().groups_in == 4 and len(client.pull(0, 1, 10).groups) == 4


@pytest.mark.parametrize("read_ahead", [0, 2])
def test_a_full_buffer_holds_pushes_until_the_trainer_pulls(serve, read_ahead):
    host, client = serve(prompts=5, capacity__max_groups=2, push__read_ahead=read_ahead)
    prompts = prompts_of(host.core, 5)
    acks = []
    pusher = threading.Thread(target=lambda: acks.extend(client.push(make_group(p, "w", i)
                                                                   for i, p in enumerate(prompts))))
    pusher.start()
    deadline = time.monotonic() + 5
    while len(acks) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    pusher.join(0.4)
    assert len(acks) == 2 and pusher.is_alive()
    assert client.stats().queued_groups == 2
    pulled = client.pull(0, 1, 5, wait_seconds=5)
    pusher.join(5)
    assert len(acks) == 5 and all(a.stored for a in acks)
    assert len(pulled.groups) + len(client.pull(0, 1, 5).groups) == 5


def test_a_waiting_push_whose_caller_left_stores_nothing(serve):
    host, client = serve(prompts=2, capacity__max_groups=1)
    first, second = prompts_of(host.core, 2)
    assert list(client.push([make_group(first, "w", 0)]))[0].stored
    waiting = client.push(iter([make_group(second, "w", 1)]))
    time.sleep(0.5)
    waiting.cancel()
    assert len(client.pull(0, 1, 1).groups) == 1, "room at last, but the push that waited for it is gone"
    time.sleep(0.5)
    assert client.stats().groups_in == 1
    assert list(client.push([make_group(second, "w", 1)]))[0].stored, "nothing of it was kept"


def test_each_group_goes_to_exactly_one_rank(serve):
    _, client = serve(prompts=40)
    prompts = lease_all(client, 40)
    received: dict[int, list] = {0: [], 1: []}

    def rank(r):
        with BufferClient(client.config) as own:
            while sum(map(len, received.values())) < 40:
                received[r].extend(own.pull(r, 2, 3, wait_seconds=0.2).groups)

    pullers = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for puller in pullers:
        puller.start()
    assert all(a.stored for a in client.push(make_group(p, "w", i) for i, p in enumerate(prompts)))
    for puller in pullers:
        puller.join(10)
    keys = [prompt_key(g.group) for r in (0, 1) for g in received[r]]
    assert len(keys) == len(set(keys)) == 40
    deliveries = [g.delivery for r in (0, 1) for g in received[r]]
    assert sorted(deliveries) == list(range(1, 41))


DOOMED_WORKER = """
import sys, time
sys.path.insert(0, {here!r})
from buffer_helpers import make_group
from zerobubble.common.clients.buffer import BufferClient
client = BufferClient({address!r})
reply = client.lease("doomed", 3)
list(client.push([make_group(reply.prompts[0], "doomed", 0)]))
print(" ".join(p.prompt_id for p in reply.prompts), flush=True)
time.sleep(60)
"""


def test_exactly_once_per_epoch_with_two_workers_one_killed_mid_lease(serve):
    host, client = serve(prompts=6, prompts__epochs=2, leases__timeout_seconds=1.0)
    script = DOOMED_WORKER.format(here=str(Path(__file__).parent), address=host.address)
    doomed = subprocess.Popen([PYTHON, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        held = doomed.stdout.readline().split()
        assert len(held) == 3
    finally:
        doomed.kill()
        doomed.wait()
    sequence = 0
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        reply = client.lease("survivor", 2)
        if reply.end_of_data:
            break
        groups = []
        for prompt in reply.prompts:
            groups.append(make_group(prompt, "survivor", sequence))
            sequence += 1
        assert all(a.code == 0 for a in client.push(groups))
        if reply.prompts:
            client.complete(reply.lease_id)
        else:
            time.sleep(0.05)
    pulled = client.pull(0, 1, 100, wait_seconds=1)
    keys = [prompt_key(g.group) for g in pulled.groups]
    assert pulled.end_of_data
    assert sorted(keys) == sorted((str(i), e) for i in range(6) for e in range(2)), "each once per epoch"
    stats = client.stats()
    assert stats.lease_expirations >= 1
    producer_of = {prompt_key(g.group): g.group.producer_id for g in pulled.groups}
    assert producer_of[(held[0], 0)] == "doomed", "the dead worker's acknowledged group is kept"
    assert {producer_of[(prompt_id, 0)] for prompt_id in held[1:]} == {"survivor"}


def test_prompts_travel_in_both_formats(serve):
    _, client = serve(prompts=2)
    prompts = {p.prompt_id: p for p in lease_all(client, 2)}
    assert prompts["0"].gt_answer == "1"
    assert list(prompts["1"].test_cases.inputs) == ["1\n"] and list(prompts["1"].test_cases.outputs) == ["2\n"]
    assert json.loads(prompts["1"].messages_json) == [{"role": "user", "content": "What is 1 + 1?"}]


def test_the_run_spec_is_served_as_the_buffer_holds_it(serve):
    host, client = serve(prompts=2, run_spec__algorithm="dapo", run_spec__num_generations=4,
                         run_spec__max_staleness=1, run_spec__model__vocab_size=300)
    spec = client.run_spec(timeout=5)
    assert spec == host.core.config.run_spec
    # The preset's run defaults came with it: DAPO's dynamic sampling and annealing.
    assert (spec.algorithm, spec.num_generations, spec.max_staleness, spec.model.vocab_size) == ("DAPO", 4, 1, 300)
    assert spec.filter_range == (0.01, 0.99) and spec.sampling.temperature_annealing
    # On the wire it is the schema's JSON, which a client of another language reads as well.
    with grpc.insecure_channel(host.address) as channel:
        reply = buffer_pb2_grpc.BufferServiceStub(channel).GetRunSpec(buffer_pb2.GetRunSpecRequest(), timeout=5)
    assert json.loads(reply.spec_json)["max_staleness"] == 1
