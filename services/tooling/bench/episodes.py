"""`zerobubble bench episodes`: what turns cost. Multi-turn episodes played through a real environment service
(a user's environment class from a folder of its own, each episode in its own process), each schedule against the
same number of tokens generated single-turn by the same engine in the same run:

- lockstep: every live episode's next turn in one engine call, then every episode's step;
- loops: a loop per episode over the engine's continuous batcher, which keeps each episode's KV cache between turns.

Then, with an environment whose steps take a seeded 10 to 500 ms, several batches played by each schedule one
after another, and by the loops with batches overlapping as the rollout worker overlaps them
(generation.batches_in_flight: the next batch starts while the last one's slowest episodes play): episodes/s.
Printed: tokens/s of each beside single-turn, episodes/s, the environment's step latency (p50, p99), the share of
the time the engine idled, and the KV cache an episode holds between its turns."""

from __future__ import annotations

import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from zerobubble.common.config import ClientConfig
from zerobubble.common.episodes import EpisodeSpec
from zerobubble.rollout.batches_in_flight import BatchesInFlight
from zerobubble.rollout.engine import SamplingSettings
from zerobubble.rollout.engine_transformers import TransformersEngine
from zerobubble.rollout.episodes.driver import EpisodeDriver, EpisodePrompt
from zerobubble.rollout.episodes.remote import RemoteSessions
from zerobubble.rollout.episodes.render import TurnRenderer
from zerobubble.rollout.prompting import PromptBuilder
from zerobubble.tooling.bench import stop_service
from zerobubble.tooling.tiny.model import SIZES, make_tiny_model
from zerobubble.v1 import common_pb2

# Answers every turn with a short observation until the episode has had its turns: the turns' cost, not a task's.
# SlowTurns sleeps a seeded 10 to 500 ms a step (seeded by the prompt and the step: a tool's varying latency).
ENVIRONMENT = '''
import random
import time


class Turns:
    delay = False

    def __init__(self, turns=4):
        self.turns, self.seen, self.prompt = turns, 0, ""

    def reset(self, row):
        self.prompt = row["prompt_id"]
        return None

    def step(self, assistant_text):
        self.seen += 1
        if self.delay:
            time.sleep(random.Random(f"{self.prompt}-{self.seen}").uniform(0.01, 0.5))
        done = self.seen >= self.turns
        return {"observation": None if done else f"turn {self.seen} seen", "reward": 0.0, "done": done, "info": {}}


class SlowTurns(Turns):
    delay = True
'''
SCHEDULES = ("lockstep", "loops")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def bench_episodes(*, prompts: int = 8, samples: int = 4, turns: int = 4, turn_tokens: int = 24,
                   model_size: str = "1m", threads: int = 1, rounds: int = 2, slow_batches: int = 6,
                   in_flight: int = 3) -> dict[str, Any]:
    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory(prefix="bench-episodes-") as tmp:
        folder = Path(tmp)
        model = make_tiny_model(folder / "model", size=model_size)
        (folder / "envs").mkdir()
        (folder / "envs" / "bench_turns.py").write_text(textwrap.dedent(ENVIRONMENT))
        envs = str(folder / "envs")
        config = folder / "environment.yaml"
        config.write_text(yaml.safe_dump({
            "server": {"listen": "127.0.0.1:0", "metrics_port": None},
            "environments": [{"name": "turns", "environment": "bench_turns:Turns", "path": envs},
                             {"name": "slow", "environment": "bench_turns:SlowTurns", "path": envs}]}))
        # A process of its own, as deployed: its threads do not share the engine's interpreter.
        service = subprocess.Popen([sys.executable, "-m", "zerobubble", "serve", "environment", "--config",
                                    str(config)], stdout=subprocess.PIPE, text=True)
        engine = TransformersEngine(model, seed=0)
        try:
            address = json.loads(service.stdout.readline())["address"]
            return _measure(engine, address, prompts=prompts, samples=samples, turns=turns,
                            turn_tokens=turn_tokens, rounds=rounds, slow_batches=slow_batches,
                            in_flight=in_flight) | {"model_size": model_size, "threads": threads}
        finally:
            engine.close()
            stop_service(service)


class _Schedules:
    """The two schedules' drivers over one environment service, with the prompts they play."""

    def __init__(self, engine, address: str, *, prompts: int, turns: int, turn_tokens: int):
        self.engine = engine
        self.spec = EpisodeSpec(default={"environment": "turns"}, max_turns=turns, max_turn_tokens=turn_tokens)
        # Room for every turn and observation: the episodes end when the environment says so.
        budget = turns * (turn_tokens + 64)
        sessions = RemoteSessions(ClientConfig(address=address))
        renderer = TurnRenderer(engine.tokenizer, self.spec.max_observation_tokens)
        self.drivers = {name: EpisodeDriver(sessions, renderer, self.spec, max_new_tokens=budget,
                                            loops=name == "loops") for name in SCHEDULES}
        self.builder = PromptBuilder(engine.tokenizer, "", 64)
        self.count = prompts

    def items(self, environment: str) -> list[EpisodePrompt]:
        route = self.spec.route(None).model_copy(update={"environment": environment})
        return [EpisodePrompt(common_pb2.Prompt(prompt_id=str(i), messages_json=json.dumps(
            [{"role": "user", "content": f"{i}+{i % 7}="}])), route, self.builder) for i in range(self.count)]

    def play(self, name: str, environment: str, sampling: SamplingSettings, *, batches: int = 1,
             in_flight: int = 1) -> dict[str, Any]:
        """`batches` batches of the prompts (each seeded apart), up to `in_flight` of them playing at once."""
        driver = self.drivers[name]
        driver.timings.engine_seconds = 0.0
        driver.timings.step_seconds.clear()
        busy = self.engine.continuous().stats.busy_seconds
        played: list[list[list]] = []
        playing = BatchesInFlight(in_flight, lambda own: driver.play(self.engine, self.items(environment), own)[1],
                                  played.append)
        started = time.perf_counter()
        for index in range(batches):
            playing.take_slot(threading.Event())
            playing.start(dataclasses.replace(sampling, seed=sampling.seed + index))
        playing.drain()
        if playing.error is not None:
            raise playing.error
        seconds = time.perf_counter() - started
        engine_seconds = driver.timings.engine_seconds if name == "lockstep" else \
            self.engine.continuous().stats.busy_seconds - busy
        samples = [s for batch in played for per_prompt in batch for s in per_prompt]
        return {"seconds": seconds, "episodes": len(samples), "model_tokens": sum(int(s.loss_mask.sum())
                                                                                 for s in samples),
                "turns_mean": statistics.mean(s.episode.turns for s in samples), "engine_seconds": engine_seconds,
                "steps": list(driver.timings.step_seconds)}

    def close(self) -> None:
        for driver in self.drivers.values():
            driver.close()


def _measure(engine, address: str, *, prompts: int, samples: int, turns: int, turn_tokens: int,
             rounds: int, slow_batches: int, in_flight: int) -> dict[str, Any]:
    schedules = _Schedules(engine, address, prompts=prompts, turns=turns, turn_tokens=turn_tokens)
    ids = [schedules.builder.build(item.prompt.messages_json) for item in schedules.items("turns")]
    sampling = SamplingSettings(n=samples, temperature=1.0, max_new_tokens=turn_tokens, seed=0)
    warm_up = SamplingSettings(n=1, temperature=1.0, max_new_tokens=4, seed=0)
    for name in SCHEDULES:
        schedules.play(name, "turns", warm_up)
    runs: dict[str, list[dict]] = {name: [] for name in SCHEDULES}
    single: list[dict] = []
    kept = engine.continuous().kept
    kept_bytes, kept_episodes = 0, 0
    try:
        for round_index in range(rounds):
            for name in SCHEDULES:
                runs[name].append(schedules.play(name, "turns", sampling))
                if name == "loops":
                    kept_bytes, kept_episodes = max((kept.peak_bytes, kept.peak_entries), (kept_bytes, kept_episodes))
            # The same number of model tokens in one turn per sample: the engine without episodes around it.
            model_tokens = runs["loops"][-1]["model_tokens"]
            per_sample = max(1, round(model_tokens / runs["loops"][-1]["episodes"]))
            started = time.perf_counter()
            out = engine.generate(ids, SamplingSettings(n=samples, temperature=1.0, max_new_tokens=per_sample,
                                                        seed=round_index))
            single.append({"seconds": time.perf_counter() - started,
                           "tokens": sum(len(s.token_ids) for per_prompt in out for s in per_prompt)})
        slow = {name: schedules.play(name, "slow", sampling, batches=slow_batches) for name in SCHEDULES}
        overlapped = schedules.play("loops", "slow", sampling, batches=slow_batches, in_flight=in_flight)
    finally:
        schedules.close()

    def rate(items: list[dict], what: str) -> float:
        return sum(r[what] for r in items) / sum(r["seconds"] for r in items)

    single_rate = rate(single, "tokens")
    figures: dict[str, Any] = {"single_turn_tokens_per_s": round(single_rate, 1)}
    for name in SCHEDULES:
        multi = runs[name]
        steps = [x for run in multi for x in run["steps"]]
        figures[name] = {
            "episodes": sum(r["episodes"] for r in multi),
            "turns_mean": round(statistics.mean(r["turns_mean"] for r in multi), 2),
            "episodes_per_s": round(rate(multi, "episodes"), 2),
            "tokens_per_s": round(rate(multi, "model_tokens"), 1),
            "vs_single_turn": round(rate(multi, "model_tokens") / single_rate, 3),
            "step_latency_ms_p50": round(1000 * percentile(steps, 0.5), 2),
            "step_latency_ms_p99": round(1000 * percentile(steps, 0.99), 2),
            "engine_idle_fraction": round(1 - sum(r["engine_seconds"] for r in multi) /
                                          sum(r["seconds"] for r in multi), 3),
            "slow_steps_episodes_per_s": round(rate([slow[name]], "episodes"), 2),
        }
    figures |= {
        "loops_vs_lockstep_tokens": round(figures["loops"]["tokens_per_s"] / figures["lockstep"]["tokens_per_s"], 3),
        "loops_vs_lockstep_slow_steps": round(figures["loops"]["slow_steps_episodes_per_s"] /
                                              figures["lockstep"]["slow_steps_episodes_per_s"], 3),
        # The worker's schedule with generation.batches_in_flight: batches overlapping, a loop per episode.
        "overlapped": {"batches_in_flight": in_flight, "episodes": overlapped["episodes"],
                       "slow_steps_episodes_per_s": round(rate([overlapped], "episodes"), 2),
                       "engine_idle_fraction": round(1 - overlapped["engine_seconds"] / overlapped["seconds"], 3)},
        # Held between an episode's turns, at the most episodes kept at once.
        "kv_kept_bytes_per_episode": round(kept_bytes / kept_episodes) if kept_episodes else 0,
        "prompts": prompts, "samples": samples, "turns": turns, "turn_tokens": turn_tokens, "rounds": rounds,
        "slow_batches": slow_batches,
    }
    figures["overlapped_vs_lockstep_slow_steps"] = round(figures["overlapped"]["slow_steps_episodes_per_s"] /
                                                         figures["lockstep"]["slow_steps_episodes_per_s"], 3)
    return figures


def register_bench(benches) -> None:
    parser = benches.add_parser("episodes", help="multi-turn episodes in lockstep and in a loop per episode over the "
                                "continuous batcher vs the same tokens single-turn: tokens/s; episodes/s with slow "
                                "steps, also with batches in flight; step latency, engine idle, KV kept per episode")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=4, help="episodes per prompt (num_generations)")
    parser.add_argument("--turns", type=int, default=4, help="assistant turns per episode")
    parser.add_argument("--turn-tokens", type=int, default=24, help="new tokens per turn at most")
    parser.add_argument("--model-size", default="1m", choices=sorted(SIZES))
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--rounds", type=int, default=2, help="multi-turn runs, each followed by its single-turn one")
    parser.add_argument("--slow-batches", type=int, default=6, help="batches each schedule plays with slow steps")
    parser.add_argument("--in-flight", type=int, default=3, help="batches at once in the overlapped schedule")
    parser.set_defaults(measure=lambda args: bench_episodes(
        prompts=args.prompts, samples=args.samples, turns=args.turns, turn_tokens=args.turn_tokens,
        model_size=args.model_size, threads=args.threads, rounds=args.rounds, slow_batches=args.slow_batches,
        in_flight=args.in_flight))
