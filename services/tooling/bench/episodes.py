"""`zerobubble bench episodes`: what turns cost. Multi-turn episodes played through a real environment service
(a user's environment class from a folder of its own, each episode in its own process) against the same number
of tokens generated single-turn by the same engine in the same run: episodes/s, generated tokens/s of each, the
environment's step latency (p50, p99) and the share of the episodes' time the engine waited for environments."""

from __future__ import annotations

import json
import statistics
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import torch

from zerobubble.common.config import ClientConfig, load_config
from zerobubble.common.episodes import EpisodeSpec
from zerobubble.environment.app import build as build_environment
from zerobubble.environment.config import EnvironmentServiceConfig
from zerobubble.rollout.engine import SamplingSettings
from zerobubble.rollout.engine_transformers import TransformersEngine
from zerobubble.rollout.episodes.driver import EpisodeDriver, EpisodePrompt
from zerobubble.rollout.episodes.remote import RemoteSessions
from zerobubble.rollout.episodes.render import TurnRenderer
from zerobubble.rollout.prompting import PromptBuilder
from zerobubble.tooling.tiny.model import SIZES, make_tiny_model
from zerobubble.v1 import common_pb2

# Answers every turn with a short observation until the episode has had its turns: the turns' cost, not a task's.
ENVIRONMENT = '''
class Turns:
    def __init__(self, turns=4):
        self.turns, self.seen = turns, 0

    def reset(self, row):
        return None

    def step(self, assistant_text):
        self.seen += 1
        done = self.seen >= self.turns
        return {"observation": None if done else f"turn {self.seen} seen", "reward": 0.0, "done": done, "info": {}}
'''


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def bench_episodes(*, prompts: int = 8, samples: int = 4, turns: int = 4, turn_tokens: int = 24,
                   model_size: str = "1m", threads: int = 1, rounds: int = 2) -> dict[str, Any]:
    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory(prefix="bench-episodes-") as tmp:
        folder = Path(tmp)
        model = make_tiny_model(folder / "model", size=model_size)
        (folder / "envs").mkdir()
        (folder / "envs" / "bench_turns.py").write_text(textwrap.dedent(ENVIRONMENT))
        service = build_environment(load_config(EnvironmentServiceConfig, None, {
            "server.listen": "127.0.0.1:0", "server.metrics_port": None,
            "environments": [{"name": "turns", "environment": "bench_turns:Turns", "path": str(folder / "envs")}],
        })).start()
        engine = TransformersEngine(model, seed=0)
        try:
            return _measure(engine, service.address, prompts=prompts, samples=samples, turns=turns,
                            turn_tokens=turn_tokens, rounds=rounds) | {"model_size": model_size, "threads": threads}
        finally:
            engine.close()
            service.stop(0)


def _measure(engine, address: str, *, prompts: int, samples: int, turns: int, turn_tokens: int,
             rounds: int) -> dict[str, Any]:
    spec = EpisodeSpec(default={"environment": "turns"}, max_turns=turns, max_turn_tokens=turn_tokens)
    # Room for every turn and observation: the episodes end when the environment says so.
    budget = turns * (turn_tokens + 64)
    sessions = RemoteSessions(ClientConfig(address=address))
    driver = EpisodeDriver(sessions, TurnRenderer(engine.tokenizer, spec.max_observation_tokens), spec,
                           max_new_tokens=budget)
    builder = PromptBuilder(engine.tokenizer, "", 64)
    items = [EpisodePrompt(common_pb2.Prompt(prompt_id=str(i), messages_json=json.dumps(
        [{"role": "user", "content": f"{i}+{i % 7}="}])), spec.default, builder) for i in range(prompts)]
    ids = [builder.build(item.prompt.messages_json) for item in items]
    sampling = SamplingSettings(n=samples, temperature=1.0, max_new_tokens=turn_tokens, seed=0)
    driver.play(engine, items[:1], SamplingSettings(n=1, temperature=1.0, max_new_tokens=4, seed=0))   # warm up
    multi, single = [], []
    for round_index in range(rounds):
        driver.timings.engine_seconds = driver.timings.environment_seconds = 0.0
        driver.timings.step_seconds.clear()
        started = time.perf_counter()
        _, played = driver.play(engine, items, sampling)
        seconds = time.perf_counter() - started
        model_tokens = sum(int(s.loss_mask.sum()) for per_prompt in played for s in per_prompt)
        episodes = sum(len(per_prompt) for per_prompt in played)
        multi.append({"seconds": seconds, "episodes": episodes, "model_tokens": model_tokens,
                      "turns_mean": statistics.mean(s.episode.turns for p in played for s in p),
                      "engine_seconds": driver.timings.engine_seconds,
                      "environment_seconds": driver.timings.environment_seconds,
                      "steps": list(driver.timings.step_seconds)})
        # The same number of model tokens in one turn per sample: the engine without episodes around it.
        per_sample = max(1, round(model_tokens / episodes))
        started = time.perf_counter()
        out = engine.generate(ids, SamplingSettings(n=samples, temperature=1.0, max_new_tokens=per_sample,
                                                    seed=round_index))
        single.append({"seconds": time.perf_counter() - started,
                       "tokens": sum(len(s.token_ids) for per_prompt in out for s in per_prompt)})
    steps = [x for run in multi for x in run["steps"]]
    multi_rate = sum(r["model_tokens"] for r in multi) / sum(r["seconds"] for r in multi)
    single_rate = sum(r["tokens"] for r in single) / sum(r["seconds"] for r in single)
    waited = sum(r["environment_seconds"] for r in multi)
    return {
        "episodes": sum(r["episodes"] for r in multi), "turns_mean": round(statistics.mean(r["turns_mean"]
                                                                                           for r in multi), 2),
        "episodes_per_s": round(sum(r["episodes"] for r in multi) / sum(r["seconds"] for r in multi), 2),
        "multi_turn_tokens_per_s": round(multi_rate, 1),
        "single_turn_tokens_per_s": round(single_rate, 1),
        "multi_vs_single": round(multi_rate / single_rate, 3),
        "step_latency_ms_p50": round(1000 * percentile(steps, 0.5), 2),
        "step_latency_ms_p99": round(1000 * percentile(steps, 0.99), 2),
        "environment_wait_fraction": round(waited / (waited + sum(r["engine_seconds"] for r in multi)), 3),
        "prompts": len(items), "samples": sampling.n, "turns": turns, "turn_tokens": turn_tokens, "rounds": rounds,
    }


def register_bench(benches) -> None:
    parser = benches.add_parser("episodes", help="multi-turn episodes through the environment service vs the same "
                                "tokens single-turn: episodes/s, tokens/s, step latency, engine time waiting")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=4, help="episodes per prompt (num_generations)")
    parser.add_argument("--turns", type=int, default=4, help="assistant turns per episode")
    parser.add_argument("--turn-tokens", type=int, default=24, help="new tokens per turn at most")
    parser.add_argument("--model-size", default="1m", choices=sorted(SIZES))
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--rounds", type=int, default=2, help="multi-turn runs, each followed by its single-turn one")
    parser.set_defaults(measure=lambda args: bench_episodes(
        prompts=args.prompts, samples=args.samples, turns=args.turns, turn_tokens=args.turn_tokens,
        model_size=args.model_size, threads=args.threads, rounds=args.rounds))
