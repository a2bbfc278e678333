"""`zerobubble bench transport`: push-to-pull throughput through a real buffer process on loopback,
next to a plain loopback TCP socket moving the same bytes (the limit)."""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from zerobubble.buffer.client import BufferClient
from zerobubble.common.codec import encode_array
from zerobubble.common.config import ClientConfig
from zerobubble.v1 import common_pb2

MIB = 1024 * 1024
# (name, trajectories, tokens per trajectory, groups at scale 1). 57,344 tokens of int32 ids and float32
# log-probs, times 8, is the 3.5 MiB item the reference's Ray buffer moved at about 44 per second.
CASES = [
    ("8x512 tokens", 8, 512, 4000),
    ("8x4096 tokens", 8, 4096, 1000),
    ("3.5 MiB", 8, 57_344, 300),
]
RAY_PUT_THEN_GET_PER_S = 44.0

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


def _template(trajectories: int, tokens: int) -> common_pb2.ExperienceGroup:
    rng = np.random.default_rng(0)
    group = common_pb2.ExperienceGroup(prompt_ids=encode_array(np.arange(256, dtype=np.int32)))
    for i in range(trajectories):
        group.trajectories.add(
            response_ids=encode_array(rng.integers(0, 150_000, tokens, dtype=np.int32)),
            behaviour_logprobs=encode_array(-rng.random(tokens, dtype=np.float32)),
            finish_reason=common_pb2.FINISH_REASON_STOP,
            reward=float(i % 2),
            answer_ok=bool(i % 2),
            temperature=1.0,
        )
    return group


def _groups(template: common_pb2.ExperienceGroup, prompts: list[common_pb2.Prompt], producer: str) -> Iterator:
    for sequence, prompt in enumerate(prompts):
        group = common_pb2.ExperienceGroup()
        group.CopyFrom(template)
        group.prompt.CopyFrom(prompt)
        group.producer_id = producer
        group.sequence = sequence
        yield group


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


def _stream_through(client: BufferClient, template: common_pb2.ExperienceGroup, count: int) -> float:
    """Seconds to push `count` groups on one stream while a trainer rank pulls them as they come."""
    prompts = []
    while len(prompts) < count:
        prompts.extend(client.lease("bench", min(1024, count - len(prompts))).prompts)
    failures: list[str] = []

    def push() -> None:
        acks = client.push(_groups(template, prompts, "bench-stream"), timeout=600)
        failures.extend(ack.error or ack.filtered for ack in acks if not ack.stored)

    started = time.perf_counter()
    pusher = threading.Thread(target=push, name="bench-push")
    pusher.start()
    received = 0
    while received < count:
        received += len(client.pull(0, 1, min(256, count - received), wait_seconds=5, timeout=60).groups)
    elapsed = time.perf_counter() - started
    pusher.join()
    if failures:
        raise RuntimeError(f"{len(failures)} pushes were not stored, e.g. {failures[0]}")
    return elapsed


def _put_then_get(client: BufferClient, template: common_pb2.ExperienceGroup, count: int) -> float:
    """Items per second with one in flight: push on an open stream, wait for the ack, pull the group
    (the reference's measure, as a rollout worker keeps its push stream open)."""
    prompts = list(client.lease("bench", count).prompts)
    outgoing: queue.Queue = queue.Queue()
    acks = client.push(iter(outgoing.get, None), timeout=600)
    started = time.perf_counter()
    for group in _groups(template, prompts, "bench-one-by-one"):
        outgoing.put(group)
        if not next(acks).stored:
            raise RuntimeError("a put-then-get push was not stored")
        if len(client.pull(0, 1, 1, wait_seconds=5).groups) != 1:
            raise RuntimeError("a put-then-get pull came back empty")
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


def bench_transport(*, scale: float = 1.0, fsync: str = "interval", workdir: Path | None = None) -> dict[str, Any]:
    """Measure every case of CASES with `scale` times its group count; the figures as a JSON-able dict."""
    results: dict[str, Any] = {"benchmark": "transport", "fsync": fsync, "cases": []}
    with tempfile.TemporaryDirectory(dir=workdir, prefix="zerobubble-bench-") as scratch:
        for index, (name, trajectories, tokens, groups) in enumerate(CASES):
            count = max(10, int(groups * scale))
            template = _template(trajectories, tokens)
            size = template.ByteSize()
            folder = Path(scratch) / f"case{index}"
            folder.mkdir()
            buffer = _BufferProcess(folder, count + 50, fsync)
            try:
                with BufferClient(ClientConfig(address=buffer.address, max_message_bytes=64 * MIB)) as client:
                    seconds = _stream_through(client, template, count)
                    put_then_get = _put_then_get(client, template, 50) if size > MIB else None
            finally:
                buffer.close()
            limit = socket_throughput(count * size, size)
            case = {
                "case": name,
                "group_bytes": size,
                "groups": count,
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
    print(json.dumps(bench_transport(scale=float(sys.argv[1]) if len(sys.argv) > 1 else 1.0)))
