"""Periodic evaluation on held-out sets: n samples per prompt, pass@1 and pass@k, a JSONL per version."""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections import defaultdict
from pathlib import Path

from zerobubble.common.clients.reward import RewardClient
from zerobubble.common.data import load_data
from zerobubble.rollout.config import EvalConfig
from zerobubble.rollout.engine import Engine, SamplingSettings
from zerobubble.rollout.episodes.play import Player
from zerobubble.rollout.metrics import RolloutMetrics

log = logging.getLogger(__name__)


PROGRESS_FILE = "progress.json"


def write_progress(directory: Path, progress: dict) -> None:
    """Replaced whole, so a reader never sees half of it."""
    directory.mkdir(parents=True, exist_ok=True)
    partial = directory / f".{PROGRESS_FILE}.partial"
    partial.write_text(json.dumps(progress))
    os.replace(partial, directory / PROGRESS_FILE)


def question_text(messages_json: str) -> str:
    """The last user message of a prompt's chat messages: what the question asked."""
    users = [m.get("content") for m in json.loads(messages_json) if isinstance(m, dict) and m.get("role") == "user"]
    return str(users[-1]) if users else ""


def pass_at_k(n: int, correct: int, k: int) -> float:
    """Unbiased pass@k from n samples of which `correct` passed (Chen et al. 2021, the Codex paper)."""
    if n - correct < k:
        return 1.0
    return 1.0 - math.comb(n - correct, k) / math.comb(n, k)


class Evaluator:
    def __init__(self, config: EvalConfig, *, player: Player, reward: RewardClient,
                 metrics: RolloutMetrics, max_new_tokens: int, stop: tuple[str, ...] = (), seed: int = 0):
        self.config = config
        self.player = player
        self.reward = reward
        self.metrics = metrics
        self.sampling = SamplingSettings(n=config.samples_per_prompt, temperature=config.temperature,
                                         max_new_tokens=max_new_tokens, stop=stop, seed=seed)
        self.datasets = {name: load_data(spec, field=f"eval.datasets.{name}", default_split="test")
                         for name, spec in config.datasets.items()}
        self.done: set[int] = set()

    def due(self, version: int) -> bool:
        if not self.datasets or version in self.done:
            return False
        if not self.done:
            # Without at_start the starting weights are not evaluated, even at version 0 (a resumed run's worker
            # starts from the base model before the trainer's weights arrive).
            periodic = self.config.interval > 0 and version > 0 and version % self.config.interval == 0
            return self.config.at_start or periodic
        return self.config.interval > 0 and version >= max(self.done) + self.config.interval

    def maybe_run(self, engine: Engine) -> list[dict] | None:
        version = engine.policy_version
        if not self.due(version):
            return None
        self.done.add(version)
        return [self.run(engine, name, version) for name in self.datasets]

    def _play(self, engine: Engine, name: str, version: int, prompts: list, started: float):
        """Every prompt's samples and scores, a call of `prompts_per_call` prompts at a time, with how far it got
        in `progress.json` (what `up` shows while the starting weights are evaluated) and the log."""
        samples, scores, per_call = [], [], self.config.prompts_per_call
        for start in range(0, len(prompts), per_call):
            chunk = prompts[start:start + per_call]
            _, played = self.player.play(engine, chunk, self.sampling)
            samples.extend(played)
            scores.extend(self.player.score(self.reward.score_batch, chunk, played))
            done, seconds = len(samples), time.monotonic() - started
            left = seconds / done * (len(prompts) - done)
            write_progress(self.config.output_dir, {"dataset": name, "version": version, "prompts_done": done,
                                                    "prompts": len(prompts), "samples_per_prompt": self.sampling.n,
                                                    "seconds": round(seconds, 1), "seconds_left": round(left, 1)})
            if done < len(prompts):
                log.info("eval %s at version %d: %d/%d prompts, about %.0f s left", name, version, done,
                         len(prompts), left)
        return samples, scores

    def run(self, engine: Engine, name: str, version: int) -> dict:
        started = time.monotonic()
        rows = self.datasets[name][: self.config.max_prompts]
        prompts = [row.to_message(epoch=0) for row in rows]
        samples, scores = self._play(engine, name, version, prompts, started)
        scores = iter(score for per_prompt in scores for score in per_prompt)
        n, k = self.sampling.n, self.sampling.n
        directory = self.config.output_dir / name
        directory.mkdir(parents=True, exist_ok=True)
        pass1 = passk = 0.0
        by_source: dict[str, list[float]] = defaultdict(list)
        with open(directory / f"version-{version:06d}.jsonl", "w", encoding="utf-8") as out:
            for row, prompt, per_prompt in zip(rows, prompts, samples, strict=True):
                correct = 0
                for i, sample in enumerate(per_prompt):
                    score = next(scores)
                    correct += score.answer_ok
                    line = {"prompt_id": prompt.prompt_id, "sample": i, "text": sample.text,
                            "reward": score.reward, "answer_ok": score.answer_ok,
                            "finish_reason": sample.finish_reason, "data_source": row.data_source}
                    if i == 0:
                        # Once per question, for reading the answers beside it (`zerobubble view`).
                        line |= {"question": question_text(row.messages_json), "gt_answer": row.gt_answer}
                    if (record := sample.episode) is not None:
                        line["episode"] = {"transcript": record.transcript, "turns": record.turns,
                                           "tool_calls": record.tool_calls, "ended": record.ended_reason,
                                           **({"error": record.error} if record.error else {})}
                    out.write(json.dumps(line) + "\n")
                pass1 += pass_at_k(n, correct, 1)
                passk += pass_at_k(n, correct, k)
                if row.data_source is not None:
                    by_source[row.data_source].append(pass_at_k(n, correct, 1))
        summary = {"version": version, "dataset": name, "prompts": len(prompts), "n": n,
                   "pass@1": pass1 / len(prompts), f"pass@{k}": passk / len(prompts),
                   "seconds": round(time.monotonic() - started, 3)}
        if by_source:
            summary["pass@1_by_source"] = {source: sum(v) / len(v) for source, v in sorted(by_source.items())}
        with open(Path(self.config.output_dir) / "summary.jsonl", "a", encoding="utf-8") as out:
            out.write(json.dumps(summary) + "\n")
        self.metrics.eval_pass_at_1.labels(dataset=name).set(summary["pass@1"])
        self.metrics.eval_pass_at_k.labels(dataset=name).set(summary[f"pass@{k}"])
        log.info("eval %s at version %d: pass@1 %.3f pass@%d %.3f", name, version, summary["pass@1"], k,
                 summary[f"pass@{k}"])
        return summary
