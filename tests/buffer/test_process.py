"""The buffer as its own process: kill -9 and restart, a corrupt log tail, SIGTERM, config errors."""

from __future__ import annotations

import signal
import subprocess
import threading

import grpc
import pytest
from buffer_helpers import PYTHON, BufferProcess, make_group, prompt_key

from zerobubble.buffer.wal import HEADER, REUSED


@pytest.fixture
def buffer_process(tmp_path):
    made = []

    def make(**overrides):
        made.append(BufferProcess(tmp_path, **overrides))
        return made[-1]

    yield make
    for process in made:
        if process.process is not None and process.process.poll() is None:
            process.process.kill()
            process.process.wait()


@pytest.mark.parametrize("fsync", ["never", "always"])
def test_kill_9_during_a_push_storm_loses_and_duplicates_nothing(buffer_process, fsync):
    server = buffer_process(prompts=600, capacity__max_groups=4096, wal__fsync=fsync)
    client = server.start()
    prompts = list(client.lease("w", 600).prompts)
    groups = [make_group(p, "storm", i, tokens=512) for i, p in enumerate(prompts)]
    acks = []
    killed = threading.Event()

    def kill_after_some_acks():
        for ack in client.push(groups, timeout=30):
            acks.append(ack)
            if len(acks) == 150:
                server.process.kill()
                killed.set()

    with pytest.raises(grpc.RpcError):
        kill_after_some_acks()
    assert killed.is_set() and 150 <= len(acks) < 600
    acknowledged = {prompt_key(groups[a.sequence]) for a in acks if a.stored}

    client = server.start()
    first = client.pull(0, 1, 600)
    first_keys = [prompt_key(g.group) for g in first.groups]
    assert len(first_keys) == len(set(first_keys)), "nothing stored twice"
    assert acknowledged <= set(first_keys), "every acknowledged group survived"
    remaining = {p.prompt_id for p in client.lease("w", 600).prompts}
    assert remaining == {p.prompt_id for p in prompts} - {key[0] for key in first_keys}, "epoch position kept"

    retried = list(client.push(groups, timeout=30))
    assert sum(a.stored for a in retried) == 600 - len(first_keys)
    second = [prompt_key(g.group) for g in client.pull(0, 1, 600).groups]
    assert sorted(first_keys + second) == sorted(prompt_key(p) for p in prompts)
    assert server.stop(signal.SIGTERM) == 0


def test_kill_9_during_concurrent_pushes_keeps_every_group_acknowledged_under_group_commit(buffer_process):
    # Four streams push at once with fsync "always": their records share fsyncs (group commit), and an ack
    # still means the group's record is on disk, so every one acknowledged before the kill is there after it.
    streams, per_stream = 4, 150
    server = buffer_process(prompts=streams * per_stream, capacity__max_groups=4096, wal__fsync="always")
    client = server.start()
    prompts = list(client.lease("w", streams * per_stream).prompts)
    groups = [make_group(p, f"stream{i % streams}", i // streams, tokens=512) for i, p in enumerate(prompts)]
    acks: list[list] = [[] for _ in range(streams)]
    started, killed = threading.Barrier(streams), threading.Event()

    def push(stream: int) -> None:
        started.wait(10)
        try:
            for ack in client.push(groups[stream::streams], timeout=30):
                acks[stream].append(ack)
                if sum(map(len, acks)) >= 200 and not killed.is_set():
                    killed.set()
                    server.process.kill()
        except grpc.RpcError:
            pass

    pushers = [threading.Thread(target=push, args=(i,)) for i in range(streams)]
    for thread in pushers:
        thread.start()
    for thread in pushers:
        thread.join(60)
    assert killed.is_set() and sum(map(bool, acks)) >= 2, "streams were pushing side by side when it was killed"
    acknowledged = {prompt_key(groups[a.sequence * streams + int(a.producer_id[6:])])
                    for stream in acks for a in stream if a.stored}
    assert 200 <= len(acknowledged) < streams * per_stream

    client = server.start()
    kept = [prompt_key(g.group) for g in client.pull(0, 1, streams * per_stream).groups]
    assert len(kept) == len(set(kept)), "nothing stored twice"
    assert acknowledged <= set(kept), "every acknowledged group survived"
    assert server.stop(signal.SIGTERM) == 0


def test_kill_9_while_segments_are_reused_keeps_exactly_the_uncommitted_groups(buffer_process, tmp_path):
    # Groups of about 16 KiB: a segment every dozen groups, released once its groups are committed.
    server = buffer_process(prompts=400, capacity__max_groups=4096, wal__fsync="never", wal__segment_bytes=200_000)
    client = server.start()
    prompts = list(client.lease("w", 400).prompts)
    groups = [make_group(p, "storm", i, tokens=512) for i, p in enumerate(prompts)]
    assert all(a.stored for a in client.push(groups[:200], timeout=30))
    committed = 0
    while committed < 192:  # training steps of eight groups
        committed = client.pull(0, 1, 8).last_delivery
        client.commit(committed)
    uncommitted = [prompt_key(g.group) for g in client.pull(0, 1, 8).groups]
    acks = []
    with pytest.raises(grpc.RpcError):
        for ack in client.push(groups[200:], timeout=30):
            acks.append(ack)
            if len(acks) == 100:
                server.process.kill()
    acknowledged = [prompt_key(groups[a.sequence]) for a in acks if a.stored]
    headers = [HEADER.unpack(p.read_bytes()[:HEADER.size]) for p in (tmp_path / "wal").glob("*.wal")]
    assert any(flags & REUSED for _, _, flags in headers), "segments were written into reused files"

    client = server.start()
    client.commit(committed, resume=True)
    again = [prompt_key(g.group) for g in client.pull(0, 1, 400).groups]
    assert again[:8] == uncommitted, "the uncommitted step comes again, first"
    assert len(again) == len(set(again)) and set(acknowledged) <= set(again[8:])
    assert {key[0] for key in again[8:]} <= {p.prompt_id for p in prompts[200:]}, "no committed group again"
    assert server.stop(signal.SIGTERM) == 0


def test_a_corrupt_log_tail_is_reported_and_skipped(buffer_process, tmp_path):
    server = buffer_process(prompts=5)
    client = server.start()
    prompts = list(client.lease("w", 5).prompts)
    assert all(a.stored for a in client.push(make_group(p, "w", i) for i, p in enumerate(prompts)))
    assert server.stop(signal.SIGTERM) == 0, "SIGTERM is a clean shutdown"
    (segment,) = (tmp_path / "wal").glob("*.wal")
    segment.write_bytes(segment.read_bytes()[:-10])

    client = server.start()
    assert "skipped the last" in server.log.read_text()
    survivors = [prompt_key(g.group) for g in client.pull(0, 1, 10).groups]
    assert survivors == [prompt_key(p) for p in prompts[:4]]
    (again,) = client.lease("w", 5).prompts
    assert prompt_key(again) == prompt_key(prompts[4])
    assert list(client.push([make_group(again, "w", 4)]))[0].stored
    assert server.stop(signal.SIGTERM) == 0


def test_a_bad_setting_is_named_and_the_process_exits(tmp_path):
    (tmp_path / "p.jsonl").write_text('{"prompt": "1+1?", "gt_answer": "2"}\n')
    result = subprocess.run(
        [PYTHON, "-m", "zerobubble", "serve", "buffer", "--set", f"prompts.path={tmp_path}/p.jsonl",
         "--set", "run_spec.filter_range=[0.9, 0.1]"],
        capture_output=True, text=True, timeout=30,
    )
    assert result.returncode == 2 and "run_spec.filter_range" in result.stderr
    result = subprocess.run(
        [PYTHON, "-m", "zerobubble", "serve", "buffer", "--set", f"prompts.path={tmp_path}/absent.jsonl",
         "--set", f"wal.directory={tmp_path}/wal"],
        capture_output=True, text=True, timeout=30,
    )
    assert result.returncode == 2 and "absent.jsonl: cannot read" in result.stderr
