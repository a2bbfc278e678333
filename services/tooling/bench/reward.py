"""`zerobubble bench reward`: math scores/s with 1 worker and with N, and sandboxed programs/s, in warm slots and
in a bubblewrap sandbox each, against bare interpreter spawns of the same program on the same input at the same
concurrency, all measured in one run.

`zerobubble bench reward --load`: many concurrent closed-loop scoring streams against one reward service
process: items/s, latency percentiles, how each stream fared, health-check failures meanwhile, and the
service's memory before and after."""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from zerobubble.common.clients.reward import score_request
from zerobubble.common.sandbox import runner as sandbox
from zerobubble.common.sandbox.config import SandboxConfig
from zerobubble.common.sandbox.runner import CodeSandbox
from zerobubble.reward.local import reward_client
from zerobubble.tooling.bench import stop_service
from zerobubble.v1 import reward_pb2

# Answers in several notations so the measurement exercises real parsing, not one cached case.
_MATH = [
    ("\\frac{1}{2}", "0.5"), ("7425000", "7,425,000"), ("\\sqrt{2}", "\\sqrt{2}"), ("3", "4"),
    ("x^2+2x+1", "(x+1)^2"), ("\\pi", "3.14159"), ("(1,2)", "(1, 2)"), ("\\frac{3}{4}", "75\\%"),
]
_PROGRAM_SOURCE = "import sys\nprint(sum(int(x) for x in sys.stdin.read().split()))\n"
_PROGRAM = f"```python\n{_PROGRAM_SOURCE}```"


def _math_requests(count: int):
    return [
        score_request("boxed", f"Step {i}: so \\boxed{{{pred}}}", gold, id=str(i))
        for i, (gold, pred) in ((i, _MATH[i % len(_MATH)]) for i in range(count))
    ]


def _math_rate(workers: int, count: int) -> float:
    with reward_client(overrides=[f"math.workers={workers}", "sandbox.slots=1"]) as client:
        client.score_batch(_math_requests(len(_MATH)))
        start = time.perf_counter()
        client.score_batch(_math_requests(count))
        return count / (time.perf_counter() - start)


def _code_runs(stack: ExitStack, slots: int, warm: bool) -> Callable[[int], float]:
    """A reward service in this process whose sandbox slots are warm or cold, its slots' first runs done: returns
    a function that scores that many runs of the program and says how many seconds it took."""
    tests = {"inputs": ["1 2 3\n"], "outputs": ["6\n"]}
    overrides = [f"sandbox.slots={slots}", f"sandbox.warm_slots={str(warm).lower()}", "math.workers=1"]
    client = stack.enter_context(reward_client(overrides=overrides))

    def run(count: int) -> float:
        requests = [score_request("code", _PROGRAM, test_cases=tests, id=str(i)) for i in range(count)]
        start = time.perf_counter()
        results = client.score_batch(requests)
        elapsed = time.perf_counter() - start
        if not all(r.answer_ok for r in results):
            raise RuntimeError(f"benchmark program failed in the sandbox: {results[0].reason}")
        return elapsed

    run(slots)
    return run


def _spawns(stack: ExitStack, python: str, parallel: int) -> Callable[[int], float]:
    """The same program on the same input, each run a bare interpreter spawn (`python -I main.py`, as the sandbox
    starts it) with its output read back, at the same concurrency: returns a function that spawns that many and
    says how many seconds it took."""
    folder = stack.enter_context(tempfile.TemporaryDirectory())
    Path(folder, "main.py").write_text(_PROGRAM_SOURCE)
    pool = stack.enter_context(ThreadPoolExecutor(parallel))

    def spawn(_):
        done = subprocess.run([python, "-I", "main.py"], cwd=folder, input=b"1 2 3\n", capture_output=True,
                              check=True)
        if done.stdout != b"6\n":
            raise RuntimeError(f"the bare program printed {done.stdout!r}")

    def run(count: int) -> float:
        start = time.perf_counter()
        list(pool.map(spawn, range(count)))
        return time.perf_counter() - start

    return run


def _median_ms(run, count: int) -> float:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return round(1000 * statistics.median(times), 1)


def _sandbox_stages(python: str, count: int) -> dict:
    """Where a sandboxed run's time goes, one run at a time (medians): the same program spawned bare, what
    bubblewrap's namespaces and root cost alone, the launcher interpreter's start-up, and the whole run, in a
    bubblewrap sandbox of its own (cold) and in a warm slot."""
    box = CodeSandbox(SandboxConfig(slots=1, warm_slots=False))
    warm = CodeSandbox(SandboxConfig(slots=1))
    try:
        with tempfile.TemporaryDirectory() as folder:
            Path(folder, "main.py").write_text(_PROGRAM_SOURCE)
            bare = _median_ms(lambda: subprocess.run([python, "-I", "main.py"], cwd=folder, input=b"1 2 3\n",
                                                     capture_output=True, check=True), count)
        bwrap = [box.bwrap, *sandbox._ISOLATION, *sandbox._root_args(), "/bin/true"]
        return {
            "bare_program": bare,
            "bubblewrap_alone": _median_ms(lambda: subprocess.run(bwrap, check=True), count),
            "launcher_interpreter": _median_ms(
                lambda: subprocess.run([python, "-I", "-S", "-c", "pass"], check=True), count),
            "sandboxed_run_cold": _median_ms(lambda: box.run(_PROGRAM_SOURCE, "1 2 3\n"), count),
            "sandboxed_run_warm": _median_ms(lambda: warm.run(_PROGRAM_SOURCE, "1 2 3\n"), count),
        }
    finally:
        box.close()
        warm.close()


def bench_sandbox(programs: int = 40, rounds: int = 4) -> dict:
    """Sandboxed programs/s at one slot per core, in warm slots (the default) and in a bubblewrap sandbox each
    (cold), against bare spawns of the same program at the same concurrency, and the stages of one sandboxed
    run. The three take turns, a share of the programs each in every round, so that a change in the machine's load
    falls on all three alike."""
    cores = os.cpu_count() or 1
    # The baseline spawns the interpreter the sandbox runs programs with, not a PATH shim.
    probe = CodeSandbox(SandboxConfig(slots=1, warm_slots=False))
    python = probe.python
    probe.close()
    share = max(cores, programs // rounds)
    with ExitStack() as stack:
        sides = {"warm": _code_runs(stack, cores, warm=True), "bare": _spawns(stack, python, cores),
                 "cold": _code_runs(stack, cores, warm=False)}
        seconds = dict.fromkeys(sides, 0.0)
        for _ in range(rounds):
            for side, run in sides.items():
                seconds[side] += run(share)
    warm, spawn, cold = (share * rounds / seconds[side] for side in ("warm", "bare", "cold"))
    return {
        "cores": cores,
        "programs_each": share * rounds,
        "code_programs_per_s": round(warm, 1),
        "cold_code_programs_per_s": round(cold, 1),
        "bare_program_spawns_per_s": round(spawn, 1),
        "python": python,
        "code_vs_bare_spawn_ratio": round(warm / spawn, 3),
        "cold_vs_bare_spawn_ratio": round(cold / spawn, 3),
        "warm_vs_cold_ratio": round(warm / cold, 2),
        "sandbox_stages_ms": _sandbox_stages(python, max(5, programs // 2)),
    }


def bench_reward(items: int = 400, programs: int = 40, rounds: int = 4) -> dict:
    cores = os.cpu_count() or 1
    one = _math_rate(1, items)
    many = _math_rate(cores, items)
    figures = {
        "cores": cores,
        "math_scores_per_s_1_worker": round(one, 1),
        f"math_scores_per_s_{cores}_workers": round(many, 1),
        "math_speedup": round(many / one, 2),
        **bench_sandbox(programs, rounds),
    }
    from zerobubble.tooling.bench.reward_http import bench_http_vs_grpc  # it reuses _MATH from here

    figures.update(bench_http_vs_grpc(items))
    for name, value in figures.items():
        print(f"{name:>32}: {value}")
    return figures


# -- load: many closed-loop scoring streams against one service --------------------------------------

def _rss_mib(pid: int) -> float | None:
    """Resident memory of a process (Linux /proc), or None when it cannot be read."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


@contextmanager
def _reward_process(math_workers: int) -> Iterator[tuple[str, int]]:
    """`zerobubble serve reward` as its own process, as it is deployed: (address, pid)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "zerobubble", "--log-level", "WARNING", "serve", "reward",
         "--listen", "127.0.0.1:0", "--set", "server.metrics_port=null", "--set", f"math.workers={math_workers}"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        line = process.stdout.readline()
        if not line:
            raise RuntimeError(f"the reward service did not start (exit code {process.wait()})")
        yield json.loads(line)["address"], process.pid
    finally:
        stop_service(process)


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class _Load:
    """Closed-loop streams (each sends an item, waits for its score, sends the next) and a health probe,
    all on one event loop; every call has a deadline."""

    def __init__(self, address: str, streams: int, seconds: float, health_every: float, health_deadline: float):
        self.address = address
        self.streams = streams
        self.seconds = seconds
        self.health_every = health_every
        self.health_deadline = health_deadline
        self.latencies: list[list[float]] = [[] for _ in range(streams)]
        self.stream_errors: list[str] = []
        self.unanswered = 0
        self.health_seconds: list[float] = []
        self.health_failures = 0

    async def _stream(self, channel: grpc.aio.Channel, index: int, until: float) -> None:
        score_stream = channel.stream_stream(
            "/zerobubble.v1.RewardService/ScoreStream",
            request_serializer=reward_pb2.ScoreRequest.SerializeToString,
            response_deserializer=reward_pb2.ScoreResult.FromString)
        loop = asyncio.get_running_loop()
        call = score_stream(timeout=self.seconds + 60)
        sent = 0
        try:
            while loop.time() < until:
                gold, pred = _MATH[(index + sent) % len(_MATH)]
                started = time.perf_counter()
                await call.write(score_request("boxed", f"so \\boxed{{{pred}}}", gold, id=f"{index}.{sent}"))
                sent += 1
                # An item not scored by the end of the run (a starved stream's) is counted, not awaited.
                reply = await asyncio.wait_for(call.read(), timeout=max(0.0, until - loop.time()) + 5.0)
                if reply is grpc.aio.EOF:
                    self.stream_errors.append(f"stream {index} ended early: {(await call.code()).name}")
                    return
                self.latencies[index].append(time.perf_counter() - started)
        except TimeoutError:
            self.unanswered += 1
        except grpc.aio.AioRpcError as exc:
            self.stream_errors.append(f"stream {index}: {exc.code().name} {exc.details()}")
        finally:
            call.cancel()

    async def _probe(self, channel: grpc.aio.Channel, until: float) -> None:
        health = health_pb2_grpc.HealthStub(channel)
        loop = asyncio.get_running_loop()
        while loop.time() < until:
            started = time.perf_counter()
            try:
                reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=self.health_deadline)
                if reply.status != health_pb2.HealthCheckResponse.SERVING:
                    self.health_failures += 1
            except grpc.aio.AioRpcError:
                self.health_failures += 1
            self.health_seconds.append(time.perf_counter() - started)
            await asyncio.sleep(max(0.0, self.health_every - (time.perf_counter() - started)))

    async def run(self) -> None:
        # The probe has a connection of its own, as an orchestrator's would.
        async with grpc.aio.insecure_channel(self.address) as streams, \
                grpc.aio.insecure_channel(self.address) as probe:
            until = asyncio.get_running_loop().time() + self.seconds
            await asyncio.gather(self._probe(probe, until),
                                 *(self._stream(streams, index, until) for index in range(self.streams)))


def bench_reward_load(streams: int = 64, seconds: float = 60.0, server: str | None = None, pid: int | None = None,
                      math_workers: int | None = None, health_every: float = 0.1,
                      health_deadline: float = 1.0) -> dict:
    """`streams` closed-loop ScoreStream calls for `seconds` against one reward service (started here as
    its own process, or the one at `server`), with a health check every `health_every` s meanwhile."""
    with ExitStack() as stack:
        if server is None:
            server, pid = stack.enter_context(_reward_process(math_workers or os.cpu_count() or 1))
        rss_before = _rss_mib(pid) if pid else None
        load = _Load(server, streams, seconds, health_every, health_deadline)
        started = time.perf_counter()
        asyncio.run(load.run())
        elapsed = time.perf_counter() - started
        rss_after = _rss_mib(pid) if pid else None
    latencies = [value for stream in load.latencies for value in stream]
    per_stream = [len(stream) for stream in load.latencies]
    figures = {
        "streams": streams,
        "seconds": round(elapsed, 1),
        "items": len(latencies),
        "items_per_s": round(len(latencies) / elapsed, 1),
        "latency_p50_ms": _ms(_percentile(latencies, 0.50)),
        "latency_p99_ms": _ms(_percentile(latencies, 0.99)),
        "latency_max_ms": _ms(max(latencies, default=None)),
        "items_per_stream_min": min(per_stream),
        "items_per_stream_max": max(per_stream),
        "streams_starved": sum(1 for count in per_stream if count == 0),
        "items_unanswered_at_end": load.unanswered,
        "stream_errors": len(load.stream_errors),
        "health_checks": len(load.health_seconds),
        "health_failures": load.health_failures,
        "health_p99_ms": _ms(_percentile(load.health_seconds, 0.99)),
        "health_max_ms": _ms(max(load.health_seconds, default=None)),
        "service_rss_mib_before": rss_before,
        "service_rss_mib_after": rss_after,
    }
    for line in load.stream_errors[:5]:
        print(line)
    for name, value in figures.items():
        print(f"{name:>32}: {value}")
    return figures


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def register_bench(benches) -> None:
    parser = benches.add_parser("reward", help="math scores/s with 1 and N workers; sandboxed programs/s; "
                                "with --load, many concurrent scoring streams against one service")
    parser.add_argument("--items", type=int, default=400, help="math items per measurement")
    parser.add_argument("--programs", type=int, default=40, help="programs per measurement")
    parser.add_argument("--rounds", type=int, default=4,
                        help="the sandbox's turns: warm, bare and cold take turns this many times")
    parser.add_argument("--sandbox-only", action="store_true",
                        help="only the sandboxed programs, warm and cold, against bare spawns of the same program")
    parser.add_argument("--load", action="store_true",
                        help="closed-loop scoring streams: items/s, latency, health-check failures, service memory")
    parser.add_argument("--streams", type=int, default=64, help="--load: concurrent streams")
    parser.add_argument("--seconds", type=float, default=60.0, help="--load: how long")
    parser.add_argument("--server", help="--load: HOST:PORT of a running reward service (default: start one)")
    parser.add_argument("--pid", type=int, help="--load with --server: the service's process id, for its memory")
    parser.add_argument("--math-workers", type=int, help="--load: math.workers of the service started here "
                        "(default: the cores)")
    parser.add_argument("--health-every", type=float, default=0.1, help="--load: seconds between health checks")
    parser.add_argument("--health-deadline", type=float, default=1.0,
                        help="--load: a health check not answered SERVING within this many seconds is a failure")
    parser.set_defaults(measure=_measure)


def _measure(args) -> dict:
    if args.load:
        return bench_reward_load(streams=args.streams, seconds=args.seconds, server=args.server, pid=args.pid,
                                 math_workers=args.math_workers, health_every=args.health_every,
                                 health_deadline=args.health_deadline)
    if args.sandbox_only:
        return bench_sandbox(programs=args.programs, rounds=args.rounds)
    return bench_reward(items=args.items, programs=args.programs, rounds=args.rounds)
