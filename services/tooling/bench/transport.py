"""`zerobubble bench transport`: push-to-pull throughput through a real buffer process on loopback, next to
a plain loopback TCP socket moving the same bytes and the disk's fsynced write rate at the group's size (the limits,
transport_limits.py) and, for the 3.5 MiB group, the reference design's Ray actor queue moving the same bytes
(transport_ray.py, in the Ray environment), all in one run.

As in deployment, the pushing side (a rollout worker) and the pulling side (a trainer rank) are
processes of their own, and the puller commits once per training step, so the buffer's log
releases and reuses its segments as it does in a run.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from zerobubble.common.clients.buffer import BufferClient
from zerobubble.common.config import ConfigError
from zerobubble.tooling.bench.transport_limits import disk_fsync_rates, socket_throughput
from zerobubble.tooling.bench.transport_pusher import MIB, client_for, template

# (name, trajectories, tokens per trajectory, groups at scale 1). 57,344 tokens of int32 ids and float32
# log-probs, times 8, is the 3.5 MiB item of the reference's Ray buffer, measured here beside it.
CASES = [
    ("8x512 tokens", 8, 512, 4000),
    ("8x4096 tokens", 8, 4096, 1000),
    ("3.5 MiB", 8, 57_344, 300),
]
RAY_PYTHON = Path(".venv-ray/bin/python")
RAY_TIMEOUT_SECONDS = 900
COMMIT_EVERY = 64  # groups per training step
DISK_RECORDS = 100  # fsynced records of a group's size per pass of the disk probe

def buffer_config(folder: Path, prompts: int, fsync: str, max_bytes: int | None = None) -> Path:
    """A buffer config in `folder`: `prompts` prompts, room for as many groups (and `max_bytes`), its log in
    folder/wal. The same arguments write the same prompt file, which the log of an earlier start agrees with."""
    row = {"messages": {"role": "user", "content": "?"}, "gt_answer": "1"}
    rows = (json.dumps({**row, "id": i}) for i in range(prompts))
    (folder / "prompts.jsonl").write_text("\n".join(rows) + "\n")
    capacity = {"max_groups": prompts, **({} if max_bytes is None else {"max_bytes": max_bytes})}
    config = {
        "server": {"listen": "127.0.0.1:0", "metrics_port": None, "grace_seconds": 1.0},
        "prompts": {"path": str(folder / "prompts.jsonl")},
        "capacity": capacity,
        "wal": {"directory": str(folder / "wal"), "fsync": fsync},
    }
    (folder / "buffer.yaml").write_text(yaml.safe_dump(config))
    return folder / "buffer.yaml"


class BufferProcess:
    """A buffer service in its own process, as it runs in production, with its log in `folder`; started again on
    the same folder it recovers that log."""

    def __init__(self, folder: Path, prompts: int, fsync: str, max_bytes: int | None = None):
        config = buffer_config(folder, prompts, fsync, max_bytes)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "zerobubble", "serve", "buffer", "--config", str(config)],
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


def cpu_seconds(pid: int) -> float:
    """CPU time (user and system) a process has used so far; it may have exited, not yet reaped."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _stream_through(address: str, shape: tuple[int, int], count: int, commit_every: int,
                    errors: Path, buffer_pid: int) -> tuple[float, int, dict[str, float]]:
    """Seconds to move `count` groups from a pushing process to this one, pulling and committing a training step
    at a time; the commits made; and the CPU milliseconds per group of the buffer (process `buffer_pid`), the
    pusher and this puller over that time (which the load of the machine moves far less than the seconds)."""
    with open(errors, "w") as stderr:
        pusher = subprocess.Popen(
            [sys.executable, "-m", "zerobubble.tooling.bench.transport_pusher", address, *map(str, shape), str(count),
             "bench-stream"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True,
        )
    try:
        if pusher.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the pusher did not start:\n{errors.read_text()}")
        with client_for(address) as client:
            cpu = {"buffer": -cpu_seconds(buffer_pid), "pusher": -cpu_seconds(pusher.pid),
                   "puller": -time.process_time()}
            started = time.perf_counter()
            pusher.stdin.write("go\n")
            pusher.stdin.flush()
            commits = _pull_steps(client, count, commit_every, lambda: pusher.poll() is None)
            elapsed = time.perf_counter() - started
            cpu["puller"] += time.process_time()
            cpu["buffer"] += cpu_seconds(buffer_pid)
        report = json.loads(pusher.stdout.readline() or "null")
        cpu["pusher"] += cpu_seconds(pusher.pid)  # its report is its last act: the rest is its exit
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
    return elapsed, commits, {name: round(seconds / count * 1000, 2) for name, seconds in cpu.items()}


def ray_queue(python: Path, shape: tuple[int, int], count: int) -> dict[str, Any]:
    """The reference's actor-queue hand-off of `count` items of the same tensors (transport_ray.py), run by
    `python` of the Ray environment; {"skipped": why} where there is none."""
    if not python.exists():
        return {"skipped": f"no Ray environment at {python} (`make ray-env` builds it)"}
    done = subprocess.run([str(python), "-m", "zerobubble.tooling.bench.transport_ray", *map(str, shape), str(count)],
                          capture_output=True, text=True, timeout=RAY_TIMEOUT_SECONDS)
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        raise RuntimeError(f"the Ray side failed ({done.returncode}):\n{done.stderr[-2000:]}")
    report = json.loads(lines[-1])
    return {"ray_version": report["ray"], "item_bytes": report["item_bytes"], "items": report["items"],
            "seconds": round(report["seconds"], 3), "items_per_s": round(report["items"] / report["seconds"], 1)}


def _through_buffer(folder: Path, shape: tuple[int, int], count: int, fsync: str,
                    commit_every: int) -> tuple[float, int, dict[str, float]]:
    """Seconds for `count` groups through a fresh buffer process with its log in `folder`, the commits made, and
    CPU milliseconds per group by process."""
    folder.mkdir()
    buffer = BufferProcess(folder, count + 50, fsync)
    try:
        return _stream_through(buffer.address, shape, count, commit_every, folder / "pusher.log", buffer.process.pid)
    finally:
        buffer.close()


def _round(folder: Path, shape: tuple[int, int], count: int, size: int, fsync: str, commit_every: int,
           ray_python: Path | None, *, ray_first: bool) -> dict[str, Any]:
    """One measurement of the buffer beside its baselines (the Ray queue where `ray_python` is given), all
    under the same load."""
    figures: dict[str, Any] = {"load_average": round(os.getloadavg()[0], 2)}
    ray: dict[str, Any] = {}
    if ray_python is not None and ray_first:
        ray = ray_queue(ray_python, shape, count)
    seconds, figures["commits"], figures["cpu_ms_per_group"] = _through_buffer(folder, shape, count, fsync,
                                                                              commit_every)
    if ray_python is not None and not ray:
        ray = ray_queue(ray_python, shape, count)
    limit = socket_throughput(count * size, size)
    disk = disk_fsync_rates(folder, size, min(count, DISK_RECORDS))
    groups_per_s = count / seconds
    figures.update(
        seconds=round(seconds, 3),
        groups_per_s=round(groups_per_s, 1),
        mb_per_s=round(count * size / seconds / 1e6, 1),
        socket_mb_per_s=round(limit / 1e6, 1),
        socket_groups_per_s=round(limit / size, 1),
        ratio_to_socket=round(count * size / seconds / limit, 3),
        disk_fsync_groups_per_s={name: round(rate, 1) for name, rate in disk.items()},
        ratio_to_disk_fsync={name: round(groups_per_s / rate, 3) for name, rate in disk.items()},
    )
    if ray_python is not None:
        figures["ray_queue"] = ray
        if "items_per_s" in ray:
            figures["ratio_to_ray_queue"] = round(figures["groups_per_s"] / ray["items_per_s"], 2)
    return figures


def bench_transport(*, scale: float = 1.0, fsync: str = "interval", workdir: Path | None = None,
                    commit_every: int = COMMIT_EVERY, ray_python: Path = RAY_PYTHON,
                    rounds: int = 1, cases: list[str] | None = None) -> dict[str, Any]:
    """Measure every case of CASES (or those named in `cases`) with `scale` times its group count, the puller
    committing every `commit_every` groups, against a loopback socket, the disk's fsynced rate and (for groups
    over a MiB) the reference's Ray queue moving as many items of the same bytes, `rounds` times in turn; the
    figures of each round, and their medians, as a JSON-able dict. On a machine shared with other work the load
    moves between rounds, and a ratio is only read within one."""
    results: dict[str, Any] = {"benchmark": "transport", "fsync": fsync, "commit_every": commit_every,
                               "rounds": rounds, "cases": []}
    with tempfile.TemporaryDirectory(dir=workdir, prefix="zerobubble-bench-") as scratch:
        for index, (name, trajectories, tokens, groups_at_scale_1) in enumerate(CASES):
            if cases is not None and name not in cases:
                continue
            count = max(10, int(groups_at_scale_1 * scale))
            size = template(trajectories, tokens).ByteSize()
            per_round = [
                # Every other round measures the Ray queue first: neither side always runs in the other's wake.
                _round(Path(scratch) / f"case{index}-round{i}", (trajectories, tokens), count, size, fsync,
                       commit_every, ray_python if size > MIB else None, ray_first=i % 2 == 1)
                for i in range(rounds)
            ]
            case = {"case": name, "group_bytes": size, "groups": count, "commits": per_round[0]["commits"]}
            for key in ("groups_per_s", "mb_per_s", "socket_mb_per_s", "socket_groups_per_s", "ratio_to_socket",
                        "ratio_to_ray_queue"):
                if all(key in figures for figures in per_round):
                    case[key] = statistics.median(figures[key] for figures in per_round)
            for key in ("cpu_ms_per_group", "disk_fsync_groups_per_s", "ratio_to_disk_fsync"):
                case[key] = {name: statistics.median(figures[key][name] for figures in per_round)
                             for name in per_round[0][key]}
            if size > MIB:
                case["ray_queue"] = per_round[-1]["ray_queue"]
            case["rounds"] = per_round
            results["cases"].append(case)
    return results


def register_bench(benches) -> None:
    parser = benches.add_parser("transport", help="buffer push-to-pull throughput vs the reference's Ray actor "
                                "queue, a loopback TCP socket and the disk's fsynced write rate")
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the default group counts")
    parser.add_argument("--fsync", default="interval", choices=["always", "interval", "never"],
                        help="the buffer's write-ahead-log fsync policy")
    parser.add_argument("--workdir", type=Path, help="where the buffer keeps its log (default: a temp dir)")
    parser.add_argument("--commit-every", type=int, default=COMMIT_EVERY,
                        help="groups per training step: the puller commits after each")
    parser.add_argument("--rounds", type=int, default=1,
                        help="measure each case and its baselines this many times in turn; medians are reported "
                        "beside every round's figures and load average")
    parser.add_argument("--case", action="append", choices=[name for name, *_ in CASES], dest="cases",
                        help="measure this case only (repeatable; default: every case)")
    parser.add_argument("--ray-python", type=Path, default=RAY_PYTHON,
                        help="the Ray environment's interpreter (`make ray-env`); where absent the Ray queue is "
                        "skipped, saying so")
    parser.set_defaults(measure=_measure)


def _measure(args) -> dict:
    if args.scale <= 0:
        raise ConfigError(f"--scale: must be above 0, got {args.scale}")
    if args.commit_every < 1:
        raise ConfigError(f"--commit-every: must be at least 1, got {args.commit_every}")
    if args.rounds < 1:
        raise ConfigError(f"--rounds: must be at least 1, got {args.rounds}")
    return bench_transport(scale=args.scale, fsync=args.fsync, workdir=args.workdir, commit_every=args.commit_every,
                           ray_python=args.ray_python, rounds=args.rounds, cases=args.cases)

