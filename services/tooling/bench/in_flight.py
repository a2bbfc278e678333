"""`zerobubble bench in-flight`: when rollout workers take new weights (run.weight_updates), each mode against
`between_batches` in the same run, on long, uneven generations.

The demo pipeline (every service its own process, as `zerobubble up` runs it) on the same prompts once per mode,
with a tiny model warm-started to write a filler of dots before its boxed answer (tiny_model.response_filler):
response lengths spread log-normally up to max_new_tokens, as real answers' are, so a batch's longest responses
keep the engine busy long after its shortest ended.

Every mode trains for the same wall time (--train-seconds from its first update; the trainer then saves a
checkpoint at the end of the step under way, and that checkpoint is scored), not the same steps: learning per
minute is what the default of run.weight_updates is chosen by.

Figures per mode (as `zerobubble bench pipeline` defines them): samples_per_s, trainer_idle_fraction,
staleness_mean (per sample, from its oldest token), staleness_token_mean (token-weighted: what the loss sees),
stale_dropped (groups the buffer dropped past run.max_staleness), and held_out_pass@1 of the checkpoint (the
demo's held-out set, scored after the measurement), with learning_per_minute: pass@1 gained over the starting
weights' per minute of training. With --repeats, each figure is the mean over repeats with its spread (lowest,
highest) beside it, and every run's own figures are under "runs". Then each mode over between_batches:
samples/s and learning per minute as ratios, token-weighted staleness as a ratio (the goal: at most 0.5), stale
drops side by side, and the pass@1 difference repeat by repeat.

Modes run one after another on this machine, so the machine's load moves between them: the load average at each
mode's start and end is in its figures, and repeats alternate the order. `between_turns` equals
`between_batches` on single-turn prompts (there is no turn inside a generation) and is measured as a control:
its difference from between_batches is the noise.

With --episodes the task is the tool demo's (`zerobubble up --config tool-demo`: sums of two-digit numbers, each
prompt an episode in the calculator environment, its own warm start, limits and settings) instead of the filler's:
every mode then plays multi-turn episodes, the environment service one more process of the run, and
`between_turns` takes weights before each later turn.
"""

from __future__ import annotations

import argparse
import tempfile
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from zerobubble.common.config import load_config
from zerobubble.tooling.bench import add_run_folders
from zerobubble.tooling.bench.pipeline import first_prompts, run_mode
from zerobubble.tooling.configs import DEMO as DEMO_CONFIG
from zerobubble.tooling.configs import named
from zerobubble.tooling.launcher.assets import RunAssets, prepare_assets
from zerobubble.tooling.launcher.config import UpConfig, write_yaml

MODES = ("between_batches", "between_turns", "in_flight")
BASELINE = "between_batches"
# A model that writes the filler and then is right a little of the time, with room to learn in minutes
# (measured: docs/guides/in-flight-updates.md, "Measured"). Without label smoothing: the demo's 0.1 leaves about a
# tenth of the probability off the dot at every step, so at temperature 1 nearly every long filler breaks.
WARM_START_STEPS = 400
# The episodes' task: the tool demo as shipped.
EPISODES_CONFIG = named(Path("tool-demo"))


def starting_pass_at_1(config: UpConfig, model: Path, held_out: Path, scratch: Path) -> float:
    """The held-out pass@1 of the starting weights, sampled as the runs' final evaluations sample (through a reward
    service of its own, started here, and for episodes the run's environments, served here as `zerobubble eval`
    serves them)."""
    from zerobubble.reward.local import reward_client
    from zerobubble.rollout.config import RolloutServiceConfig
    from zerobubble.tooling.evaluate import run_environments
    from zerobubble.tooling.launcher.final_eval import evaluate_weights

    rollout = RolloutServiceConfig.model_validate({**config.rollout, "model": {"path": str(model)}})
    if config.run.episodes.enabled:
        write_yaml(scratch / "start" / "configs" / "environment.yaml", config.environment)
    with run_environments(scratch / "start", config.run) as environment, reward_client() as client:
        if environment is not None:
            rollout = rollout.model_copy(update={"environment": environment})
        return evaluate_weights(model, 0, rollout, config.run, held_out, client,
                                output_dir=scratch / "start-eval")["pass@1"]


# The figures averaged over repeats, with their spread (lowest, highest) beside them.
SUMMARISED = ("samples_per_s", "trainer_idle_fraction", "staleness_mean", "staleness_token_mean", "stale_dropped",
              "held_out_pass@1", "learning_per_minute", "training_seconds", "steps")


def mean(runs: list[dict[str, Any]], key: str) -> float:
    return sum(run[key] for run in runs) / len(runs)


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One mode's figures over its repeats: the mean of each SUMMARISED figure, and its spread when repeated."""
    out: dict[str, Any] = {"weight_updates": runs[0]["weight_updates"], "max_staleness": runs[0]["max_staleness"],
                           "repeats": len(runs)}
    for key in SUMMARISED:
        out[key] = round(mean(runs, key), 4)
        if len(runs) > 1:
            out[f"{key}_spread"] = [min(run[key] for run in runs), max(run[key] for run in runs)]
    return out


def versus(mine: list[dict[str, Any]], base: list[dict[str, Any]]) -> dict[str, Any]:
    """A mode beside between_batches: ratios of the means (token-weighted staleness: the goal is at most 0.5),
    stale drops side by side, and the held-out pass@1 difference repeat by repeat (paired: each repeat's modes
    share a seed and the machine's moment) to read against the spread."""
    def ratio(key: str) -> float | None:
        theirs = mean(base, key)
        return round(mean(mine, key) / theirs, 3) if theirs > 0 else None

    return {
        "samples_per_s": ratio("samples_per_s"),
        "staleness_token_mean": ratio("staleness_token_mean"),
        "learning_per_minute": ratio("learning_per_minute"),
        "stale_dropped": [mean(mine, "stale_dropped"), mean(base, "stale_dropped")],
        "held_out_pass@1_difference": [round(m["held_out_pass@1"] - b["held_out_pass@1"], 4)
                                       for m, b in zip(mine, base, strict=True)],
    }


def bench_in_flight(*, prompts: int = 64, epochs: int = 20, train_seconds: float = 240.0, max_new_tokens: int = 256,
                    filler: int | None = None, max_staleness: int = 2, workers: int = 1,
                    groups_per_step: int | None = None, prompts_per_batch: int | None = None,
                    warm_start_steps: int | None = None, label_smoothing: float = 0.0, eval_samples: int = 4,
                    repeats: int = 1, engine: str = "transformers", episodes: bool = False,
                    modes: tuple[str, ...] = MODES, cache: Path = Path("runs/.assets"),
                    workdir: Path | None = None) -> dict[str, Any]:
    """Every mode in `modes` on the first `prompts` prompts of the demo's task, each trained for `train_seconds`
    (or to the end of `epochs` passes, if sooner), `repeats` times: repeat r seeds the trainer and the prompts'
    order with r and runs the modes in reverse order when r is odd, so that neither a seed nor the machine's
    drift favours one mode. With `episodes`, the tool demo's task, response limits and warm start (unless
    `warm_start_steps` is given) instead of the filler's. The figures as a JSON-able dict."""
    config_file = EPISODES_CONFIG if episodes else DEMO_CONFIG
    filler = max_new_tokens - 24 if filler is None else filler
    task: dict[str, Any] = {} if episodes else {
        "run.max_new_tokens": max_new_tokens, "tiny_model.response_filler": filler,
        "tiny_model.warm_start_steps": WARM_START_STEPS, "tiny_model.warm_start_label_smoothing": label_smoothing}
    if warm_start_steps is not None:
        task["tiny_model.warm_start_steps"] = warm_start_steps
    overrides: dict[str, Any] = {
        "final_eval": False, "run.max_staleness": max_staleness, "buffer.prompts.epochs": epochs, **task,
        "pipeline.rollout_workers": workers, "rollout.eval.samples_per_prompt": eval_samples,
        "rollout.model.engine": engine,
        # The same rate whatever steps a mode reaches in its time: a decay derived from the data's length would
        # differ from mode to mode only by how far each got.
        "trainer.strategy.optim.schedule": "constant",
        **{f"{service}.server.grace_seconds": 1.0 for service in ("reward", "buffer", "trainer", "rollout")},
    }
    if groups_per_step is not None:
        overrides["trainer.batch.groups_per_step"] = groups_per_step
    if prompts_per_batch is not None:
        overrides["rollout.generation.prompts_per_batch"] = prompts_per_batch
    figures: dict[str, Any] = {"benchmark": "in-flight", "task": "tool-demo episodes" if episodes else "filler",
                               "prompts": prompts, "epochs": epochs, "train_seconds": train_seconds,
                               "max_staleness": max_staleness, "rollout_workers": workers, "engine": engine}
    if workdir is not None:
        workdir.mkdir(parents=True, exist_ok=True)
    runs = (tempfile.TemporaryDirectory(prefix="zerobubble-bench-in-flight-") if workdir is None
            else nullcontext(workdir))
    results: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    with runs as scratch:
        scratch = Path(scratch)
        base = load_config(UpConfig, config_file, {**overrides, "run_dir": str(scratch / "unused")})
        figures["max_new_tokens"] = base.run.max_new_tokens
        figures["response_filler"] = base.tiny_model.response_filler
        made = prepare_assets(base, cache)
        # No periodic evaluation takes the workers' engines during the measurement; the held-out set is scored
        # after each run.
        assets = RunAssets(model=made.model, train=first_prompts(made.train, prompts, scratch / "prompts.jsonl"),
                           eval=None)
        figures["model"] = f"tiny-{base.tiny_model.size}"
        figures["warm_start_steps"] = base.tiny_model.warm_start_steps
        figures["groups_per_step"] = base.trainer.get("batch", {}).get("groups_per_step")
        start = starting_pass_at_1(base, made.model, made.eval, scratch)
        figures["held_out_pass@1_at_start"] = round(start, 4)
        figures["orders"] = []
        for repeat in range(repeats):
            order = modes if repeat % 2 == 0 else tuple(reversed(modes))
            figures["orders"].append(list(order))
            for mode in order:
                run_dir = scratch / f"{mode}-{repeat}"
                config = load_config(UpConfig, config_file, {
                    **overrides, "run_dir": str(run_dir), "run.weight_updates": mode,
                    "trainer.seed": repeat, "buffer.prompts.seed": repeat,
                    # The run has no eval set of its own, so the launcher leaves the evaluation's folder unset.
                    "rollout.eval.output_dir": str(run_dir / "eval")})
                result = run_mode(config, assets, held_out=made.eval, train_seconds=train_seconds)
                minutes = result["training_seconds"] / 60
                result["learning_per_minute"] = round((result["held_out_pass@1"] - start) / minutes, 4)
                results[mode].append({"repeat": repeat, **result})
    figures["runs"] = results
    for mode in modes:
        figures[mode] = summary(results[mode])
    if BASELINE in results:
        for mode in modes:
            if mode != BASELINE:
                figures[f"{mode}_vs_{BASELINE}"] = versus(results[mode], results[BASELINE])
    return figures


def positive(kind):
    def parse(text: str):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text}: must be above 0")
        return value
    return parse


def mode_list(text: str) -> tuple[str, ...]:
    modes = tuple(text.split(","))
    if unknown := [mode for mode in modes if mode not in MODES]:
        raise argparse.ArgumentTypeError(f"unknown {', '.join(unknown)}; known: {', '.join(MODES)}")
    return modes


def register_bench(benches) -> None:
    parser = benches.add_parser("in-flight", help="run.weight_updates modes against between_batches on long, "
                                "uneven generations: samples/s, idle, token-weighted staleness, stale drops, pass@1")
    parser.add_argument("--prompts", type=int, default=64, help="prompts of the task each mode trains on")
    parser.add_argument("--epochs", type=int, default=20, help="passes over those prompts at most")
    parser.add_argument("--train-seconds", type=positive(float), default=240.0,
                        help="seconds each mode trains (from its first update) before its checkpoint is scored")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="response limit")
    parser.add_argument("--filler", type=int, help="longest filler before the answer (default: max-new-tokens - 24)")
    parser.add_argument("--max-staleness", type=int, default=2, help="run.max_staleness of every mode")
    parser.add_argument("--workers", type=positive(int), default=1, help="rollout workers")
    parser.add_argument("--groups-per-step", type=int, help="groups per training step (default: the demo's)")
    parser.add_argument("--prompts-per-batch", type=int, help="prompts a worker generates together (default: the "
                        "demo's)")
    parser.add_argument("--warm-start-steps", type=int, help="supervised steps of the tiny model (default: "
                        f"{WARM_START_STEPS}; with --episodes, the tool demo's)")
    parser.add_argument("--label-smoothing", type=float, default=0.0, help="label smoothing of its warm start")
    parser.add_argument("--eval-samples", type=int, default=4, help="samples per held-out prompt for pass@1")
    parser.add_argument("--repeats", type=positive(int), default=1,
                        help="runs of every mode, each with its own seed, the order reversed every other one")
    parser.add_argument("--engine", choices=("transformers", "vllm"), default="transformers",
                        help="the workers' engine (vllm: run the bench from the vLLM environment, .venv-vllm)")
    parser.add_argument("--modes", type=mode_list, default=MODES, help="comma-separated modes to run")
    parser.add_argument("--episodes", action="store_true", help="the tool demo's multi-turn episodes in the "
                        "calculator environment instead of the filler's single turns")
    add_run_folders(parser)
    parser.set_defaults(measure=lambda args: bench_in_flight(
        prompts=args.prompts, epochs=args.epochs, train_seconds=args.train_seconds,
        max_new_tokens=args.max_new_tokens, filler=args.filler, max_staleness=args.max_staleness,
        workers=args.workers, groups_per_step=args.groups_per_step, prompts_per_batch=args.prompts_per_batch,
        warm_start_steps=args.warm_start_steps, label_smoothing=args.label_smoothing, eval_samples=args.eval_samples,
        repeats=args.repeats, engine=args.engine, episodes=args.episodes,
        modes=args.modes, cache=args.cache, workdir=args.workdir))
