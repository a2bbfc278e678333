"""`zerobubble bench in-flight`: when rollout workers take new weights (run.weight_updates), each mode against
`between_batches` in the same run, on long, uneven generations.

The demo pipeline (every service its own process, as `zerobubble up` runs it) on the same prompts once per mode,
with a tiny model warm-started to write a filler of dots before its boxed answer (tiny_model.response_filler):
response lengths spread log-normally up to max_new_tokens, as real answers' are, so a batch's longest responses
keep the engine busy long after its shortest ended.

Figures per mode (as `zerobubble bench pipeline` defines them): samples_per_s, trainer_idle_fraction,
staleness_mean (per sample, from its oldest token), staleness_token_mean (token-weighted: what the loss sees),
stale_dropped (groups the buffer dropped past run.max_staleness), and held_out_pass@1 of the last checkpoint
(the demo's held-out set, scored after the measurement), with learning_per_minute: pass@1 gained over the
starting weights' per minute of training. Then each mode over between_batches: samples/s and learning per
minute as ratios, token-weighted staleness as a ratio (the goal: at most 0.5), and stale drops side by side.

Modes run one after another on this machine, so the machine's load moves between them: the load average at each
mode's start and end is in its figures. `between_turns` equals `between_batches` on single-turn prompts (there is
no turn inside a generation) and is measured as a control: its difference from between_batches is the noise.
"""

from __future__ import annotations

import tempfile
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from zerobubble.common.config import load_config
from zerobubble.tooling.bench.pipeline import first_prompts, run_mode
from zerobubble.tooling.configs import DEMO as DEMO_CONFIG
from zerobubble.tooling.launcher.assets import RunAssets, prepare_assets
from zerobubble.tooling.launcher.config import UpConfig

MODES = ("between_batches", "between_turns", "in_flight")
BASELINE = "between_batches"


def starting_pass_at_1(config: UpConfig, model: Path, held_out: Path, scratch: Path) -> float:
    """The held-out pass@1 of the starting weights, sampled as the runs' final evaluations sample (through a reward
    service of its own, started here)."""
    from zerobubble.reward.local import reward_client
    from zerobubble.rollout.config import RolloutServiceConfig
    from zerobubble.tooling.launcher.final_eval import evaluate_weights

    rollout = RolloutServiceConfig.model_validate({**config.rollout, "model": {"path": str(model)}})
    with reward_client() as client:
        return evaluate_weights(model, 0, rollout, config.run, held_out, client,
                                output_dir=scratch / "start-eval")["pass@1"]


def bench_in_flight(*, prompts: int = 64, epochs: int = 1, max_new_tokens: int = 256, filler: int | None = None,
                    max_staleness: int = 2, groups_per_step: int | None = None, prompts_per_batch: int | None = None,
                    warm_start_steps: int | None = None, eval_samples: int = 4,
                    modes: tuple[str, ...] = MODES, cache: Path = Path("runs/.assets"),
                    workdir: Path | None = None) -> dict[str, Any]:
    """Every mode in `modes` on the first `prompts` prompts of the demo's task; the figures as a JSON-able dict."""
    filler = max_new_tokens - 24 if filler is None else filler
    overrides: dict[str, Any] = {
        "final_eval": False, "run.max_new_tokens": max_new_tokens, "run.max_staleness": max_staleness,
        "buffer.prompts.epochs": epochs, "tiny_model.response_filler": filler,
        "rollout.eval.samples_per_prompt": eval_samples,
        **{f"{service}.server.grace_seconds": 1.0 for service in ("reward", "buffer", "trainer", "rollout")},
    }
    if warm_start_steps is not None:
        overrides["tiny_model.warm_start_steps"] = warm_start_steps
    if groups_per_step is not None:
        overrides["trainer.batch.groups_per_step"] = groups_per_step
    if prompts_per_batch is not None:
        overrides["rollout.generation.prompts_per_batch"] = prompts_per_batch
    figures: dict[str, Any] = {"benchmark": "in-flight", "prompts": prompts, "epochs": epochs,
                               "max_new_tokens": max_new_tokens, "response_filler": filler,
                               "max_staleness": max_staleness}
    if workdir is not None:
        workdir.mkdir(parents=True, exist_ok=True)
    runs = (tempfile.TemporaryDirectory(prefix="zerobubble-bench-in-flight-") if workdir is None
            else nullcontext(workdir))
    with runs as scratch:
        scratch = Path(scratch)
        base = load_config(UpConfig, DEMO_CONFIG, {**overrides, "run_dir": str(scratch / "unused")})
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
        for mode in modes:
            config = load_config(UpConfig, DEMO_CONFIG, {
                **overrides, "run_dir": str(scratch / mode), "run.weight_updates": mode,
                # The run has no eval set of its own, so the launcher leaves the evaluation's folder unset.
                "rollout.eval.output_dir": str(scratch / mode / "eval")})
            result = run_mode(config, assets, held_out=made.eval)
            minutes = result["training_seconds"] / 60
            result["learning_per_minute"] = round((result["held_out_pass@1"] - start) / minutes, 4)
            figures[mode] = result
    if BASELINE in figures:
        base_figures = figures[BASELINE]
        for mode in modes:
            if mode == BASELINE:
                continue
            mine = figures[mode]
            figures[f"{mode}_vs_{BASELINE}"] = {
                "samples_per_s": round(mine["samples_per_s"] / base_figures["samples_per_s"], 3),
                "staleness_token_mean": (round(mine["staleness_token_mean"] / base_figures["staleness_token_mean"], 3)
                                         if base_figures["staleness_token_mean"] else None),
                "learning_per_minute": (round(mine["learning_per_minute"] / base_figures["learning_per_minute"], 3)
                                        if base_figures["learning_per_minute"] > 0 else None),
                "stale_dropped": [mine["stale_dropped"], base_figures["stale_dropped"]],
            }
    return figures


def register_bench(benches) -> None:
    parser = benches.add_parser("in-flight", help="run.weight_updates modes against between_batches on long, "
                                "uneven generations: samples/s, idle, token-weighted staleness, stale drops, pass@1")
    parser.add_argument("--prompts", type=int, default=64, help="prompts of the task each mode trains on")
    parser.add_argument("--epochs", type=int, default=1, help="passes over those prompts")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="response limit")
    parser.add_argument("--filler", type=int, help="longest filler before the answer (default: max-new-tokens - 24)")
    parser.add_argument("--max-staleness", type=int, default=2, help="run.max_staleness of every mode")
    parser.add_argument("--groups-per-step", type=int, help="groups per training step (default: the demo's)")
    parser.add_argument("--prompts-per-batch", type=int, help="prompts a worker generates together (default: the "
                        "demo's)")
    parser.add_argument("--warm-start-steps", type=int, help="supervised steps of the tiny model (default: the demo's)")
    parser.add_argument("--eval-samples", type=int, default=4, help="samples per held-out prompt for pass@1")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated modes to run")
    parser.add_argument("--cache", type=Path, default=Path("runs/.assets"),
                        help="where the tiny model and task are kept between runs (as for `zerobubble up`)")
    parser.add_argument("--workdir", type=Path,
                        help="keep the runs' folders (logs, metrics) here (default: a temp dir, removed)")
    parser.set_defaults(measure=lambda args: bench_in_flight(
        prompts=args.prompts, epochs=args.epochs, max_new_tokens=args.max_new_tokens, filler=args.filler,
        max_staleness=args.max_staleness, groups_per_step=args.groups_per_step,
        prompts_per_batch=args.prompts_per_batch,
        warm_start_steps=args.warm_start_steps, eval_samples=args.eval_samples,
        modes=tuple(args.modes.split(",")), cache=args.cache, workdir=args.workdir))
