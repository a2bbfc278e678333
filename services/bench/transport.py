"""`zerobubble bench transport`: push-to-pull throughput through a real buffer process on loopback,
next to a plain loopback TCP socket moving the same bytes (the limit).

As in deployment, the pushing side (a rollout worker) and the pulling side (a trainer rank) are
processes of their own, and the puller commits once per training step, so the buffer's log
releases and reuses its segments as it does in a run.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from zerobubble.bench.transport_pusher import MIB, client_for, groups, template
from zerobubble.common.clients.buffer import BufferClient

# (name, trajectories, tokens per trajectory, groups at scale 1). 57,344 tokens of int32 ids and float32
# log-probs, times 8, is the 3.5 MiB item the reference's Ray buffer moved at about 44 per second.
CASES = [
    ("8x512 tokens", 8, 512, 4000),
    ("8x4096 tokens", 8, 4096, 1000),
    ("3.5 MiB", 8, 57_344, 300),
]
RAY_PUT_THEN_GET_PER_S = 44.0
COMMIT_EVERY = 64  # groups per training step

SOCKET_SINK = """
import socket, sys
listener = socket.create_server(("127.0.0.1", 0))
print(listener.getsockname()[1], flush=True)
connection, _ = listener.accept()
buffer = bytearray(4 << 20)
total = 0
while True:
    n = connection.recv_into(buffer)
    if not n:
        break
    total += n
connection.sendall(str(total).encode())
connection.close()
"""


class _BufferProcess:
    """A buffer service in its own process, as it runs in production, with its log in `folder`."""

    def __init__(self, folder: Path, prompts: int, fsync: str):
        row = {"messages": {"role": "user", "content": "?"}, "gt_answer": "1"}
        rows = (json.dumps({**row, "id": i}) for i in range(prompts))
        (folder / "prompts.jsonl").write_text("\n".join(rows) + "\n")
        config = {
            "server": {"listen": "127.0.0.1:0", "metrics_port": None, "grace_seconds": 1.0},
            "prompts": {"path": str(folder / "prompts.jsonl")},
            "capacity": {"max_groups": prompts},
            "wal": {"directory": str(folder / "wal"), "fsync": fsync},
        }
        (folder / "buffer.yaml").write_text(yaml.safe_dump(config))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "zerobubble.cli", "serve", "buffer", "--config", str(folder / "buffer.yaml")],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError("the buffer process did not start")
        self.address = json.loads(line)["address"]

    def close(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _pull_steps(client: BufferClient, count: int, commit_every: int, alive) -> int:
    """Pull `count` groups a training step of `commit_every` at a time, committing each step; the commits."""
    received = commits = 0
    while received < count:
        step = min(commit_every, count - received)
        got = last = 0
        while got < step:
            result = client.pull(0, 1, step - got, wait_seconds=5, timeout=60)
            if not result.groups and not alive():
                raise RuntimeError(f"the pusher stopped after {received + got} of {count} groups")
            got += len(result.groups)
            last = max(last, result.last_delivery)
        client.commit(last)
        received += got
        commits += 1
    return commits


def _stream_through(address: str, shape: tuple[int, int], count: int, commit_every: int,
                    errors: Path) -> tuple[float, int]:
    """Seconds to move `count` groups from a pushing process to this one, pulling and committing a training step
    at a time; and the commits made."""
    with open(errors, "w") as stderr:
        pusher = subprocess.Popen(
            [sys.executable, "-m", "zerobubble.bench.transport_pusher", address, *map(str, shape), str(count),
             "bench-stream"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True,
        )
    try:
        if pusher.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the pusher did not start:\n{errors.read_text()}")
        with client_for(address) as client:
            started = time.perf_counter()
            pusher.stdin.write("go\n")
            pusher.stdin.flush()
            commits = _pull_steps(client, count, commit_every, lambda: pusher.poll() is None)
            elapsed = time.perf_counter() - started
        report = json.loads(pusher.stdout.readline() or "null")
    finally:
        pusher.stdin.close()
        try:
            pusher.wait(30)
        except subprocess.TimeoutExpired:
            pusher.kill()
            pusher.wait()
    if report is None or report["stored"] != count:
        raise RuntimeError(f"the pusher stored {report and report['stored']} of {count} groups: "
                           f"{report and report['failures']}\n{errors.read_text()}")
    return elapsed, commits


def _put_then_get(client: BufferClient, like, count: int, commit_every: int) -> float:
    """Items per second with one in flight: push on an open stream, wait for the ack, pull the group, commit
    once per training step (the reference's measure, as a rollout worker keeps its push stream open)."""
    prompts = list(client.lease("bench", count).prompts)
    outgoing: queue.Queue = queue.Queue()
    acks = client.push(iter(outgoing.get, None), timeout=600)
    started = time.perf_counter()
    for i, group in enumerate(groups(like, prompts, "bench-one-by-one"), start=1):
        outgoing.put(group)
        if not next(acks).stored:
            raise RuntimeError("a put-then-get push was not stored")
        pulled = client.pull(0, 1, 1, wait_seconds=5)
        if len(pulled.groups) != 1:
            raise RuntimeError("a put-then-get pull came back empty")
        if i % commit_every == 0 or i == count:
            client.commit(pulled.last_delivery)
    elapsed = time.perf_counter() - started
    outgoing.put(None)
    list(acks)
    return count / elapsed


def socket_throughput(total_bytes: int, chunk_bytes: int) -> float:
    """Bytes per second through a plain loopback TCP connection to another process, in chunks."""
    sink = subprocess.Popen([sys.executable, "-c", SOCKET_SINK], stdout=subprocess.PIPE, text=True)
    try:
        port = int(sink.stdout.readline())
        chunk = os.urandom(chunk_bytes)
        with socket.create_connection(("127.0.0.1", port)) as connection:
            started = time.perf_counter()
            for _ in range(total_bytes // chunk_bytes):
                connection.sendall(chunk)
            connection.shutdown(socket.SHUT_WR)
            received = int(connection.recv(64))
            elapsed = time.perf_counter() - started
    finally:
        sink.wait(30)
    if received != total_bytes // chunk_bytes * chunk_bytes:
        raise RuntimeError(f"the socket sink received {received} bytes")
    return received / elapsed


def bench_transport(*, scale: float = 1.0, fsync: str = "interval", workdir: Path | None = None,
                    commit_every: int = COMMIT_EVERY) -> dict[str, Any]:
    """Measure every case of CASES with `scale` times its group count, the puller committing every
    `commit_every` groups; the figures as a JSON-able dict."""
    results: dict[str, Any] = {"benchmark": "transport", "fsync": fsync, "commit_every": commit_every, "cases": []}
    with tempfile.TemporaryDirectory(dir=workdir, prefix="zerobubble-bench-") as scratch:
        for index, (name, trajectories, tokens, groups_at_scale_1) in enumerate(CASES):
            count = max(10, int(groups_at_scale_1 * scale))
            like = template(trajectories, tokens)
            size = like.ByteSize()
            folder = Path(scratch) / f"case{index}"
            folder.mkdir()
            buffer = _BufferProcess(folder, count + 50, fsync)
            try:
                seconds, commits = _stream_through(buffer.address, (trajectories, tokens), count, commit_every,
                                                   folder / "pusher.log")
                with client_for(buffer.address) as client:
                    put_then_get = _put_then_get(client, like, 50, commit_every) if size > MIB else None
            finally:
                buffer.close()
            limit = socket_throughput(count * size, size)
            case = {
                "case": name,
                "group_bytes": size,
                "groups": count,
                "commits": commits,
                "seconds": round(seconds, 3),
                "groups_per_s": round(count / seconds, 1),
                "mb_per_s": round(count * size / seconds / 1e6, 1),
                "socket_mb_per_s": round(limit / 1e6, 1),
                "ratio_to_socket": round(count * size / seconds / limit, 3),
            }
            if put_then_get is not None:
                case["put_then_get_per_s"] = round(put_then_get, 1)
                case["reference_ray_put_then_get_per_s"] = RAY_PUT_THEN_GET_PER_S
            results["cases"].append(case)
    return results


if __name__ == "__main__":
    print(json.dumps(bench_transport(scale=float(sys.argv[1]) if len(sys.argv) > 1 else 1.0,
                                     commit_every=int(sys.argv[2]) if len(sys.argv) > 2 else COMMIT_EVERY)))
