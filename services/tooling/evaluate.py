"""`zerobubble eval MODEL_OR_RUN --data FILE`: pass@1 and pass@k of a model folder, a checkpoint, or a run's newest
checkpoint on a data set, sampled and scored as the run's own evaluations are (launcher/final_eval.py)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from zerobubble.common.config import ConfigError, load_config


def evaluate(target: Path, data: Path, *, samples: int, max_prompts: int | None, reward_server: str | None,
             out: Path | None, settings: list[str]) -> dict:
    from zerobubble.buffer.config import BufferServiceConfig
    from zerobubble.common.data import DataSpec
    from zerobubble.common.run_spec import RunSpec
    from zerobubble.reward.local import reward_client
    from zerobubble.rollout.config import RolloutServiceConfig
    from zerobubble.tooling.launcher.final_eval import evaluate_weights
    from zerobubble.trainer.checkpoints import STATE_FILE, latest_checkpoint

    if not target.is_dir():
        raise ConfigError(f"MODEL_OR_RUN: no such folder {target}")
    run_configs = target / "configs"
    eval_tree = {"samples_per_prompt": samples, "max_prompts": max_prompts}
    if (run_configs / "rollout-0.yaml").exists():
        # A run folder: its newest checkpoint, sampled and scored with the run's own settings.
        if settings:
            raise ConfigError("--set: a run folder is evaluated with its own run settings")
        model = latest_checkpoint(target / "trainer" / "checkpoints")
        if model is None:
            raise ConfigError(f"MODEL_OR_RUN: the run in {target} has no complete checkpoint yet")
        rollout = load_config(RolloutServiceConfig, run_configs / "rollout-0.yaml",
                              {f"eval.{key}": value for key, value in eval_tree.items()})
        spec = load_config(BufferServiceConfig, run_configs / "buffer.yaml").run_spec
    else:
        model = target
        if not (model / "config.json").is_file():
            raise ConfigError(f"MODEL_OR_RUN: {target} is neither a Hugging Face model folder (config.json) nor a "
                              "run folder (configs/rollout-0.yaml)")
        rollout = load_config(RolloutServiceConfig, None, {"model": {"path": str(model)}, "eval": eval_tree})
        spec = load_config(RunSpec, None, [item.removeprefix("run.") for item in settings])
    state = model / STATE_FILE
    version = json.loads(state.read_text())["policy_version"] if state.exists() else 0
    # The reward service: the given one, else one started here for this evaluation.
    with tempfile.TemporaryDirectory() as scratch, reward_client(reward_server) as reward:
        heldout = {"heldout": DataSpec(path=data)}
        rollout = rollout.model_copy(update={"eval": rollout.eval.model_copy(update={"datasets": heldout})})
        return evaluate_weights(model, version, rollout, spec, data, reward.config.address,
                                output_dir=out or Path(scratch))


def cmd_eval(args) -> int:
    if not args.data.exists():
        raise ConfigError(f"--data: no such file or folder {args.data}")
    summary = evaluate(args.model_or_run, args.data, samples=args.samples, max_prompts=args.max_prompts,
                       reward_server=args.server, out=args.out, settings=args.set or [])
    print(json.dumps(summary), flush=True)
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser("eval", help="pass@1 and pass@k of a model, a checkpoint or a run on a data set")
    parser.add_argument("model_or_run", type=Path, metavar="MODEL_OR_RUN",
                        help="a Hugging Face model folder, a checkpoint, or a run folder (its newest checkpoint)")
    parser.add_argument("--data", type=Path, required=True, metavar="FILE", help="held-out rows, in any format "
                        "up reads (JSONL, JSON, parquet, a datasets folder)")
    parser.add_argument("--samples", type=int, default=4, help="samples per prompt: k of pass@k (default 4)")
    parser.add_argument("--max-prompts", type=int, default=None, help="only the first N prompts")
    parser.add_argument("--out", type=Path, help="folder for the per-sample JSONL and summary.jsonl (default: none)")
    parser.add_argument("--server", help="HOST:PORT of a running reward service (default: start one here)")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", help="a run setting for a model folder "
                        "(run.verifier=code, run.max_new_tokens=512); a run folder's are its own")
    parser.set_defaults(run=cmd_eval)
