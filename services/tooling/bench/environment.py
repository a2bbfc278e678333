"""`zerobubble bench environment`: what the environment service adds to each turn of an episode, measured through
a `zerobubble serve environment` process started as a user would.

For the built-in calculator (the service's own code, on its threads) and for a user's environment (a class in a
folder of its own, each episode in a process forked for it): the latency of opening an episode and of one step,
p50 and p99, one call at a time; then episodes at once, `--concurrency` of them stepping together, as a rollout
worker's batch does. The baseline, measured in the same run, is the gRPC round trip of a call that runs nothing
(ListEnvironments): what is above it is the environment's cost.
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
        self.turns += 1
        self.left -= 1
        return {"observation": [{"role": "user", "content": str(self.turns)}], "reward": 0.1,
                "done": self.left <= 0, "info": {}}
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
    opens, steps = [], []
    for _ in range(samples):
        started = time.perf_counter()
        episode = client.open_episode(environment, row).episode_id
        opens.append(time.perf_counter() - started)
        steps.append(_timed(lambda episode=episode: client.step_episode(episode, text)))
        client.close_episode(episode)
    return {"open": _ms(opens), "step": _ms(steps)}


def _concurrent(client: EnvironmentClient, environment: str, row: dict, text: str, episodes: int, turns: int,
                concurrency: int) -> dict:
    """`episodes` episodes of `turns` steps, `concurrency` at once: episodes/s, steps/s and step latency."""
    steps: list[float] = []

    def play(_: int) -> None:
        episode = client.open_episode(environment, row).episode_id
        for _ in range(turns):
            steps.append(_timed(lambda: client.step_episode(episode, text)))
        client.close_episode(episode)

    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(play, range(episodes)))
    seconds = time.perf_counter() - started
    return {"episodes_per_s": round(episodes / seconds, 1), "steps_per_s": round(len(steps) / seconds, 1),
            "step": _ms(steps)}


def bench_environment(samples: int, episodes: int, turns: int, concurrency: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="zb-env-bench-") as scratch:
        folder = Path(scratch)
        (folder / "bench_envs.py").write_text(_USER_MODULE)
        config = folder / "environment.yaml"
        config.write_text(yaml.safe_dump({
            "server": {"listen": "127.0.0.1:0", "metrics_port": None},
            "environments": [{"name": "calculator", "builtin": "calculator", "final_answer": "last_number"},
                             {"name": "counter", "environment": "bench_envs:Counter", "path": str(folder)}]}))
        started = time.monotonic()
        serve = subprocess.Popen([sys.executable, "-m", "zerobubble", "serve", "environment", "--config",
                                  str(config)], stdout=subprocess.PIPE, text=True)
        try:
            address = json.loads(serve.stdout.readline())["address"]
            print(f"environment service up in {time.monotonic() - started:.1f} s", flush=True)
            with EnvironmentClient(ClientConfig(address=address, timeout_seconds=60)) as client:
                baseline = _ms([_timed(client.list_environments) for _ in range(samples)])
                many = 10 ** 9  # the counter never ends an episode within a measurement
                figures = {
                    "grpc_round_trip": baseline,
                    "calculator": _latencies(client, "calculator", {"ground_truth": "413"}, _CALL, samples),
                    "user_environment": _latencies(client, "counter", {"turns": many}, "next", samples),
                    "calculator_concurrent": _concurrent(client, "calculator", {"ground_truth": "413"}, _CALL,
                                                         episodes, turns, concurrency),
                    "user_environment_concurrent": _concurrent(client, "counter", {"turns": many}, "next",
                                                               episodes, turns, concurrency),
                }
        finally:
            stop_service(serve)
    for name in ("calculator", "user_environment"):
        print(f"{name}: open p50 {figures[name]['open']['p50_ms']} ms, step p50 {figures[name]['step']['p50_ms']} "
              f"ms p99 {figures[name]['step']['p99_ms']} ms (a call running nothing: p50 {baseline['p50_ms']} ms); "
              f"{concurrency} at once: {figures[name + '_concurrent']['steps_per_s']} steps/s", flush=True)
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
