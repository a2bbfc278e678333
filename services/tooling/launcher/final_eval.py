"""After a run: the held-out set on the last checkpoint, written beside the workers' periodic evals."""

from __future__ import annotations

import json
from pathlib import Path

from prometheus_client import CollectorRegistry

from zerobubble.buffer.config import BufferServiceConfig
from zerobubble.common.clients.reward import RewardClient
from zerobubble.common.config import ClientConfig, load_config
from zerobubble.common.data import DataSpec
from zerobubble.common.run_spec import RunSpec
from zerobubble.rollout.config import RolloutServiceConfig
from zerobubble.rollout.engine_factory import make_engine
from zerobubble.rollout.episodes.play import make_player
from zerobubble.rollout.evaluation import Evaluator
from zerobubble.rollout.metrics import RolloutMetrics
from zerobubble.trainer.checkpoints import STATE_FILE, latest_checkpoint


def evaluate_checkpoint(run_dir: Path, eval_data: Path, reward_service: ClientConfig | str,
                        checkpoint: Path | None = None) -> dict | None:
    """The held-out set on `checkpoint` (default: the run's latest); None when there is none, or when the worker's
    periodic evaluation already scored its version."""
    checkpoint = checkpoint or latest_checkpoint(run_dir / "trainer" / "checkpoints")
    if checkpoint is None:
        return None
    version = json.loads((checkpoint / STATE_FILE).read_text())["policy_version"]
    summary = run_dir / "eval" / "summary.jsonl"
    if summary.exists() and any(json.loads(line).get("version") == version
                                for line in summary.read_text().splitlines() if line.strip()):
        return None  # the worker's periodic evaluation already had these weights
    # Sample exactly as the first worker's periodic evaluation does, so the figures compare.
    rollout = load_config(RolloutServiceConfig, run_dir / "configs" / "rollout-0.yaml")
    spec = load_config(BufferServiceConfig, run_dir / "configs" / "buffer.yaml").run_spec
    with RewardClient(reward_service) as reward:
        return evaluate_weights(checkpoint, version, rollout, spec, eval_data, reward)


def evaluate_weights(model: Path, version: int, rollout: RolloutServiceConfig, spec: RunSpec, eval_data: Path,
                     reward: RewardClient, output_dir: Path | None = None) -> dict:
    """The held-out set on any HF model folder, sampled as `rollout`'s periodic evaluation samples (into
    `output_dir`, default the rollout's own eval folder)."""
    engine = make_engine("transformers", model, device="cpu", dtype="fp32", seed=rollout.generation.seed)
    player = make_player(engine.tokenizer, spec, system_prompt=rollout.reward.system_prompt,
                         environment=rollout.environment)
    # The first worker's spec of the held-out set carries its split and column mapping.
    heldout = rollout.eval.datasets.get("heldout", DataSpec(path=eval_data))
    eval_config = rollout.eval.model_copy(update={"datasets": {"heldout": heldout},
                                                  "output_dir": output_dir or rollout.eval.output_dir})
    evaluator = Evaluator(eval_config, player=player, reward=reward, metrics=RolloutMetrics(CollectorRegistry()),
                          max_new_tokens=spec.max_new_tokens, stop=tuple(rollout.generation.stop),
                          seed=rollout.generation.seed)
    try:
        return evaluator.run(engine, "heldout", version)
    finally:
        engine.close()
