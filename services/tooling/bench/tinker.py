"""`zerobubble bench tinker`: the tinker-cookbook's RL loop (tinker_cookbook.rl.train, run unchanged in
.venv-cookbook against the Tinker front) beside `zerobubble up`, on the demo's task from the demo's warm-started tiny
model: held-out pass@1 gained, and gained per minute of each run's wall.

The student is the demo's tiny model warm-started further than the demo's (WARM_START_STEPS, 800 against 600, the
same label smoothing): the demo's student reaches about 0.27 held-out pass@1 under either loop and stays there (both
measured: +17.9 points for the cookbook's loop, +16.9 for `up`), while this one starts near 0.2 with room above it.
`--warm-start-steps 600` runs the demo's.

The same on both sides: the starting weights (the warm start above, cached as `up` caches it), the train prompts
and the 50 held-out ones, the chat template, the reward (1 for the right \\boxed{} answer), the steps, and each
step's samples (the demo's groups_per_step groups of num_generations) of up to max_new_tokens; the held-out score
is pass@1 over the demo's samples per prompt at its eval temperature.

What differs, each side as a user runs it:

- zerobubble: `zerobubble up` on the demo config (bench learning's run: every service its own process,
  generation overlapping training, Dr.GRPO, the demo's full fine-tuning, lr and schedule), scored by the project's
  evaluator (final_eval.evaluate_weights) before and on its last checkpoint; its minutes run from the launch to
  the trainer's end.
- cookbook: the cookbook's synchronous loop (sample a batch, then one `importance_sampling` step on advantages
  centred per group) training a LoRA adapter at `--cookbook-lr`, the demo's task as a cookbook environment
  (zerobubble.tooling.tinker.cookbook.sums); scored by the cookbook's RLTestSetEvaluator through the front at the
  base weights and at the loop's final weights, outside the loop's time. Its minutes run from the front's start to
  the loop's end.
"""

from __future__ import annotations

import secrets
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from zerobubble.tooling.bench import add_run_folders
from zerobubble.tooling.bench.learning import LoadWatch, Setup, bench_learning

WARM_START_STEPS = 800
RENDERER = "qwen3_instruct"   # the tiny model's chat template (ChatML, no system turn), token for token
# The front shares the 2 cores with the loop's client: one torch thread, as `up` gives each of its processes.
FRONT = {"max_pending_per_session": 4096, "max_samples_per_request": 256, "poll_wait_s": 10.0, "torch_threads": 1}


def run_cookbook(setup: Setup, python: Path, steps: int, lr: float, lora_rank: int, seed: int,
                 scratch: Path) -> dict[str, Any]:
    from zerobubble.tooling.tinker.cookbook_runner import run_loop, running_front

    spec, groups = setup.spec, setup.trainer.batch.groups_per_step
    dataset = {"train_file": str(setup.assets.train), "test_file": str(setup.assets.eval),
               "model_name_for_tokenizer": str(Path(setup.assets.model).resolve()), "renderer_name": RENDERER,
               "groups_per_batch": groups, "group_size": spec.num_generations,
               "test_group_size": setup.rollout.eval.samples_per_prompt,
               "epochs": -(-steps * groups // len(setup.rows)), "seed": seed}
    evaluation = {"recipe_name": "zerobubble_bench_tinker", "max_tokens": spec.max_new_tokens}
    with LoadWatch() as load:
        started = time.monotonic()
        with running_front(setup.assets.model, scratch / "front", f"tml-{secrets.token_hex(16)}", seed=seed,
                           **FRONT) as front:
            front_seconds = time.monotonic() - started
            before = run_loop(python, front, "eval", evaluation, dataset, scratch / "eval-before")
            loop = run_loop(python, front, "rl", {
                "recipe_name": "zerobubble_bench_tinker", "renderer_name": RENDERER, "learning_rate": lr,
                "lora_rank": lora_rank, "max_tokens": spec.max_new_tokens, "save_every": 0, "eval_every": 0,
                "max_steps": steps}, dataset, scratch / "rl")
            after = run_loop(python, front, "eval", {**evaluation, "model_path": loop.final["sampler_path"]},
                             dataset, scratch / "eval-after")
    wall = front_seconds + loop.result["seconds"]
    pass_before, pass_after = (run.result["metrics"]["test/env/all/correct"] for run in (before, after))
    gain = pass_after - pass_before
    steps_run = [record for record in loop.metrics if "env/all/correct" in record]
    return {"seed": seed, "wall_seconds": round(wall, 2), **load.figures(), "steps": len(steps_run),
            "samples_trained": sum(record["env/all/total_episodes"] for record in steps_run),
            "lr": lr, "lora_rank": lora_rank, "train_module": loop.result["train_module"],
            "pass@1_before": round(pass_before, 4), "pass@1_after": round(pass_after, 4), "gain": round(gain, 4),
            "gain_per_minute": gain / (wall / 60),
            "evaluator": "tinker_cookbook.rl.metric_util.RLTestSetEvaluator through the front"}


def bench_tinker(*, steps: int | None, seed: int, cookbook_lr: float, lora_rank: int, cookbook_venv: Path,
                 cache: Path, workdir: Path | None, warm_start_steps: int = WARM_START_STEPS) -> dict[str, Any]:
    python = cookbook_venv / "bin" / "python"
    figures: dict[str, Any] = {"benchmark": "tinker", "seed": seed}
    zerobubble = bench_learning(seeds=[seed], steps=steps, systems=("zerobubble",), cache=cache,
                                warm_start_steps=warm_start_steps, workdir=workdir / "zerobubble" if workdir else None)
    run = zerobubble["runs"]["zerobubble"][0]
    steps = zerobubble["steps"]
    figures["task"] = {key: zerobubble[key] for key in ("model", "warm_start_steps", "train_prompts", "steps",
                                                        "num_generations", "batch_samples", "max_new_tokens",
                                                        "evaluator")}
    figures["zerobubble"] = {"pass@1_before": zerobubble["pass@1_before"], "pass@1_after": run["pass@1_after"],
                             "gain": run["gain"], "gain_per_minute": run["gain_per_minute"],
                             "wall_seconds": run["wall_seconds"], "samples_trained": run["samples_trained"],
                             "load_mean": run["load_mean"], "lr": zerobubble["lr"]}
    if not python.exists():
        figures["skipped"] = {"cookbook": f"no cookbook environment at {cookbook_venv} (make cookbook-env builds it, "
                                          "deploy/tinker-cookbook/)"}
        return figures
    scratch_dir = tempfile.TemporaryDirectory(prefix="zerobubble-bench-tinker-") if workdir is None \
        else nullcontext(workdir)
    with scratch_dir as scratch_name:
        scratch = Path(scratch_name)
        setup = Setup({"tiny_model.warm_start_steps": warm_start_steps}, cache, scratch / "setup")
        figures["cookbook"] = run_cookbook(setup, python.absolute(), steps, cookbook_lr, lora_rank, seed,
                                           scratch / "cookbook")
    cookbook = figures["cookbook"]["gain_per_minute"]
    figures["cookbook_vs_zerobubble_gain_per_minute"] = \
        round(cookbook / run["gain_per_minute"], 3) if run["gain_per_minute"] else None
    return figures


def register_bench(benches) -> None:
    parser = benches.add_parser("tinker", help="the tinker-cookbook's RL loop against the Tinker front vs "
                                "`zerobubble up`, on the demo: held-out pass@1 gained per minute")
    parser.add_argument("--steps", type=int, help="training steps of both runs (default: the demo's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cookbook-lr", type=float, default=1e-3, help="the cookbook loop's learning rate for its "
                        "LoRA adapter (default 1e-3)")
    parser.add_argument("--lora-rank", type=int, default=16, help="the cookbook loop's LoRA rank (default 16)")
    parser.add_argument("--warm-start-steps", type=int, default=WARM_START_STEPS, help="the student's warm start, "
                        f"both sides (default {WARM_START_STEPS}; the demo's is 600)")
    parser.add_argument("--cookbook-venv", type=Path, default=Path(".venv-cookbook"),
                        help="the cookbook's environment (make cookbook-env); without it that side is skipped")
    add_run_folders(parser)
    parser.set_defaults(measure=lambda args: bench_tinker(
        steps=args.steps, seed=args.seed, cookbook_lr=args.cookbook_lr, lora_rank=args.lora_rank,
        cookbook_venv=args.cookbook_venv, cache=args.cache, workdir=args.workdir,
        warm_start_steps=args.warm_start_steps))
