"""`zerobubble bench weights`: weight broadcast to one receiver process over gloo on loopback.

For each model size (Qwen2 architecture, random init): the bucketed broadcast this project uses, the
reference's one broadcast call per tensor, and one flat tensor of the same bytes (the limit), all in
the same run against the same receiver; the receiver's time to load the weights into a transformers
model. Then what a sync running in the background costs a training step (forward, backward, AdamW) of
the first size: steps without and with a publish after every step (through the real broadcaster,
trainer service and weight receiver), in alternating phases with a fixed number of torch threads,
reported as medians with their spread, and with how many of the steps a sync actually overlapped.
Then the fan-out: the sync of one size to 1, 2, 4 and 8 worker processes (the real broadcaster and weight
receivers, the engines left out), each round against one flat torch.distributed broadcast of the same bytes to the
same processes over a plain gloo group, taking turns at going first, with the CPU seconds every process spent in each
(how many of the machine's cores the transfer kept busy), the copy into the send buffers, and the sync split into its
parts along its critical path (announcement, posting the receives, transfer, acknowledgements; see _sync_parts).
Last, LoRA on the demo's tiny model: a sync of the adapters alone against a sync of the full weights, each through
the real broadcaster to a worker process whose transformers engine applies it, and each engine's time to apply one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from statistics import median, quantiles

import torch
from torch.distributed import TCPStore
from transformers import Qwen2Config, Qwen2ForCausalLM

from zerobubble.common.weight_sync import MIB, Manifest, form_group, start_broadcast, wait_broadcast
from zerobubble.tooling.bench.cpu import process_cpu_seconds
from zerobubble.trainer.broadcaster import WeightBroadcaster
from zerobubble.trainer.lora_config import LoraConfig
from zerobubble.trainer.sync_config import WeightSyncConfig

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


def _modes(model: torch.nn.Module, buffers: list[torch.Tensor]) -> dict:
    """The three ways of moving the same weights; each is a list of tensors, broadcast one call per tensor."""
    params = [p.data for _, p in model.named_parameters()]
    return {"bucketed": buffers, "per_tensor": params, "flat": [_flat_copy(buffers)]}


def _flat_copy(buffers: list[torch.Tensor]) -> torch.Tensor:
    """The buckets' bytes in one tensor. Never a fresh torch.empty as a sender's source: its pages, never written,
    all map the kernel's one zero page, which a send reads from cache, so it would beat any real weights' bytes."""
    return torch.cat(buffers)


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
    targets = _modes(model, buffers)
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
        sources = _modes(model, buffers)
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


def _receiver_child(address: str, size: str, dtype_name: str, threads: int) -> None:
    """A rollout worker's side: a WeightReceiver loading every version it gets into a transformers model,
    until its standard input closes. `size` may be a model folder: then the real transformers engine over it."""
    from zerobubble.common.clients.trainer import TrainerClient
    from zerobubble.rollout.engine_transformers import TransformersEngine
    from zerobubble.rollout.weight_receiver import WeightReceiver

    torch.set_num_threads(threads)
    if size in SIZES:
        engine = StandInEngine(build_model(size, getattr(torch, dtype_name), seed=1))
    else:
        engine = TransformersEngine(size, dtype=getattr(torch, dtype_name))
    done = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    with TrainerClient(address) as client:
        receiver = WeightReceiver(client, "bench-receiver").start()
        while not done.wait(0.01):
            receiver.apply_to(engine)
        receiver.close()
    _exit_now()


class _RecordingBroadcaster(WeightBroadcaster):
    """The real broadcaster, noting when each sync ran, so the bench can tell which steps one overlapped."""

    def __init__(self, config: WeightSyncConfig):
        super().__init__(config)
        self.sync_spans: list[tuple[float, float]] = []

    def _sync(self, snapshot) -> None:
        started = time.perf_counter()
        try:
            super()._sync(snapshot)
        finally:
            self.sync_spans.append((started, time.perf_counter()))


@dataclass(frozen=True)
class _Step:
    started: float
    ended: float
    publish_seconds: float  # part of the step spent copying weights into the broadcaster's buffers
    # The training thread's CPU time: all of the step's compute with one torch thread, and unlike the wall
    # time not stretched by other processes taking the cores.
    cpu_seconds: float
    copy_wait_seconds: float = 0.0  # part of the step spent waiting, before its optimizer step, for the copy

    @property
    def seconds(self) -> float:
        return self.ended - self.started

    def overlap(self, spans: list[tuple[float, float]]) -> float:
        return sum(max(0.0, min(self.ended, end) - max(self.started, begin)) for begin, end in spans)


def _train_steps(model: torch.nn.Module, optimizer, batch: torch.Tensor, steps: int, publish=None,
                 before_step=None) -> list[_Step]:
    """`steps` updates; `publish` (if any) runs at the end of each, as a trainer publishes after its update, and
    `before_step` before each optimizer step, as the trainer's update waits there for the last publish's copy."""
    timed = []
    for _ in range(steps):
        started, cpu_started = time.perf_counter(), time.thread_time()
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        waited = time.perf_counter()
        if before_step is not None:
            before_step()
        waited = time.perf_counter() - waited
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        publish_seconds = 0.0
        if publish is not None:
            begun = time.perf_counter()
            publish()
            publish_seconds = time.perf_counter() - begun
        timed.append(_Step(started, time.perf_counter(), publish_seconds, time.thread_time() - cpu_started, waited))
    return timed


def _spread(values: list[float]) -> dict:
    quartiles = quantiles(values, n=4, method="inclusive") if len(values) > 1 else values * 3
    return {"min": min(values), "q1": quartiles[0], "median": median(values), "q3": quartiles[2], "max": max(values)}


def _measure_step(size: str, rounds: int, steps: int, batch_size: int, seq_len: int, bucket_mb: float,
                  threads: int) -> dict:
    """Train steps with and without a sync in the background, in alternating phases (without/with, then
    with/without, ...) so drift and load from elsewhere fall on both alike; the receiver process and the
    broadcaster are up in both, and nothing is in flight when a phase without sync starts. Published as the
    trainer does: the live fp32 weights, copied on the broadcaster's thread, the optimizer step waiting for it."""
    model = build_model(size, torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    batch = torch.randint(0, model.config.vocab_size, (batch_size, seq_len))

    bench = _SyncBench(bucket_mb, _RecordingBroadcaster).spawn_receiver(size, torch.float32, threads)
    broadcaster = bench.broadcaster
    versions = iter(range(1_000_000))

    copy_seconds = []

    def publish() -> None:
        broadcaster.publish(((name, p.detach()) for name, p in model.named_parameters()), next(versions))

    def waited_copy() -> None:
        broadcaster.wait_copied()
        copy_seconds.append(broadcaster.status()["last_copy_seconds"])

    def phase(with_sync: bool, count: int) -> list[_Step]:
        if not with_sync:
            return _train_steps(model, optimizer, batch, count)
        publish()  # in flight from the first measured step on
        timed = _train_steps(model, optimizer, batch, count, publish, waited_copy)
        broadcaster.wait_copied()
        broadcaster.wait_synced(broadcaster.status()["published_version"], TIMEOUT_S)
        while broadcaster.status()["sending_version"] != -1:  # the sender thread is done with it, span noted
            time.sleep(0.001)
        return timed

    try:
        bench.wait_member()
        started = time.perf_counter()
        publish()
        broadcaster.wait_synced(0, TIMEOUT_S)
        first_sync = time.perf_counter() - started
        # Warm-up: optimizer state, allocator, and both sets of the broadcaster's send buffers.
        phase(False, 1)
        phase(True, 1)
        spans_before = len(broadcaster.sync_spans)
        without: list[list[_Step]] = []
        with_sync: list[list[_Step]] = []
        for round_number in range(rounds):
            for syncing in (False, True) if round_number % 2 == 0 else (True, False):
                (with_sync if syncing else without).append(phase(syncing, steps))
        spans = broadcaster.sync_spans[spans_before:]
    finally:
        bench.close()
    baseline = [step for phase_steps in without for step in phase_steps]
    synced = [step for phase_steps in with_sync for step in phase_steps]
    seconds, seconds_with_sync = median(s.seconds for s in baseline), median(s.seconds for s in synced)
    cpu_seconds, cpu_seconds_with_sync = median(s.cpu_seconds for s in baseline), median(s.cpu_seconds for s in synced)
    overlaps = [step.overlap(spans) for step in synced]
    return {
        "size": size, "batch": [batch_size, seq_len], "threads": threads, "rounds": rounds, "steps": steps,
        "step_seconds": seconds, "step_seconds_with_sync": seconds_with_sync,
        "step_slowdown": seconds_with_sync / seconds,
        "ratio": seconds_with_sync / seconds,
        "step_seconds_spread": _spread([step.seconds for step in baseline]),
        "step_seconds_with_sync_spread": _spread([step.seconds for step in synced]),
        "round_slowdowns": [median(s.seconds for s in synced_steps) / median(s.seconds for s in baseline_steps)
                            for baseline_steps, synced_steps in zip(without, with_sync, strict=True)],
        "compute_slowdown": median(s.seconds - s.publish_seconds for s in synced) / seconds,
        "step_cpu_seconds": cpu_seconds, "step_cpu_seconds_with_sync": cpu_seconds_with_sync,
        "cpu_slowdown": cpu_seconds_with_sync / cpu_seconds,
        "publish_seconds": median(step.publish_seconds for step in synced),
        "copy_seconds": median(copy_seconds),
        "copy_wait_seconds": median(step.copy_wait_seconds for step in synced),
        "sync_seconds": median(end - begin for begin, end in spans),
        "end_to_end_sync_seconds": first_sync,
        "versions_synced_while_training": len(spans),
        "steps_with_sync": len(synced),
        "steps_overlapped": sum(overlap > 0 for overlap in overlaps),
        "overlap_fraction": sum(overlaps) / sum(step.seconds for step in synced),
        "baseline_steps_overlapped": sum(step.overlap(spans) > 0 for step in baseline),
    }


class _SyncBench:
    """The real broadcaster and trainer service, and the worker processes following them."""

    def __init__(self, bucket_mb: float, broadcaster: type[WeightBroadcaster] = WeightBroadcaster):
        from zerobubble.common.config import ServerConfig
        from zerobubble.common.server import ServiceHost
        from zerobubble.trainer.servicer import SERVICE, TrainerServicer
        from zerobubble.v1 import trainer_pb2_grpc

        self.broadcaster = broadcaster(WeightSyncConfig(bucket_mb=bucket_mb, member_timeout_s=TIMEOUT_S)).start()
        self.host = ServiceHost("trainer", ServerConfig(metrics_port=None, grace_seconds=0))
        self.host.add(trainer_pb2_grpc.add_TrainerServiceServicer_to_server,
                      TrainerServicer(self.broadcaster, _NoTraining()), SERVICE.full_name)
        self.host.start()
        self.children: list[subprocess.Popen] = []
        self.version = 0

    def spawn_receiver(self, model: str, dtype: torch.dtype, threads: int) -> _SyncBench:
        """One worker loading every version into an engine (see _receiver_child); it leaves when its stdin closes."""
        self.children.append(subprocess.Popen([sys.executable, "-m", __name__, "receiver", self.host.address, model,
                                               str(dtype).split(".")[-1], str(threads)], stdin=subprocess.PIPE))
        return self

    def spawn_fanout(self, store_port: int, receivers: int, nbytes: int, rounds: int) -> None:
        for rank in range(1, receivers + 1):
            self.children.append(subprocess.Popen([sys.executable, "-m", __name__, "fanout", str(store_port),
                                                   str(rank), str(receivers + 1), str(nbytes), str(rounds),
                                                   self.host.address]))

    def wait_member(self) -> None:
        deadline = time.monotonic() + TIMEOUT_S
        while len(self.broadcaster.members) < len(self.children):
            if time.monotonic() > deadline:
                raise RuntimeError(f"bench receivers did not join within {TIMEOUT_S} s")
            for child in self.children:
                if child.poll() is not None:
                    raise RuntimeError(f"bench receiver exited with {child.returncode} before joining")
            time.sleep(0.05)

    def sync(self, named: list[tuple[str, torch.Tensor]]) -> float:
        """Seconds from publishing a version to every worker's acknowledgement of it."""
        self.version += 1
        started = time.perf_counter()
        self.broadcaster.publish(named, self.version)
        if not self.broadcaster.wait_synced(self.version, TIMEOUT_S):
            raise RuntimeError(f"version {self.version} was not synced within {TIMEOUT_S} s")
        return time.perf_counter() - started

    def close(self) -> None:
        failed = []
        for child in self.children:
            if child.stdin is not None:
                child.stdin.close()
            if child.wait(timeout=60) != 0:
                failed.append(child.returncode)
        self.host.stop(0)
        self.broadcaster.close()
        if failed:
            raise RuntimeError(f"bench receivers exited with {failed}")


def _fanout_child(port: int, rank: int, world: int, nbytes: int, rounds: int, address: str) -> None:
    """Receiver `rank` of the fan-out: every round one flat broadcast on the bench's own gloo group, and meanwhile
    a WeightReceiver following the broadcaster; what it receives is not loaded, so both modes move bytes alone."""
    from zerobubble.common.clients.trainer import TrainerClient
    from zerobubble.rollout.weight_receiver import WeightReceiver

    torch.set_num_threads(1)
    store = TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=TIMEOUT_S))
    flat = torch.empty(nbytes, dtype=torch.uint8)
    with TrainerClient(address) as client:
        receiver = WeightReceiver(client, f"fanout-{rank}").start()
        group = form_group(store, 0, rank, world, backend="gloo", timeout_s=TIMEOUT_S, address="127.0.0.1")
        for _ in range(rounds):
            _barrier(group)
            _send(group, [flat], one_at_a_time=False)
            _barrier(group)
        _barrier(group)  # the parent's last sync is acknowledged: leaving now drops nobody mid-version
        store.set(f"receive_times/{rank}", json.dumps([vars(times) for times in receiver.recent_times]))
        _barrier(group)
        receiver.close()
    _exit_now()


def _exit_now() -> None:
    """A bench receiver's exit once everything is measured and acknowledged: without the interpreter's teardown,
    in which destroying a gloo group's threads may abort the process."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@dataclass
class _CpuSpan:
    """Wall and CPU seconds of the trainer process and of each receiver over one transfer."""

    pids: list[int]
    wall: float = 0.0
    trainer: float = 0.0
    receivers: list[float] = field(default_factory=list)

    def __enter__(self) -> _CpuSpan:
        self._started = (time.perf_counter(), time.process_time(), [process_cpu_seconds(p) for p in self.pids])
        return self

    def __exit__(self, *exc) -> None:
        wall, trainer, receivers = self._started
        self.wall = time.perf_counter() - wall
        self.trainer = time.process_time() - trainer
        self.receivers = [process_cpu_seconds(p) - before for p, before in zip(self.pids, receivers, strict=True)]


def _cpu_figures(spans: list[_CpuSpan]) -> dict:
    """Medians over the rounds: CPU seconds of the trainer, of a receiver (mean over receivers), of all processes,
    and the cores that kept busy on average (all CPU seconds over the wall)."""
    total = [span.trainer + sum(span.receivers) for span in spans]
    return {
        "trainer_cpu_seconds": median(span.trainer for span in spans),
        "receiver_cpu_seconds": median(sum(span.receivers) / len(span.receivers) for span in spans),
        "total_cpu_seconds": median(total),
        "cores_busy": median(cpu / span.wall for cpu, span in zip(total, spans, strict=True)),
    }


def _measure_fanout_count(named: list[tuple[str, torch.Tensor]], receivers: int, repeats: int,
                          bucket_mb: float) -> dict:
    manifest = Manifest.plan(named, int(bucket_mb * MIB))
    buffers = manifest.allocate()
    manifest.pack(named, buffers)
    flat = [_flat_copy(buffers)]  # the same bytes as the sync's
    nbytes = manifest.total_bytes
    rounds = repeats + 1  # the first round warms both paths (buffers, connections) and is not counted
    bench = _SyncBench(bucket_mb)
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=TIMEOUT_S))
    bench.spawn_fanout(store.port, receivers, nbytes, rounds)
    pids = [child.pid for child in bench.children]
    flat_spans, sync_spans, sync_seconds, copy_seconds = [], [], [], []
    trainer_times: dict[int, dict[str, float]] = {}
    try:
        group = form_group(store, 0, 0, receivers + 1, backend="gloo", timeout_s=TIMEOUT_S, address="127.0.0.1")
        bench.wait_member()
        bench.sync(named)  # forms the broadcaster's group
        for round_number in range(rounds):
            # Sync and flat broadcast take turns going first, so that what one leaves behind (caches, the other
            # load of the machine) falls on both alike.
            if round_number % 2:
                with _CpuSpan(pids) as sync_span:
                    bench.sync(named)
            _barrier(group)
            with _CpuSpan(pids) as flat_span:
                _send(group, flat, one_at_a_time=False)
                _barrier(group)
            if not round_number % 2:
                with _CpuSpan(pids) as sync_span:
                    bench.sync(named)
            flat_spans.append(flat_span)
            sync_spans.append(sync_span)
            status = bench.broadcaster.status()
            sync_seconds.append(status["last_sync_seconds"])
            copy_seconds.append(status["last_copy_seconds"])
            trainer_times[status["synced_version"]] = status["last_sync_times"]
        _barrier(group)
        receive_times = []
        for rank in range(1, receivers + 1):
            store.wait([f"receive_times/{rank}"])
            receive_times.append({t["version"]: t for t in json.loads(store.get(f"receive_times/{rank}"))})
        _barrier(group)
    finally:
        bench.close()
    flat_spans, sync_spans = flat_spans[1:], sync_spans[1:]
    sync_seconds, copy_seconds = sync_seconds[1:], copy_seconds[1:]
    # A receiver keeps the times of its last 64 versions only: the parts are medians over the rounds all kept.
    versions = [v for v in sorted(trainer_times)[1:] if all(v in times for times in receive_times)]
    flat_seconds = median(span.wall for span in flat_spans)
    end_to_end = median(span.wall for span in sync_spans)
    return {
        "receivers": receivers, "bytes": nbytes,
        "flat_seconds": flat_seconds,
        "sync_seconds": median(sync_seconds),
        "end_to_end_sync_seconds": end_to_end,
        "limit_ratio": flat_seconds / median(sync_seconds),
        "end_to_end_limit_ratio": flat_seconds / end_to_end,
        "copy_seconds": median(copy_seconds),
        "flat_cpu": _cpu_figures(flat_spans),
        "sync_cpu": _cpu_figures(sync_spans),
        "sync_parts": _sync_parts([trainer_times[v] for v in versions],
                                  [[times[v] for times in receive_times] for v in versions]),
    }


def _sync_parts(trainer: list[dict[str, float]], workers: list[list[dict[str, float]]]) -> dict:
    """Median seconds of each part of the sync over the rounds, from the wall-clock times the broadcaster and the
    workers noted (all on this host's clock). Along the critical path, each part ends when the last process got
    there: `announce` the announcement reached the last worker (gRPC stream); `prepare` the last worker posted its
    buffers for the broadcast; `transfer` the last worker has the last bucket; `acknowledge` the last worker starts
    writing its acknowledgement; `notice` the trainer has read them all (the store's round trips). Beside them:
    `before_announce`, the broadcaster's work before it announced, and `sent`, from the announcement until the
    trainer's own sends completed."""
    names = ("before_announce", "announce", "prepare", "transfer", "acknowledge", "notice", "sent")
    parts: dict[str, list[float]] = {name: [] for name in names}
    for sync, receives in zip(trainer, workers, strict=True):
        last = {key: max(r[key] for r in receives) for key in ("announced", "ready", "received", "acknowledging")}
        parts["before_announce"].append(sync["announced"] - sync["started"])
        parts["announce"].append(last["announced"] - sync["announced"])
        parts["prepare"].append(last["ready"] - last["announced"])
        parts["transfer"].append(last["received"] - last["ready"])
        parts["acknowledge"].append(last["acknowledging"] - last["received"])
        parts["notice"].append(sync["acknowledged"] - last["acknowledging"])
        parts["sent"].append(sync["sent"] - sync["announced"])
    return {name: median(values) for name, values in parts.items()}


def _measure_fanout(size: str, counts: list[int], dtype: torch.dtype, repeats: int, bucket_mb: float) -> dict:
    """The sync against the flat broadcast of its bytes for each receiver count, and how both grow with it."""
    named = [(name, p.detach().to(dtype)) for name, p in build_model(size, torch.float32).named_parameters()]
    per_count = [_measure_fanout_count(named, count, repeats, bucket_mb) for count in counts]
    first = per_count[0]
    for figures in per_count:
        figures["flat_growth"] = figures["flat_seconds"] / first["flat_seconds"]
        figures["sync_growth"] = figures["sync_seconds"] / first["sync_seconds"]
    return {"size": size, "counts": per_count, "worst_limit_ratio": min(c["limit_ratio"] for c in per_count)}


def _timed_load(engine, named: list[tuple[str, torch.Tensor]], repeats: int) -> float:
    seconds = []
    for version in range(repeats):
        started = time.perf_counter()
        engine.load_weights(named, version)
        seconds.append(time.perf_counter() - started)
    return median(seconds)


def _measure_lora(tiny_size: str, rank: int, repeats: int, bucket_mb: float, threads: int) -> dict:
    """Adapter sync against full sync of the same fp32 model (what the trainer publishes in each mode)."""
    from transformers import AutoModelForCausalLM

    from zerobubble.rollout.engine_transformers import TransformersEngine
    from zerobubble.tooling.tiny.model import make_tiny_model
    from zerobubble.trainer.lora import adapter_weights, wrap

    lora = LoraConfig(rank=rank)
    with tempfile.TemporaryDirectory(prefix="bench-lora-") as folder:
        model_dir = make_tiny_model(Path(folder) / "model", size=tiny_size)
        full = [(name, p.detach()) for name, p in AutoModelForCausalLM.from_pretrained(model_dir).named_parameters()]
        adapted = wrap(AutoModelForCausalLM.from_pretrained(model_dir), lora)
        with torch.no_grad():
            for name, p in adapted.named_parameters():
                if "lora_B" in name:
                    p.normal_(std=0.01)  # a trained adapter: B is zero only at the start
        adapter = list(adapter_weights(adapted))
        modes = {"full": full, "adapter": adapter}
        bench = _SyncBench(bucket_mb).spawn_receiver(str(model_dir), torch.float32, threads)
        try:
            bench.wait_member()
            sync_seconds = {}
            for mode, named in modes.items():
                bench.sync(named)  # warm-up: buffers of this manifest on both sides
                sync_seconds[mode] = median(bench.sync(named) for _ in range(repeats))
        finally:
            bench.close()
        engine = TransformersEngine(model_dir, dtype="fp32")
        load_seconds = {mode: _timed_load(engine, named, repeats) for mode, named in modes.items()}
    sizes = {mode: Manifest.plan(named, int(bucket_mb * MIB)).total_bytes for mode, named in modes.items()}
    return {
        "tiny_size": tiny_size, "rank": rank, "target_modules": lora.target_modules,
        "parameters": sum(t.numel() for _, t in full),
        "adapter_parameters": sum(t.numel() for name, t in adapter if not name.endswith("lora_scaling")),
        "full_bytes": sizes["full"], "adapter_bytes": sizes["adapter"],
        "bytes_ratio": sizes["adapter"] / sizes["full"],
        "full_sync_seconds": sync_seconds["full"], "adapter_sync_seconds": sync_seconds["adapter"],
        "sync_seconds_ratio": sync_seconds["adapter"] / sync_seconds["full"],
        "full_load_seconds": load_seconds["full"], "adapter_load_seconds": load_seconds["adapter"],
    }


class _NoTraining:
    def status(self) -> dict:
        return {"step": 0, "policy_version": 0, "last_checkpoint": "", "state": "training"}

    def save_checkpoint(self, tag: str) -> tuple[str, int]:
        return "", 0


def bench_weights(sizes: list[str], repeats: int = 3, dtype: str = "bfloat16", bucket_mb: float = 256.0,
                  step_size: str | None = None, rounds: int = 8, steps: int = 2, batch_size: int = 2,
                  seq_len: int = 64, threads: int = 1, lora_size: str = "1m", lora_rank: int = 8,
                  fanout_size: str | None = None, fanout_receivers: tuple[int, ...] = (1, 2, 4, 8)) -> dict:
    if min(rounds, steps, threads) < 1:
        raise ValueError(f"rounds, steps and threads must be at least 1, not {rounds}, {steps}, {threads}")
    if not fanout_receivers or min(fanout_receivers) < 1:
        raise ValueError(f"fanout_receivers must be counts of at least 1, not {fanout_receivers}")
    torch_dtype = getattr(torch, dtype)
    step_size = step_size or sizes[0]
    threads_before = torch.get_num_threads()
    # Fixed, so the step competes for the cores the same way in every run and both of its conditions.
    torch.set_num_threads(threads)
    try:
        return {
            "dtype": dtype, "bucket_mb": bucket_mb, "repeats": repeats, "torch_threads": torch.get_num_threads(),
            "broadcast": [_measure_size(size, torch_dtype, bucket_mb, repeats) for size in sizes],
            "train_step": _measure_step(step_size, rounds, steps, batch_size, seq_len, bucket_mb, threads),
            "fanout": _measure_fanout(fanout_size or sizes[0], list(fanout_receivers), torch_dtype, repeats,
                                      bucket_mb),
            "lora": _measure_lora(lora_size, lora_rank, repeats, bucket_mb, threads),
        }
    finally:
        torch.set_num_threads(threads_before)
        # Groups given up are destroyed on threads of their own (retire_group); one still being destroyed when
        # the interpreter exits aborts the process.
        for thread in threading.enumerate():
            if thread.name == "retire-group":
                thread.join(TIMEOUT_S)


def _measure(args) -> dict:
    return bench_weights([s.strip() for s in args.sizes.split(",") if s.strip()], repeats=args.repeats,
                         dtype=args.dtype, bucket_mb=args.bucket_mb, step_size=args.step_size, rounds=args.rounds,
                         steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len, threads=args.threads,
                         lora_size=args.lora_size, lora_rank=args.lora_rank, fanout_size=args.fanout_size,
                         fanout_receivers=tuple(int(n) for n in args.fanout_receivers.split(",") if n.strip()))


def register_bench(bench_subparsers) -> None:
    parser = bench_subparsers.add_parser(
        "weights", help="bucketed vs per-tensor vs flat weight broadcast, load time, train step with a sync running")
    parser.add_argument("--sizes", default="125m,500m", help=f"comma-separated, from {', '.join(SIZES)}")
    parser.add_argument("--repeats", type=int, default=3, help="broadcasts per mode and size (the median is reported)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"],
                        help="dtype of the broadcast weights (the train step publishes fp32, as the trainer)")
    parser.add_argument("--bucket-mb", type=float, default=256.0)
    parser.add_argument("--step-size", help="model size of the train-step measurement (default: the first size)")
    parser.add_argument("--rounds", type=int, default=8,
                        help="alternating rounds of train steps without and with a sync in the background")
    parser.add_argument("--steps", type=int, default=2, help="train steps per condition and round")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads of the trainer and of the receiver (torch.set_num_threads)")
    parser.add_argument("--fanout-size", help="model size of the fan-out to several workers (default: the first size)")
    parser.add_argument("--fanout-receivers", default="1,2,4,8",
                        help="comma-separated worker counts of the fan-out, each against a flat broadcast to as many")
    parser.add_argument("--lora-size", default="1m",
                        help="tiny model size of the adapter-vs-full sync (1m: the demo's)")
    parser.add_argument("--lora-rank", type=int, default=8, help="LoRA rank of that comparison")
    parser.set_defaults(measure=_measure)


if __name__ == "__main__":
    if sys.argv[1] == "raw":
        _raw_child(int(sys.argv[2]), sys.argv[3], sys.argv[4], float(sys.argv[5]), int(sys.argv[6]))
    elif sys.argv[1] == "fanout":
        _fanout_child(*map(int, sys.argv[2:7]), sys.argv[7])
    else:
        _receiver_child(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
