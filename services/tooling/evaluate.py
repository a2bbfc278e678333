"""`zerobubble eval MODEL_OR_CHECKPOINT --data FILE`: pass@1 and pass@k of any Hugging Face model folder (a
checkpoint, an export, a base model) on a data set, scored by the reward service's verifiers: a run's own
(`--run RUN_DIR`: its verifier routing, system prompt, limits and evaluation settings) or those given here.

A run with episodes plays them as the run did: its environment service is started here from the run's config (the
run's own is gone with it), under a token of this process's when $ZEROBUBBLE_AUTH_TOKEN is not set. The first
samples' transcripts are printed before the summary line."""

from __future__ import annotations

import json
import os
import secrets
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from zerobubble.common.config import TOKEN_ENV, ClientConfig, ConfigError, load_config


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


@contextmanager
def run_environments(run_dir: Path | None, spec) -> Iterator[ClientConfig | None]:
    """The run's environment service, started here from its config on a loopback port, when the run has episodes
    (None otherwise). It asks for the run's token ($ZEROBUBBLE_AUTH_TOKEN), made up here when it is not set."""
    if run_dir is None or not spec.episodes.enabled:
        yield None
        return
    from zerobubble.environment.app import build
    from zerobubble.environment.config import EnvironmentServiceConfig

    path = run_dir / "configs" / "environment.yaml"
    if not path.is_file():
        raise ConfigError(f"--run: the run plays episodes in {', '.join(spec.episodes.environments())} but "
                          f"{path} is missing")
    if not os.environ.get(TOKEN_ENV):
        os.environ[TOKEN_ENV] = secrets.token_urlsafe(32)
    config = load_config(EnvironmentServiceConfig, path, {"server.listen": "127.0.0.1:0",
                                                          "server.metrics_port": None,
                                                          "server.auth_token_env": TOKEN_ENV})
    host = build(config).start()
    try:
        yield ClientConfig(address=host.address, auth_token_env=TOKEN_ENV, retry_seconds=10)
    finally:
        host.stop(grace=1.0)


def print_transcripts(samples: Path, count: int) -> None:
    """The first `count` samples of an evaluation with episodes, as the model saw them: every turn and every
    observation (a tool's result) between them."""
    if count <= 0 or not samples.is_file():
        return
    with open(samples, encoding="utf-8") as rows:
        shown = 0
        for line in rows:
            row = json.loads(line)
            episode = row.get("episode")
            if episode is None:
                continue
            error = f": {episode['error']}" if episode.get("error") else ""
            print(f"--- {row.get('prompt_id')} sample {row.get('sample')}: reward {row.get('reward')}, "
                  f"answer_ok {row.get('answer_ok')}, {episode.get('turns')} turns, "
                  f"{episode.get('tool_calls')} tool calls, ended {episode.get('ended')}{error}")
            print(episode.get("transcript", ""))
            shown += 1
            if shown >= count:
                break


def cmd_eval(args) -> int:
    from zerobubble.common.local_paths import check_model
    from zerobubble.tooling.launcher.final_eval import evaluate_weights

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
    samples = out / "heldout" / f"version-{args.version:06d}.jsonl"
    try:
        with run_environments(args.run_dir, spec) as environment, reward_client(args.server) as reward:
            if environment is not None:
                rollout = rollout.model_copy(update={"environment": environment})
            summary = evaluate_weights(args.model, args.version, rollout, spec, args.data, reward, output_dir=out)
    except ConfigError as exc:
        print(f"zerobubble eval: {exc}", file=sys.stderr)
        return 2
    print_transcripts(samples, args.transcripts)
    print(json.dumps({**summary, "samples": str(samples)}))
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
    parser.add_argument("--transcripts", type=int, default=2, metavar="N",
                        help="print the first N samples' episode transcripts (runs with episodes) [2]")
    parser.set_defaults(run=cmd_eval)
