"""`zerobubble bench scale`: the buffer under many producers and data-parallel pullers, and its restart on a
large write-ahead log.

Fan-in: `producers` simulated rollout workers (push streams of their own, spread over a few processes, each
pushing a group, waiting for its ack, pushing the next) and `pullers` trainer ranks (processes of their own,
rank r of `pullers`, acknowledging what they pull), all against one buffer process. Reports groups/s end to end,
the acknowledgement latency percentiles, and whether every group acknowledged as stored was pulled exactly once.
The baseline is the same groups through the same buffer from one producer to one puller, in the same run.
The ranks commit once, at the end: a trainer commits a step after its ranks agree, which has no counterpart here.

Recovery: the buffer's log filled with `wal_gb` of queued 3.5 MiB groups, then the buffer process started on it:
seconds until it serves (and beyond its start on an empty log: the replay), and the groups it recovered. The
baselines, in the same run: the same process on an empty log (its fixed start-up cost) and reading the log's
files' bytes (from the page cache, as the log was just written).

    python -m zerobubble.tooling.bench.scale producer ADDRESS FIRST STREAMS GROUPS_PER_STREAM TRAJECTORIES TOKENS
    python -m zerobubble.tooling.bench.scale puller ADDRESS RANK WORLD STEP

are the worker processes: each prints `ready`, reads a line, works, and prints one JSON line.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from zerobubble.buffer.config import BufferServiceConfig
from zerobubble.buffer.core import Buffer
from zerobubble.common.config import ConfigError
from zerobubble.tooling.bench.transport import BufferProcess, buffer_config
from zerobubble.tooling.bench.transport_pusher import client_for, groups, template

STREAMS_PER_PROCESS = 16
LEASE_MAX = 1024  # the buffer's default leases.max_prompts
RECOVERY_GROUP = (8, 57_344)  # the 3.5 MiB group of `bench transport`
RECOVERY_GB = (0.1, 1.0, 4.0)
DEADLINE_SECONDS = 600.0
LOG_ROOM = 1 << 40  # capacity.max_bytes of the recovery cases: the whole log stays queued


def _producer(address: str, first: int, streams: int, per_stream: int, trajectories: int, tokens: int) -> dict:
    """`streams` producers, numbered from `first`, each on its own push stream; their acks' latencies."""
    like = template(trajectories, tokens)
    with client_for(address) as client:
        leased = []
        for index in range(first, first + streams):
            prompts = []
            while len(prompts) < per_stream:
                prompts.extend(client.lease(f"p{index}", min(LEASE_MAX, per_stream - len(prompts)),
                                            timeout=DEADLINE_SECONDS).prompts)
            leased.append((f"p{index}", prompts))
        print("ready", flush=True)
        sys.stdin.readline()
        latencies: list[list[float]] = [[] for _ in leased]
        stored = [0] * len(leased)
        failures: list[str] = []

        def produce(slot: int) -> None:
            producer, prompts = leased[slot]
            outgoing: queue.Queue = queue.Queue()
            acks = client.push(iter(outgoing.get, None), timeout=DEADLINE_SECONDS)
            try:
                for group in groups(like, prompts, producer):
                    sent = time.perf_counter()
                    outgoing.put(group)
                    ack = next(acks)
                    latencies[slot].append(time.perf_counter() - sent)
                    if ack.stored:
                        stored[slot] += 1
                    elif len(failures) < 3:
                        failures.append(ack.error or ack.filtered)
            finally:
                outgoing.put(None)
                for _ in acks:
                    pass

        threads = [threading.Thread(target=produce, args=(slot,)) for slot in range(len(leased))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return {"stored": sum(stored), "failures": failures, "latencies": [v for s in latencies for v in s]}


def _puller(address: str, rank: int, world: int, step: int) -> dict:
    """Pull and acknowledge `step` groups at a time until the end of data; who made each group received."""
    received: list[str] = []
    last = 0
    with client_for(address) as client:
        print("ready", flush=True)
        sys.stdin.readline()
        while True:
            result = client.pull(rank, world, step, wait_seconds=2, timeout=DEADLINE_SECONDS)
            for pulled in result.groups:
                received.append(f"{pulled.group.producer_id}/{pulled.group.sequence}")
            last = max(last, result.last_delivery)
            if result.end_of_data:
                break
    return {"received": received, "last_delivery": last}


def _start(role: str, *args: Any) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-m", "zerobubble.tooling.bench.scale", role, *map(str, args)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    if process.stdout.readline().strip() != "ready":
        process.kill()
        raise RuntimeError(f"a {role} process did not start (exit code {process.wait()})")
    return process


def _finish(process: subprocess.Popen) -> dict:
    line = process.stdout.readline()
    process.stdin.close()
    process.wait(DEADLINE_SECONDS)
    if not line:
        raise RuntimeError(f"a worker process ended with {process.returncode} and no report")
    return json.loads(line)


def _percentile_ms(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


def fan_in(folder: Path, producers: int, pullers: int, per_producer: int, shape: tuple[int, int],
           step: int) -> dict[str, Any]:
    """`producers` push streams into one buffer process and `pullers` ranks out of it, started together."""
    folder.mkdir()
    total = producers * per_producer
    buffer = BufferProcess(folder, total, "interval")
    workers: list[subprocess.Popen] = []
    try:
        for first in range(0, producers, STREAMS_PER_PROCESS):
            streams = min(STREAMS_PER_PROCESS, producers - first)
            workers.append(_start("producer", buffer.address, first, streams, per_producer, *shape))
        pushers = len(workers)
        workers += [_start("puller", buffer.address, rank, pullers, step) for rank in range(pullers)]
        started = time.perf_counter()
        for worker in workers:
            worker.stdin.write("go\n")
            worker.stdin.flush()
        reports = [_finish(worker) for worker in workers]
        seconds = time.perf_counter() - started
        pushed, pulled = reports[:pushers], reports[pushers:]
        with client_for(buffer.address) as client:
            client.commit(max(report["last_delivery"] for report in pulled), timeout=60)
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        buffer.close()
    received = [item for report in pulled for item in report["received"]]
    latencies = [value for report in pushed for value in report["latencies"]]
    stored = sum(report["stored"] for report in pushed)
    return {
        "producers": producers,
        "pullers": pullers,
        "groups": total,
        "acknowledged_stored": stored,
        "pulled": len(received),
        "pulled_twice": len(received) - len(set(received)),
        "lost": stored - len(set(received)),
        "push_failures": [failure for report in pushed for failure in report["failures"]][:3],
        "seconds": round(seconds, 3),
        "groups_per_s": round(len(received) / seconds, 1),
        "ack_p50_ms": _percentile_ms(latencies, 0.50),
        "ack_p99_ms": _percentile_ms(latencies, 0.99),
        "ack_max_ms": _percentile_ms(latencies, 1.0),
    }


def _fill_log(folder: Path, groups_wanted: int) -> int:
    """The buffer's log in `folder` holding `groups_wanted` queued 3.5 MiB groups, written by the buffer's own
    core (what a push stores, without the network); the log's bytes."""
    path = buffer_config(folder, groups_wanted, "never", max_bytes=LOG_ROOM)
    config = BufferServiceConfig.model_validate(yaml.safe_load(path.read_text()))
    core = Buffer(config)
    like = template(*RECOVERY_GROUP)
    try:
        pushed = 0
        while pushed < groups_wanted:
            grant = core.lease_prompts("filler", min(LEASE_MAX, groups_wanted - pushed))
            first = pushed
            for group in groups(like, list(grant.prompts), "filler"):
                group.sequence += first
                if not core.push(group).stored:
                    raise RuntimeError("a group filling the log was not stored")
                pushed += 1
    finally:
        core.close()
    return sum(segment.stat().st_size for segment in (folder / "wal").iterdir())


def _read_seconds(directory: Path) -> float:
    """Seconds to read every file of `directory` once, in 4 MiB reads."""
    chunk = bytearray(4 << 20)
    started = time.perf_counter()
    for path in sorted(directory.iterdir()):
        with open(path, "rb", buffering=0) as file:
            while file.readinto(chunk):
                pass
    return time.perf_counter() - started


def _start_seconds(folder: Path, prompts: int) -> tuple[float, int]:
    """Seconds from starting the buffer process on `folder` until it serves; the groups it holds then."""
    started = time.perf_counter()
    buffer = BufferProcess(folder, prompts, "never", max_bytes=LOG_ROOM)
    seconds = time.perf_counter() - started
    try:
        with client_for(buffer.address) as client:
            queued = client.stats(timeout=60).queued_groups
    finally:
        buffer.close()
    return seconds, queued


def recovery(folder: Path, gigabytes: float) -> dict[str, Any]:
    group_bytes = template(*RECOVERY_GROUP).ByteSize()
    wanted = max(1, round(gigabytes * 1e9 / group_bytes))
    folder.mkdir()
    log_bytes = _fill_log(folder, wanted)
    seconds, queued = _start_seconds(folder, wanted)
    read = _read_seconds(folder / "wal")
    return {
        "log_gb": round(log_bytes / 1e9, 3),
        "groups_logged": wanted,
        "groups_recovered": queued,
        "recovery_seconds": round(seconds, 3),
        "read_log_seconds": round(read, 3),
        "recovery_gb_per_s": round(log_bytes / 1e9 / seconds, 2),
        "read_gb_per_s": round(log_bytes / 1e9 / read, 2),
    }


def bench_scale(*, producers: int = 64, pullers: int = 4, groups_per_producer: int = 64,
                trajectories: int = 8, tokens: int = 512, step: int = 16,
                wal_gb: tuple[float, ...] = RECOVERY_GB, workdir: Path | None = None) -> dict[str, Any]:
    """Fan-in of `producers` x `groups_per_producer` groups to `pullers` ranks against one producer and one rank
    moving as many groups; then a restart on each log size of `wal_gb`."""
    shape = (trajectories, tokens)
    results: dict[str, Any] = {"benchmark": "scale", "group_bytes": template(*shape).ByteSize()}
    with tempfile.TemporaryDirectory(dir=workdir, prefix="zerobubble-bench-") as scratch:
        scratch = Path(scratch)
        baseline = fan_in(scratch / "one", 1, 1, producers * groups_per_producer, shape, step)
        many = fan_in(scratch / "many", producers, pullers, groups_per_producer, shape, step)
        many["ratio_to_one_to_one"] = round(many["groups_per_s"] / baseline["groups_per_s"], 3)
        results["one_to_one"] = baseline
        results["fan_in"] = many
        empty = scratch / "empty"
        empty.mkdir()
        results["empty_log_start_seconds"] = round(_start_seconds(empty, 1)[0], 3)
        results["recovery"] = []
        for index, gigabytes in enumerate(wal_gb):
            case = recovery(scratch / f"log{index}", gigabytes)
            case["replay_seconds"] = round(max(0.0, case["recovery_seconds"] - results["empty_log_start_seconds"]), 3)
            case["ratio_to_read"] = round(case["read_log_seconds"] / case["recovery_seconds"], 3)
            results["recovery"].append(case)
            # Each log is gone before the next is written: the largest needs its room on disk and in memory.
            subprocess.run(["rm", "-rf", str(scratch / f"log{index}")], check=True)
    return results


def register_bench(benches) -> None:
    parser = benches.add_parser("scale", help="the buffer under 64 producers and 4 data-parallel pullers; its "
                                "restart on a 0.1, 1 and 4 GB write-ahead log")
    parser.add_argument("--producers", type=int, default=64, help="simulated rollout workers, each a push stream")
    parser.add_argument("--pullers", type=int, default=4, help="data-parallel trainer ranks, each a process")
    parser.add_argument("--groups-per-producer", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=512, help="tokens per trajectory of the fan-in's groups")
    parser.add_argument("--trajectories", type=int, default=8)
    parser.add_argument("--step", type=int, default=16, help="groups a rank pulls at a time")
    parser.add_argument("--wal-gb", type=float, nargs="*", default=list(RECOVERY_GB),
                        help="log sizes to recover from (none: skip)")
    parser.add_argument("--workdir", type=Path, help="where the logs go (default: a temp dir)")
    parser.set_defaults(measure=_measure)


def _measure(args) -> dict:
    for name in ("producers", "pullers", "groups_per_producer", "tokens", "trajectories", "step"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')}: must be at least 1, got {getattr(args, name)}")
    if any(size <= 0 for size in args.wal_gb):
        raise ConfigError(f"--wal-gb: every size must be above 0, got {args.wal_gb}")
    return bench_scale(producers=args.producers, pullers=args.pullers, groups_per_producer=args.groups_per_producer,
                       trajectories=args.trajectories, tokens=args.tokens, step=args.step,
                       wal_gb=tuple(args.wal_gb), workdir=args.workdir)


if __name__ == "__main__":
    role, address, *numbers = sys.argv[1:]
    worker = {"producer": _producer, "puller": _puller}[role]
    print(json.dumps(worker(address, *map(int, numbers))), flush=True)
