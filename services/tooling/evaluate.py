"""`zerobubble eval MODEL_OR_CHECKPOINT --data FILE`: pass@1 and pass@k of any Hugging Face model folder (a
checkpoint, an export, a base model) on a data set, scored by the reward service's verifiers: a run's own
(`--run RUN_DIR`: its verifier routing, system prompt, limits and evaluation settings) or those given here."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from zerobubble.common.config import ConfigError, load_config


def _run_settings(args):
    from zerobubble.buffer.config import BufferServiceConfig
    from zerobubble.common.run_spec import RunSpec
    from zerobubble.rollout.config import RolloutServiceConfig

    if args.run_dir is not None:
        configs = args.run_dir / "configs"
        if not (configs / "buffer.yaml").is_file():
            raise ConfigError(f"--run: {args.run_dir} holds no run (no {configs / 'buffer.yaml'})")
        spec = load_config(BufferServiceConfig, configs / "buffer.yaml").run_spec
        rollout = load_config(RolloutServiceConfig, configs / "rollout-0.yaml")
    else:
        spec = load_config(RunSpec, None, {"verifier": args.verifier, "max_new_tokens": args.max_new_tokens})
        rollout = load_config(RolloutServiceConfig, None, {"model": {"path": str(args.model)}})
    updates = {"datasets": {}, "samples_per_prompt": args.samples or rollout.eval.samples_per_prompt}
    if args.max_prompts is not None:
        updates["max_prompts"] = args.max_prompts
    return spec, rollout.model_copy(update={"eval": rollout.eval.model_copy(update=updates)})


def cmd_eval(args) -> int:
    from zerobubble.tooling.launcher.final_eval import evaluate_weights
    from zerobubble.tooling.launcher.preflight import check_model

    try:
        check_model(args.model)
        if not args.data.is_file():
            raise ConfigError(f"--data: {args.data}: no such file")
        spec, rollout = _run_settings(args)
    except ConfigError as exc:
        print(f"zerobubble eval: {exc}", file=sys.stderr)
        return 2
    from zerobubble.reward.local import reward_client

    out = args.out or Path("eval") / args.model.name
    with reward_client(args.server) as reward:
        summary = evaluate_weights(args.model, args.version, rollout, spec, args.data, reward, output_dir=out)
    print(json.dumps({**summary, "samples": str(out / "heldout" / f"version-{args.version:06d}.jsonl")}))
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser("eval", help="pass@1 and pass@k of a model folder on a data set")
    parser.add_argument("model", type=Path, metavar="MODEL_OR_CHECKPOINT", help="a Hugging Face model folder")
    parser.add_argument("--data", type=Path, required=True, metavar="FILE", help="JSONL rows as training takes them")
    parser.add_argument("--run", dest="run_dir", type=Path, metavar="RUN_DIR",
                        help="use this run's verifiers, prompts and limits")
    parser.add_argument("--verifier", default="boxed", help="without --run: the verifier of every row [boxed]")
    parser.add_argument("--max-new-tokens", type=int, default=512, help="without --run: the response limit [512]")
    parser.add_argument("--samples", type=int, help="samples a prompt (k of pass@k) [the run's, else 4]")
    parser.add_argument("--max-prompts", type=int, help="only the first N rows")
    parser.add_argument("--version", type=int, default=0, help="the version to file the results under [0]")
    parser.add_argument("--server", metavar="HOST:PORT", help="a reward service (default: one started here)")
    parser.add_argument("--out", type=Path, help="where the per-sample results go [eval/MODEL_NAME]")
    parser.set_defaults(run=cmd_eval)
