"""`zerobubble bench environment`: what the environment service adds to each turn of an episode, measured through
a `zerobubble serve environment` process started as a user would.

For the built-in calculator (the service's own code, on its threads) and for a user's environment (a class in a
folder of its own, each episode in a process forked for it): the latency of opening an episode and of one step,
p50 and p99, one call at a time; then episodes at once, `--concurrency` of them stepping together, as a rollout
worker's batch does. The baseline, measured in the same run, is the gRPC round trip of a call that runs nothing
(ListEnvironments): what is above it is the environment's cost. The user's environment is measured twice in the
same run: isolated (the default where the machine allows it: bubblewrap's namespaces, workers.uid, a pids cgroup per
episode) and with `workers.isolation: off` (the service's user, no namespace), the path before isolation; the
figures say which one was isolated, as the episodes themselves reported it (their uid).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from zerobubble.common.clients.environment import EnvironmentClient
from zerobubble.common.config import ClientConfig
from zerobubble.tooling.bench import stop_service

_USER_MODULE = '''
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first
        b: the second
    """
    return a + b


class Counter:
    """Counts the turns; done after `turns` of them."""

    tools = [add]

    def reset(self, row):
        self.turns, self.left = 0, int(row["turns"])
        return " Count with me."

    def step(self, assistant_text):
        import os

        self.turns += 1
        self.left -= 1
        return {"observation": [{"role": "user", "content": str(self.turns)}], "reward": 0.1,
                "done": self.left <= 0, "info": {"uid": os.getuid(), "turn": self.turns}}
'''
_CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "12 * 34 + 5"}}</tool_call>'


def _ms(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    return {"p50_ms": round(statistics.median(ordered) * 1000, 3),
            "p99_ms": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1000, 3)}


def _timed(call) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def _latencies(client: EnvironmentClient, environment: str, row: dict, text: str, samples: int) -> dict:
    """Open and step latency; `steps` counts the steps that answered as a step (not an ended episode), `uids` the
    user ids the steps reported (a user's environment's info), which say whether it ran isolated."""
    opens, steps, answered, uids = [], [], 0, set()
    for _ in range(samples):
        started = time.perf_counter()
        episode = client.open_episode(environment, row).episode_id
        opens.append(time.perf_counter() - started)
        started = time.perf_counter()
        reply = client.step_episode(episode, text)
        steps.append(time.perf_counter() - started)
        answered += not reply.ended_reason
        uids.add(json.loads(reply.info_json or "{}").get("uid"))
        client.close_episode(episode)
    return {"open": _ms(opens), "step": _ms(steps), "steps": answered, "uids": sorted(uid for uid in uids
                                                                                       if uid is not None)}


def _concurrent(client: EnvironmentClient, environment: str, row: dict, text: str, episodes: int, turns: int,
                concurrency: int) -> dict:
    """`episodes` episodes of `turns` steps, `concurrency` at once: episodes/s, steps/s and step latency."""
    steps: list[float] = []

    def play(_: int) -> None:
        episode = client.open_episode(environment, row).episode_id
        for _ in range(turns):
            started = time.perf_counter()
            if not client.step_episode(episode, text).ended_reason:
                steps.append(time.perf_counter() - started)
        client.close_episode(episode)

    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(play, range(episodes)))
    seconds = time.perf_counter() - started
    return {"episodes_per_s": round(episodes / seconds, 1), "steps_per_s": round(len(steps) / seconds, 1),
            "steps": len(steps), "step": _ms(steps)}


def _serve(folder: Path, isolation: str) -> subprocess.Popen:
    config = folder / f"environment-{isolation}.yaml"
    config.write_text(yaml.safe_dump({
        "server": {"listen": "127.0.0.1:0", "metrics_port": None},
        "workers": {"isolation": isolation},
        "environments": [{"name": "calculator", "builtin": "calculator", "final_answer": "last_number"},
                         {"name": "counter", "environment": "bench_envs:Counter", "path": str(folder)}]}))
    return subprocess.Popen([sys.executable, "-m", "zerobubble", "serve", "environment", "--config", str(config)],
                            stdout=subprocess.PIPE, text=True)


def _measured(serve: subprocess.Popen, samples: int, episodes: int, turns: int, concurrency: int,
              calculator: bool) -> dict:
    address = json.loads(serve.stdout.readline())["address"]
    many = 10 ** 9  # the counter never ends an episode within a measurement
    figures = {}
    with EnvironmentClient(ClientConfig(address=address, timeout_seconds=60)) as client:
        if calculator:
            figures["grpc_round_trip"] = _ms([_timed(client.list_environments) for _ in range(samples)])
            figures["calculator"] = _latencies(client, "calculator", {"ground_truth": "413"}, _CALL, samples)
            figures["calculator_concurrent"] = _concurrent(client, "calculator", {"ground_truth": "413"}, _CALL,
                                                           episodes, turns, concurrency)
        figures["user_environment"] = _latencies(client, "counter", {"turns": many}, "next", samples)
        figures["user_environment_concurrent"] = _concurrent(client, "counter", {"turns": many}, "next", episodes,
                                                             turns, concurrency)
    return figures


def bench_environment(samples: int, episodes: int, turns: int, concurrency: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="zb-env-bench-") as scratch:
        folder = Path(scratch)
        folder.chmod(0o755)  # readable by the isolated environments' user
        (folder / "bench_envs.py").write_text(_USER_MODULE)
        figures = {}
        for isolation, calculator in (("off", False), ("auto", True)):
            started = time.monotonic()
            serve = _serve(folder, isolation)
            try:
                measured = _measured(serve, samples, episodes, turns, concurrency, calculator)
            finally:
                stop_service(serve)
            print(f"environment service (workers.isolation: {isolation}) measured in "
                  f"{time.monotonic() - started:.1f} s", flush=True)
            if isolation == "off":
                figures["user_environment_unisolated"] = measured["user_environment"]
                figures["user_environment_unisolated_concurrent"] = measured["user_environment_concurrent"]
            else:
                figures.update(measured)
    baseline = figures["grpc_round_trip"]
    for name in ("calculator", "user_environment", "user_environment_unisolated"):
        print(f"{name}: open p50 {figures[name]['open']['p50_ms']} ms, step p50 {figures[name]['step']['p50_ms']} "
              f"ms p99 {figures[name]['step']['p99_ms']} ms (a call running nothing: p50 {baseline['p50_ms']} ms); "
              f"{concurrency} at once: {figures[name + '_concurrent']['steps_per_s']} steps/s", flush=True)
    isolated, before = figures["user_environment"], figures["user_environment_unisolated"]
    figures["isolation_cost"] = {
        "isolated": bool(isolated["uids"]) and 0 not in isolated["uids"],
        "open_p50_ratio": round(isolated["open"]["p50_ms"] / before["open"]["p50_ms"], 2),
        "step_p50_ratio": round(isolated["step"]["p50_ms"] / before["step"]["p50_ms"], 2)}
    print(f"isolation: {figures['isolation_cost']}", flush=True)
    return {"samples": samples, "episodes": episodes, "turns": turns, "concurrency": concurrency, **figures}


def _measure(args) -> dict:
    return bench_environment(args.samples, args.episodes, args.turns, args.concurrency)


def register_bench(benches) -> None:
    parser = benches.add_parser("environment", help="environment service: open and step latency p50/p99 (built-in "
                                "and a user's environment) against a gRPC round trip; steps/s with episodes at once")
    parser.add_argument("--samples", type=int, default=200, help="opens and steps timed one at a time")
    parser.add_argument("--episodes", type=int, default=64, help="episodes of the concurrent measurement")
    parser.add_argument("--turns", type=int, default=8, help="steps of each episode there")
    parser.add_argument("--concurrency", type=int, default=16, help="episodes stepping at once there")
    parser.set_defaults(measure=_measure)
