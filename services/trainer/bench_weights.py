"""`zerobubble bench weights`: weight broadcast to one receiver process over gloo on loopback.

For each model size (Qwen2 architecture, random init): the bucketed broadcast this project uses, the
reference's one broadcast call per tensor, and one flat tensor of the same bytes (the limit), all in
the same run against the same receiver; the receiver's time to load the weights into a transformers
model. Then a training step (forward, backward, AdamW) of the smallest size alone, and with a
publish after every step so a broadcast runs in the background through the real broadcaster, trainer
service and weight receiver.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from datetime import timedelta
from statistics import median

import torch
from torch.distributed import TCPStore
from transformers import Qwen2Config, Qwen2ForCausalLM

from zerobubble.common.weight_sync import MIB, Manifest, form_group, start_broadcast, wait_broadcast

# Parameter counts with tied embeddings: tiny ~0.1M (tests), 125m ~128M, 500m ~494M (Qwen2.5-0.5B's shape).
SIZES: dict[str, dict] = {
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2),
    "125m": dict(vocab_size=32_000, hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                 num_attention_heads=12, num_key_value_heads=4),
    "500m": dict(vocab_size=151_936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2),
}
TIMEOUT_S = 600.0


def build_model(size: str, dtype: torch.dtype, seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(**SIZES[size], tie_word_embeddings=True)
    return Qwen2ForCausalLM(config).to(dtype)


class StandInEngine:
    """load_weights as a transformers engine does it: copy each tensor into the model's parameter."""

    def __init__(self, model: torch.nn.Module):
        self.params = dict(model.named_parameters())
        self.policy_version = 0

    def load_weights(self, weights, version: int) -> None:
        with torch.no_grad():
            for name, tensor in weights:
                self.params[name].copy_(tensor)
        self.policy_version = version


def _barrier(group) -> None:
    wait_broadcast([group.allreduce([torch.zeros(1)])])


def _modes(model: torch.nn.Module, manifest: Manifest, buffers: list[torch.Tensor]) -> dict:
    """The three ways of moving the same weights; each is a list of tensors, broadcast one call per tensor."""
    params = [p.data for _, p in model.named_parameters()]
    return {"bucketed": buffers, "per_tensor": params, "flat": [torch.empty(manifest.total_bytes, dtype=torch.uint8)]}


def _send(group, tensors: list[torch.Tensor], one_at_a_time: bool) -> None:
    if one_at_a_time:
        for tensor in tensors:
            wait_broadcast(start_broadcast(group, [tensor]))
    else:
        wait_broadcast(start_broadcast(group, tensors))


def _raw_child(port: int, size: str, dtype_name: str, bucket_mb: float, repeats: int) -> None:
    """Rank 1: receive every mode `repeats` times, then time loading into a transformers model."""
    dtype = getattr(torch, dtype_name)
    store = TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=TIMEOUT_S))
    model = build_model(size, dtype, seed=1)
    manifest = Manifest.plan(model.named_parameters(), int(bucket_mb * MIB))
    buffers = manifest.allocate()
    group = form_group(store, 1, 1, 2, backend="gloo", timeout_s=TIMEOUT_S, address="127.0.0.1")
    targets = _modes(model, manifest, buffers)
    for _ in range(repeats):
        for mode, tensors in targets.items():
            _barrier(group)
            _send(group, tensors, one_at_a_time=mode == "per_tensor")
            _barrier(group)
    engine = StandInEngine(model)
    loads = []
    for version in range(1, repeats + 1):
        started = time.perf_counter()
        engine.load_weights(manifest.views(buffers), version)
        loads.append(time.perf_counter() - started)
    store.set("load_seconds", json.dumps(loads))
    _barrier(group)


def _measure_size(size: str, dtype: torch.dtype, bucket_mb: float, repeats: int) -> dict:
    model = build_model(size, dtype)
    manifest = Manifest.plan(model.named_parameters(), int(bucket_mb * MIB))
    buffers = manifest.allocate()
    manifest.pack(model.named_parameters(), buffers)
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=TIMEOUT_S))
    child = subprocess.Popen([sys.executable, "-m", __name__, "raw", str(store.port), size, str(dtype).split(".")[-1],
                              str(bucket_mb), str(repeats)])
    try:
        group = form_group(store, 1, 0, 2, backend="gloo", timeout_s=TIMEOUT_S, address="127.0.0.1")
        sources = _modes(model, manifest, buffers)
        times: dict[str, list[float]] = {mode: [] for mode in sources}
        for _ in range(repeats):
            for mode, tensors in sources.items():
                _barrier(group)
                started = time.perf_counter()
                _send(group, tensors, one_at_a_time=mode == "per_tensor")
                _barrier(group)
                times[mode].append(time.perf_counter() - started)
        store.wait(["load_seconds"])
        loads = json.loads(store.get("load_seconds"))
        _barrier(group)
    finally:
        if child.wait(timeout=TIMEOUT_S) != 0:
            raise RuntimeError(f"bench receiver exited with {child.returncode}")
    gb = manifest.total_bytes / 1e9
    result = {"size": size, "parameters": sum(p.numel() for p in model.parameters()), "bytes": manifest.total_bytes,
              "tensors": len(manifest.names), "buckets": len(manifest.buckets)}
    for mode, seconds in times.items():
        result[f"{mode}_seconds"] = median(seconds)
        result[f"{mode}_gb_per_s"] = gb / median(seconds)
    result["bucketed_speedup_over_per_tensor"] = result["per_tensor_seconds"] / result["bucketed_seconds"]
    result["load_seconds"] = median(loads)
    return result


def _receiver_child(address: str, size: str, dtype_name: str) -> None:
    """A rollout worker's side: a WeightReceiver loading every version it gets into a transformers model,
    until its standard input closes."""
    from zerobubble.rollout.weight_receiver import WeightReceiver
    from zerobubble.trainer.client import TrainerClient

    engine = StandInEngine(build_model(size, getattr(torch, dtype_name), seed=1))
    done = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    with TrainerClient(address) as client:
        receiver = WeightReceiver(client, "bench-receiver").start()
        while not done.wait(0.01):
            receiver.apply_to(engine)
        receiver.close()


def _train_steps(model: torch.nn.Module, optimizer, batch: torch.Tensor, steps: int, after_step) -> list[float]:
    times = []
    for step in range(steps):
        started = time.perf_counter()
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        after_step(step)
        times.append(time.perf_counter() - started)
    return times


def _measure_step(size: str, steps: int, batch_size: int, seq_len: int, sync_dtype: torch.dtype,
                  bucket_mb: float) -> dict:
    from zerobubble.common.config import ServerConfig
    from zerobubble.common.server import ServiceHost
    from zerobubble.trainer.broadcaster import WeightBroadcaster, WeightSyncConfig
    from zerobubble.trainer.servicer import SERVICE, TrainerServicer
    from zerobubble.v1 import trainer_pb2_grpc

    model = build_model(size, torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    batch = torch.randint(0, model.config.vocab_size, (batch_size, seq_len))
    _train_steps(model, optimizer, batch, 1, lambda step: None)  # warm-up: optimizer state, allocator
    alone = _train_steps(model, optimizer, batch, steps, lambda step: None)

    broadcaster = WeightBroadcaster(WeightSyncConfig(bucket_mb=bucket_mb, member_timeout_s=TIMEOUT_S)).start()
    host = ServiceHost("trainer", ServerConfig(metrics_port=None, grace_seconds=0))
    host.add(trainer_pb2_grpc.add_TrainerServiceServicer_to_server, TrainerServicer(broadcaster, _NoTraining()),
             SERVICE.full_name)
    host.start()
    child = subprocess.Popen([sys.executable, "-m", __name__, "receiver", host.address, size,
                              str(sync_dtype).split(".")[-1]], stdin=subprocess.PIPE)
    try:
        while broadcaster.members != ["bench-receiver"]:
            time.sleep(0.05)

        def named():
            return ((name, p.detach().to(sync_dtype)) for name, p in model.named_parameters())

        started = time.perf_counter()
        broadcaster.publish(named(), 0)
        broadcaster.wait_synced(0, TIMEOUT_S)
        first_sync = time.perf_counter() - started
        publish_seconds = []

        def publish(step: int) -> None:
            begun = time.perf_counter()
            broadcaster.publish(named(), step + 1)
            publish_seconds.append(time.perf_counter() - begun)

        synced_before = broadcaster.status()["synced_version"]
        with_sync = _train_steps(model, optimizer, batch, steps, publish)
        synced_during = broadcaster.status()["synced_version"] - synced_before
        broadcaster.wait_synced(steps, TIMEOUT_S)
    finally:
        child.stdin.close()
        child.wait(timeout=60)
        host.stop(0)
        broadcaster.close()
    return {
        "size": size, "batch": [batch_size, seq_len], "steps": steps,
        "step_seconds": median(alone), "step_seconds_with_sync": median(with_sync),
        "ratio": median(with_sync) / median(alone),
        "publish_seconds": median(publish_seconds),
        "end_to_end_sync_seconds": first_sync,
        "versions_synced_while_training": synced_during,
    }


class _NoTraining:
    def status(self) -> dict:
        return {"step": 0, "policy_version": 0, "last_checkpoint": ""}

    def save_checkpoint(self, tag: str) -> tuple[str, int]:
        return "", 0


def bench_weights(sizes: list[str], repeats: int = 3, dtype: str = "bfloat16", bucket_mb: float = 256.0,
                  step_size: str | None = None, steps: int = 5, batch_size: int = 2, seq_len: int = 64) -> dict:
    torch_dtype = getattr(torch, dtype)
    step_size = step_size or sizes[0]
    return {
        "dtype": dtype, "bucket_mb": bucket_mb, "repeats": repeats, "torch_threads": torch.get_num_threads(),
        "broadcast": [_measure_size(size, torch_dtype, bucket_mb, repeats) for size in sizes],
        "train_step": _measure_step(step_size, steps, batch_size, seq_len, torch_dtype, bucket_mb),
    }


def _measure(args) -> dict:
    return bench_weights([s.strip() for s in args.sizes.split(",") if s.strip()], repeats=args.repeats,
                         dtype=args.dtype, bucket_mb=args.bucket_mb, step_size=args.step_size, steps=args.steps,
                         batch_size=args.batch_size, seq_len=args.seq_len)


def register_bench(bench_subparsers) -> None:
    parser = bench_subparsers.add_parser(
        "weights", help="bucketed vs per-tensor vs flat weight broadcast, load time, train step with a sync running")
    parser.add_argument("--sizes", default="125m,500m", help=f"comma-separated, from {', '.join(SIZES)}")
    parser.add_argument("--repeats", type=int, default=3, help="broadcasts per mode and size (the median is reported)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"],
                        help="dtype of the broadcast weights")
    parser.add_argument("--bucket-mb", type=float, default=256.0)
    parser.add_argument("--step-size", help="model size of the train-step measurement (default: the first size)")
    parser.add_argument("--steps", type=int, default=5, help="train steps per measurement")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.set_defaults(measure=_measure)


if __name__ == "__main__":
    if sys.argv[1] == "raw":
        _raw_child(int(sys.argv[2]), sys.argv[3], sys.argv[4], float(sys.argv[5]), int(sys.argv[6]))
    else:
        _receiver_child(sys.argv[2], sys.argv[3], sys.argv[4])
