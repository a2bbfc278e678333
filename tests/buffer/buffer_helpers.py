"""Buffer test helpers: prompt files written per test, groups made to order."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from zerobubble.buffer.config import BufferServiceConfig
from zerobubble.common.clients.buffer import BufferClient
from zerobubble.common.codec import encode_array
from zerobubble.common.config import ClientConfig, load_config
from zerobubble.v1 import common_pb2

PYTHON = sys.executable


def write_prompts(path: Path, count: int) -> Path:
    """`count` math prompts, with the odd ones in the code format, one message object or a list."""
    with open(path, "w") as f:
        for i in range(count):
            row: dict[str, Any] = {"messages": {"role": "user", "content": f"What is {i} + 1?"}}
            if i % 2:
                tests = {"inputs": [f"{i}\n"], "outputs": [f"{i + 1}\n"]}
                row = {"messages": [row["messages"]], "test_cases": tests}
            else:
                row["gt_answer"] = str(i + 1)
            f.write(json.dumps(row) + "\n")
    return path


def settings(tmp_path: Path, prompts: int = 8, **overrides: Any) -> dict[str, Any]:
    """Dotted settings for a buffer in tmp_path; `overrides` use '__' for '.' (wal__fsync='never')."""
    values = {
        "prompts.path": str(write_prompts(tmp_path / "prompts.jsonl", prompts)),
        "wal.directory": str(tmp_path / "wal"),
        "wal.fsync": "never",
        "server.listen": "127.0.0.1:0",
        "server.metrics_port": None,
        "server.grace_seconds": 0.5,
        "run_spec.num_generations": 4,   # make_group's default
    }
    values.update({key.replace("__", "."): value for key, value in overrides.items()})
    return values


def make_config(tmp_path: Path, prompts: int = 8, **overrides: Any) -> BufferServiceConfig:
    return load_config(BufferServiceConfig, None, settings(tmp_path, prompts, **overrides))


def make_group(
    prompt: common_pb2.Prompt,
    producer: str = "worker-0",
    sequence: int = 0,
    *,
    generations: int = 4,
    tokens: int = 8,
    correct: int | None = None,
    version: int = 0,
    lease_id: str = "",
) -> common_pb2.ExperienceGroup:
    """A well-formed group; `correct` trajectories have answer_ok (half of them when None)."""
    correct = generations // 2 if correct is None else correct
    group = common_pb2.ExperienceGroup(
        prompt=prompt,
        prompt_ids=encode_array(np.arange(5, dtype=np.int32)),
        producer_id=producer,
        sequence=sequence,
        lease_id=lease_id,
    )
    for i in range(generations):
        group.trajectories.add(
            response_ids=encode_array(np.full(tokens, i + 1, dtype=np.int32)),
            behaviour_logprobs=encode_array(np.full(tokens, -0.5, dtype=np.float32)),
            finish_reason=common_pb2.FINISH_REASON_STOP,
            reward=1.0 if i < correct else 0.0,
            answer_ok=i < correct,
            policy_version=version,
            temperature=1.0,
        )
    return group


def prompt_key(item: common_pb2.ExperienceGroup | common_pb2.Prompt) -> tuple[str, int]:
    prompt = item.prompt if isinstance(item, common_pb2.ExperienceGroup) else item
    return prompt.prompt_id, prompt.epoch


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def prompts_of(buffer, count: int) -> list[common_pb2.Prompt]:
    """The first `count` prompts of the buffer's file, without a lease: a lease never hands out more prompts
    than the queue has room for, and the tests of a full queue need more groups than that."""
    return [row.to_message(0) for row in buffer.source.rows[:count]]


class BufferProcess:
    """`zerobubble serve buffer` on a port of its own choosing; the same log folder on every start."""

    def __init__(self, tmp_path, **overrides):
        self.config = tmp_path / "buffer.yaml"
        tree: dict = {}
        for dotted, value in settings(tmp_path, **overrides).items():
            *sections, key = dotted.split(".")
            node = tree
            for section in sections:
                node = node.setdefault(section, {})
            node[key] = value
        self.config.write_text(yaml.safe_dump(tree))
        self.log = tmp_path / "buffer.log"
        self.process: subprocess.Popen | None = None

    def start(self) -> BufferClient:
        with open(self.log, "a") as log:
            self.process = subprocess.Popen(
                [PYTHON, "-m", "zerobubble", "serve", "buffer", "--config", str(self.config)],
                stdout=subprocess.PIPE, stderr=log, text=True,
            )
        line = self.process.stdout.readline()
        assert line, f"the buffer did not start:\n{self.log.read_text()}"
        address = json.loads(line)["address"]
        return BufferClient(ClientConfig(address=address, timeout_seconds=10, retry_seconds=0))

    def stop(self, sig: int) -> int:
        self.process.send_signal(sig)
        return self.process.wait(10)


class CuttableProxy:
    """A loopback TCP proxy in front of `target` whose open connections can be cut at once, as a network drop
    would; new connections go through again."""

    def __init__(self, target: str):
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.connections: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            with self.lock:
                self.connections += [client, server]
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for end in (source, sink):
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        with self.lock:
            cut, self.connections = self.connections, []
        for connection in cut:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            connection.close()

    def close(self) -> None:
        self.listener.close()
        self.cut()
