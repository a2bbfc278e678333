"""Weight-sync test parts: a tiny Qwen2 model, a stand-in engine, a trainer service on loopback, and rollout
worker processes (this file is also their entry point) that report every version they load as JSON lines.

    python sync_helpers.py --address HOST:PORT --worker-id w1

A worker started with a token finds it in $ZEROBUBBLE_AUTH_TOKEN, as a service under `zerobubble up` does.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from prometheus_client import CollectorRegistry
from transformers import Qwen2Config, Qwen2ForCausalLM

from zerobubble.common.config import TOKEN_ENV, ClientConfig, ServerConfig
from zerobubble.common.server import ServiceHost
from zerobubble.trainer.broadcaster import WeightBroadcaster
from zerobubble.trainer.servicer import SERVICE, TrainerServicer
from zerobubble.trainer.sync_config import WeightSyncConfig
from zerobubble.v1 import trainer_pb2_grpc

HERE = Path(__file__).resolve().parent


def tiny_model(seed: int, dtype: torch.dtype = torch.float32) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    return Qwen2ForCausalLM(config).to(dtype).eval()


def digests(named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, str]:
    """sha256 of each tensor's bytes: equal digests mean bit-exact weights."""
    return {name: hashlib.sha256(t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
            for name, t in named}


class StandInEngine:
    """What a rollout engine offers the receiver: load_weights copies into the model in place."""

    def __init__(self, model: Qwen2ForCausalLM):
        self.model = model
        self.policy_version = 0
        self.params = dict(model.named_parameters())

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        with torch.no_grad():
            for name, tensor in weights:
                self.params[name].copy_(tensor)
        self.policy_version = version


class StubControl:
    def __init__(self):
        self.step = 0
        self.state = "training"

    def status(self) -> dict:
        return {"step": self.step, "policy_version": self.step, "last_checkpoint": "", "state": self.state}

    def save_checkpoint(self, tag: str) -> tuple[str, int]:
        return f"/checkpoints/{tag or self.step}", self.step


@dataclass
class TrainerHandle:
    broadcaster: WeightBroadcaster
    host: ServiceHost
    control: StubControl
    registry: CollectorRegistry

    @property
    def address(self) -> str:
        return self.host.address

    def wait_members(self, ids: set[str], timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while set(self.broadcaster.members) != ids:
            assert time.monotonic() < deadline, f"members {self.broadcaster.members}, expected {sorted(ids)}"
            time.sleep(0.02)

    def metric(self, name: str) -> float:
        return self.registry.get_sample_value(name) or 0.0


@contextmanager
def trainer_service(listen: str = "127.0.0.1:0", token_file: Path | None = None,
                    **sync: Any) -> Iterator[TrainerHandle]:
    """A trainer service on loopback: the real broadcaster and servicer, a stub training loop; with `token_file`,
    every call but health checks must carry the token in it."""
    registry = CollectorRegistry()
    broadcaster = WeightBroadcaster(WeightSyncConfig(**sync), registry).start()
    control = StubControl()
    server = ServerConfig(listen=listen, metrics_port=None, grace_seconds=0, auth_token_file=token_file)
    host = ServiceHost("trainer", server, registry)
    host.add(trainer_pb2_grpc.add_TrainerServiceServicer_to_server,
             TrainerServicer(broadcaster, control), SERVICE.full_name)
    host.start()
    try:
        yield TrainerHandle(broadcaster, host, control, registry)
    finally:
        host.stop(0)
        broadcaster.close()


class WorkerProcess:
    """A rollout worker in its own process; `expect` waits for a reported event."""

    def __init__(self, address: str, worker_id: str, *, device: str = "cpu", token: str | None = None):
        self.worker_id = worker_id
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}
        env.pop(TOKEN_ENV, None)
        if token is not None:
            env[TOKEN_ENV] = token
        self.process = subprocess.Popen(
            [sys.executable, str(HERE / "sync_helpers.py"), "--address", address, "--worker-id", worker_id,
             "--device", device],
            stdout=subprocess.PIPE, text=True, env=env,
        )
        self.events: queue.Queue[dict] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            if line.startswith("{"):
                self.events.put(json.loads(line))

    def expect(self, predicate: Callable[[dict], bool], timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{self.worker_id}: no matching event within {timeout}s")
            try:
                event = self.events.get(timeout=min(left, 1.0))
            except queue.Empty:
                if self.process.poll() is not None:
                    raise AssertionError(f"{self.worker_id} exited with {self.process.returncode}") from None
                continue
            if predicate(event):
                return event

    def applied(self, version: int, timeout: float = 60.0) -> dict:
        return self.expect(lambda e: e["event"] == "applied" and e["version"] >= version, timeout)

    def signal(self, signum: int) -> None:
        os.kill(self.process.pid, signum)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _worker_main() -> None:
    from zerobubble.common.clients.trainer import TrainerClient
    from zerobubble.rollout.weight_receiver import WeightReceiver

    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True)
    parser.add_argument("--worker-id", required=True)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(1)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    engine = StandInEngine(tiny_model(seed=12345))
    trainer = ClientConfig(address=args.address, auth_token_env=TOKEN_ENV if TOKEN_ENV in os.environ else None)
    with TrainerClient(trainer) as client:
        receiver = WeightReceiver(client, args.worker_id, args.device, first_backoff_s=0.05,
                                  max_backoff_s=0.5).start()
        print(json.dumps({"event": "started"}), flush=True)
        while not stop.wait(0.02):
            if receiver.apply_to(engine):
                print(json.dumps({
                    "event": "applied", "version": engine.policy_version,
                    "digests": digests(engine.model.named_parameters()),
                    "pointers": [b.data_ptr() for b in receiver.buffers],
                }), flush=True)
        receiver.close()
    # Interpreter teardown of torch and grpc takes seconds on a busy machine; nothing is left to flush.
    os._exit(0)


if __name__ == "__main__":
    _worker_main()
