"""`zerobubble bench learning`: the demo (`zerobubble up` on the demo config: its warm-started tiny model, task,
chat template and reward) and TRL's GRPOTrainer on the same settings, for several seeds back to back, each
system's final weights scored by one evaluator.

Per run: held-out pass@1 after training, gained over the starting weights' (scored once: the evaluator samples
with a fixed seed), per training sample and per minute of the run's wall (the system's start to its trainer's
end: service start-up and TRL's imports count, the evaluation does not), and the machine's 1-minute load
average, sampled every 5 s during the run. Per system: mean and sample standard deviation over seeds.

One evaluator: the project's held-out evaluation (zerobubble.tooling.launcher.final_eval.evaluate_weights, the rollout
worker's Evaluator) with the demo's eval settings (n samples per prompt at the eval temperature, pass@1 from
them), through one reward service, on the zerobubble trainer's last checkpoint and on TRL's saved model.

What each side uses (values read from the demo config, so the bench follows it):

- model, prompts, chat template: the tiny model and task the demo makes (launcher.assets). TRL gets each prompt
  as the text the project's prompt builder renders (chat template, the verifier's system prompt), and its
  script stops if its tokenizer reads a prompt as other token ids than the builder made.
- reward: the reward service's verifier (the demo's: boxed); TRL scores through the project's TRL adapter
  (HTTP), zerobubble's workers through gRPC, against the same service.
- group and batch: num_generations = the demo's group size; TRL per_device_train_batch_size = groups_per_step x
  group size samples, gradient_accumulation_steps 1, steps_per_generation 1 (so generation_batch_size is the
  same number of samples), num_iterations 1: one optimizer update per generated batch, as the demo's trainer.
- steps: the demo's (its prompts x buffer epochs / groups_per_step) unless --steps; zerobubble's trainer.max_steps
  and TRL's max_steps.
- loss: the demo preset's, in TRL's names (TRL_LOSSES): GRPO's advantage (r - mean) / (std + 1e-4) per group
  with sequence-mean then sample-mean aggregation = TRL scale_rewards="group", loss_type="grpo" (both take the
  group's unbiased std); Dr.GRPO's r - mean with a sum over tokens / (samples x max_new_tokens) = scale_rewards
  "none", loss_type="dr_grpo". Clip 1 -/+ clip_low/clip_high = epsilon/epsilon_high; beta from the demo.
- optimizer: AdamW with the demo's lr, betas, eps, weight decay and gradient-norm clip, biases and norm weights
  not decayed on either side (TRL: the HF Trainer's rule).
- schedule: the demo's, in the HF Trainer's names (trl_schedule; TRL's default linear decay would not match):
  constant is "constant" ("constant_with_warmup" with a warm-up); one cosine decay to min_lr_ratio is
  "cosine_with_min_lr" with min_lr_rate, the same formula (transformers.optimization). HF's decay spans
  max_steps, so the bench sets the demo's total_steps to the measured steps too: both decay over the same run.
  A warm-up, which the demo has not, would lag one step on TRL's side (HF's first update is made at lr 0).
- sampling: top_p 1, no top_k, max_completion_length = the demo's max_new_tokens. The GRPO preset anneals the
  temperature from run_spec.sampling.temperature to annealed_temperature over the first epoch and holds it
  after; TRL's is fixed, so it gets the temperature the demo samples at after its first epoch.
- cannot match: the demo is asynchronous (samples up to max_staleness versions old, corrected by its
  off-policy rule) where TRL is strictly on-policy; TRL computes old log-probs only when they can differ from
  the current ones, the demo's trainer as it decides; TRL runs one process with the demo's torch_threads while
  the demo runs reward, buffer, trainer and rollout processes with torch_threads each; seeds draw different
  prompt orders and samples on each side (trainer.seed and buffer.prompts.seed for zerobubble, TRL's seed).

TRL runs as a subprocess in its own environment (`make trl-env`, deploy/trl/) with
zerobubble.tooling.bench.learning_trl:
trl's pins (datasets, pandas, accelerate) stay out of the project's. Without that environment the TRL side is
skipped, and the figures say why.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zerobubble.common.clients.reward import RewardClient
from zerobubble.common.config import TOKEN_ENV, load_config
from zerobubble.common.data import DataSpec, load_data
from zerobubble.reward.config import RewardServiceConfig
from zerobubble.rollout.config import RolloutServiceConfig
from zerobubble.tooling.bench import add_run_folders
from zerobubble.tooling.bench.learning_trl import TRLSettings
from zerobubble.tooling.bench.pipeline import training_figures
from zerobubble.tooling.configs import DEMO as DEMO_CONFIG
from zerobubble.tooling.launcher.assets import RunAssets, prepare_assets
from zerobubble.tooling.launcher.config import UpConfig, merge, validated
from zerobubble.tooling.launcher.run import SERVER, Run, build_run_spec, with_schedule_length
from zerobubble.tooling.launcher.tether import Tether
from zerobubble.tooling.ports import free_port
from zerobubble.trainer.config import TrainerServiceConfig
from zerobubble.trainer.optim import OptimConfig

SYSTEMS = ("zerobubble", "trl")
# The project's (advantage estimator, aggregation) -> TRL's (scale_rewards, loss_type) computing the same loss.
TRL_LOSSES = {("grpo", "sample_level"): ("group", "grpo"), ("dr_grpo", "constant"): ("none", "dr_grpo")}


def trl_schedule(optim: OptimConfig) -> dict[str, Any]:
    """The demo's learning-rate schedule as TRL's GRPOConfig takes it (see the module docstring)."""
    if optim.schedule == "cosine":
        return {"lr_scheduler_type": "cosine_with_min_lr", "lr_scheduler_kwargs": {"min_lr_rate": optim.min_lr_ratio},
                "warmup_steps": optim.warmup_steps}
    return {"lr_scheduler_type": "constant_with_warmup" if optim.warmup_steps else "constant",
            "lr_scheduler_kwargs": {}, "warmup_steps": optim.warmup_steps}


LOAD_INTERVAL_SECONDS = 5.0


class LoadWatch:
    """The 1-minute load average, sampled while a run goes on."""

    def __init__(self) -> None:
        self.samples = [os.getloadavg()[0]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(LOAD_INTERVAL_SECONDS):
            self.samples.append(os.getloadavg()[0])

    def __enter__(self) -> LoadWatch:
        self._thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(os.getloadavg()[0])

    def figures(self) -> dict[str, float]:
        return {"load_mean": round(statistics.fmean(self.samples), 2), "load_max": round(max(self.samples), 2)}


class Setup:
    """The demo's run (or another shipped run, `config_file`) as both systems see it: its config (with the bench's
    overrides), assets, service configs and run spec."""

    def __init__(self, overrides: dict[str, Any], cache: Path, scratch: Path, config_file: Path = DEMO_CONFIG):
        self.overrides = overrides
        self.scratch = scratch
        self.config_file = config_file
        self.config = load_config(UpConfig, config_file, {**overrides, "run_dir": str(scratch / "setup")})
        self.assets = prepare_assets(self.config, cache)
        if self.assets.eval is None:
            raise ValueError("the demo config names no held-out set: nothing to evaluate the systems on")
        self.spec = build_run_spec(self.config, self.assets.model)
        # The evaluator every system's weights go through: the first worker's, with the demo's eval settings.
        self.rollout = validated(RolloutServiceConfig, merge({
            "model": {"path": self.assets.model},
            "eval": {"datasets": {"heldout": Run(self.config).heldout_spec(self.assets.eval)}},
        }, self.config.rollout), "rollout section")
        self.rows = list(load_data(DataSpec(path=self.assets.train,
                                            **self.config.prompts_reading("split", "columns", "skip_bad_rows")),
                                   field="buffer.prompts", default_split="train"))
        epochs = self.config.buffer.get("prompts", {}).get("epochs", 1)
        # Read for its settings, never started: a run that starts a teacher gives the address only at launch.
        teacher = {"teacher": {"address": "127.0.0.1:1"}} if self.config.runs_teacher else {}
        trainer = merge({"model": self.assets.model, "run_dir": scratch / "setup" / "trainer",
                         "algorithm": {"preset": self.spec.algorithm}, **teacher}, self.config.trainer)
        self.trainer = validated(TrainerServiceConfig, with_schedule_length(trainer, lambda: len(self.rows), epochs),
                                 "trainer section")
        self.demo_steps = len(self.rows) * epochs // self.trainer.batch.groups_per_step

    @property
    def batch_samples(self) -> int:
        return self.trainer.batch.groups_per_step * self.spec.num_generations

    def trl_temperature(self) -> float:
        # What the demo samples at once its first epoch is done (the annealing's end, or its fixed temperature).
        return self.spec.sampling.temperature_at(epoch=1, progress=0.0)


def run_zerobubble(setup: Setup, seed: int, steps: int) -> dict[str, Any]:
    run_dir = setup.scratch / f"zerobubble-seed{seed}"
    config = load_config(UpConfig, setup.config_file, {
        **setup.overrides, "run_dir": str(run_dir), "trainer.seed": seed, "buffer.prompts.seed": seed,
        # TRL's cosine spans its max_steps: the demo's spans the same steps (a constant schedule reads neither).
        "trainer.max_steps": steps, "trainer.strategy.optim.total_steps": steps,
    })
    # No held-out set: no periodic evaluation takes the worker's engine during the measured run.
    assets = RunAssets(model=setup.assets.model, train=setup.assets.train, eval=None, teacher=setup.assets.teacher)
    run = Run(config, tether=Tether.hold(run_dir))
    with LoadWatch() as load:
        started = time.monotonic()
        try:
            trainer = run.launch(assets)
            run.watch(trainer, _NoProgress())
            wall = time.monotonic() - started
        finally:
            run.stop_all()
    from zerobubble.trainer.checkpoints import STATE_FILE, latest_checkpoint

    checkpoint = latest_checkpoint(run_dir / "trainer" / "checkpoints")
    if checkpoint is None:
        raise RuntimeError(f"{run_dir}: the trainer left no checkpoint")
    figures = training_figures(run_dir / "trainer" / "metrics.jsonl")
    return {
        "seed": seed, "wall_seconds": round(wall, 2), **load.figures(),
        "steps": figures["steps"], "samples_trained": figures["samples_trained"],
        "training_seconds": figures["training_seconds"], "staleness_mean": figures["staleness_mean"],
        "weights": checkpoint, "version": json.loads((checkpoint / STATE_FILE).read_text())["policy_version"],
    }


class _NoProgress:
    def refresh(self) -> None:
        pass


def rendered_prompts(setup: Setup) -> tuple[list[str], list[list[int]], str]:
    """The demo's prompts as the project's prompt builder renders them (text and ids), and their one verifier."""
    from transformers import AutoTokenizer

    from zerobubble.rollout.prompting import RoutedPrompts

    tokenizer = AutoTokenizer.from_pretrained(setup.assets.model)
    prompts = RoutedPrompts(tokenizer, setup.spec, setup.rollout.reward.system_prompt, setup.spec.max_prompt_tokens)
    messages = [row.to_message(epoch=0) for row in setup.rows]
    verifiers = {prompts.verifier(message) for message in messages}
    if len(verifiers) != 1:
        raise ValueError(f"the demo's prompts use the verifiers {sorted(verifiers)}; TRL's side takes one")
    ids = [prompts.build(message) for message in messages]
    return [tokenizer.decode(prompt_ids) for prompt_ids in ids], ids, verifiers.pop()


def trl_settings(setup: Setup, seed: int, steps: int, reward_url: str) -> TRLSettings:
    texts, ids, verifier = rendered_prompts(setup)
    optim, algorithm = setup.trainer.training_strategy().optim, setup.trainer.algorithm
    loss = (algorithm.advantage_estimator, algorithm.aggregation)
    if loss not in TRL_LOSSES:
        raise ValueError(f"trainer.algorithm: TRL has no loss matching advantage_estimator {loss[0]!r} with "
                         f"aggregation {loss[1]!r}; the bench takes {sorted(TRL_LOSSES)}")
    scale_rewards, loss_type = TRL_LOSSES[loss]
    return TRLSettings(
        model=setup.assets.model, output_dir=setup.scratch / f"trl-seed{seed}",
        prompts=texts, prompt_ids=ids,
        answers=[row.gt_answer for row in setup.rows], reward_url=reward_url, verifier=verifier,
        steps=steps, seed=seed, num_generations=setup.spec.num_generations, batch_samples=setup.batch_samples,
        learning_rate=optim.lr, **trl_schedule(optim), weight_decay=optim.weight_decay, adam_betas=optim.betas,
        adam_epsilon=optim.eps,
        max_grad_norm=optim.max_grad_norm, beta=algorithm.beta, epsilon_low=algorithm.clip_low,
        epsilon_high=algorithm.clip_high, scale_rewards=scale_rewards, loss_type=loss_type,
        temperature=setup.trl_temperature(),
        max_completion_length=setup.spec.max_new_tokens, torch_threads=setup.config.pipeline.torch_threads,
    )


@dataclass(frozen=True)
class TRLSide:
    """What TRL runs against the project's run: its settings from the setup, and the script that takes them (run
    as a module in the TRL environment)."""

    settings: Callable[[Setup, int, int, str], Any]
    module: str


TRL_GRPO = TRLSide(trl_settings, "zerobubble.tooling.bench.learning_trl")


def run_trl(setup: Setup, side: TRLSide, seed: int, steps: int, python: Path, reward_url: str) -> dict[str, Any]:
    settings = side.settings(setup, seed, steps, reward_url)
    settings.output_dir.mkdir(parents=True, exist_ok=True)
    path = settings.output_dir / "settings.json"
    path.write_text(settings.model_dump_json())
    log_path = settings.output_dir / "trl.log"
    with LoadWatch() as load, open(log_path, "w", encoding="utf-8") as log:
        started = time.monotonic()
        command = [str(python), "-m", side.module, str(path)]
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=log, text=True, check=False)
        wall = time.monotonic() - started
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"the TRL run exited {done.returncode}; see {log_path}")
    result = json.loads(lines[-1])
    return {"seed": seed, "wall_seconds": round(wall, 2), **load.figures(), "steps": result["steps"],
            "samples_trained": result["samples_trained"], "training_seconds": result["training_seconds"],
            "weights": Path(result["weights"]), "version": result["steps"]}


def spread(values: list[float]) -> dict[str, float | None]:
    return {"mean": statistics.fmean(values), "stdev": statistics.stdev(values) if len(values) > 1 else None}


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("pass@1_after", "gain", "gain_per_1k_samples", "gain_per_minute", "wall_seconds", "load_mean")
    return {key: {k: None if v is None else round(v, 5) for k, v in spread([run[key] for run in runs]).items()}
            for key in keys}


def bench_learning(*, seeds: list[int], steps: int | None = None, systems: tuple[str, ...] = SYSTEMS,
                   warm_start_steps: int | None = None, trl_venv: Path = Path(".venv-trl"),
                   cache: Path = Path("runs/.assets"), workdir: Path | None = None, config_file: Path = DEMO_CONFIG,
                   trl: TRLSide = TRL_GRPO, benchmark: str = "learning",
                   config_overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    from zerobubble.tooling.launcher.final_eval import evaluate_weights

    overrides: dict[str, Any] = {
        "final_eval": False,
        # Shutdown is not measured: a short grace keeps open weight-watch streams from holding each run up.
        **{f"{service}.server.grace_seconds": 1.0 for service in ("reward", "buffer", "trainer", "rollout")},
    }
    if warm_start_steps is not None:
        overrides["tiny_model.warm_start_steps"] = warm_start_steps
    overrides.update(config_overrides or {})
    figures: dict[str, Any] = {"benchmark": benchmark, "seeds": seeds, "systems": list(systems), "skipped": {}}
    python = trl_venv / "bin" / "python"
    if "trl" in systems and not python.exists():
        figures["skipped"]["trl"] = f"no TRL environment at {trl_venv} (make trl-env builds it, deploy/trl/)"
        systems = tuple(system for system in systems if system != "trl")
    os.environ.setdefault(TOKEN_ENV, secrets.token_urlsafe(32))
    if workdir is not None:
        workdir.mkdir(parents=True, exist_ok=True)
    scratch_dir = tempfile.TemporaryDirectory(prefix=f"zerobubble-bench-{benchmark}-") if workdir is None \
        else nullcontext(workdir)
    with scratch_dir as scratch_name:
        scratch = Path(scratch_name)
        setup = Setup(overrides, cache, scratch, config_file)
        steps = steps or setup.demo_steps
        figures.update({
            "model": str(setup.config.model or f"tiny-{setup.config.tiny_model.size}"),
            "warm_start_steps": setup.config.tiny_model.warm_start_steps, "train_prompts": len(setup.rows),
            "steps": steps, "num_generations": setup.spec.num_generations, "batch_samples": setup.batch_samples,
            "lr": setup.trainer.training_strategy().optim.lr, "max_new_tokens": setup.spec.max_new_tokens,
            "trl_temperature": setup.trl_temperature(),
            "evaluator": {"dataset": str(setup.assets.eval),
                          "samples_per_prompt": setup.rollout.eval.samples_per_prompt,
                          "temperature": setup.rollout.eval.temperature, "seed": setup.rollout.generation.seed},
        })
        # One reward service for the evaluations and TRL's rewards (the demo's own runs start theirs).
        holder = Run(setup.config.model_copy(update={"run_dir": scratch / "evaluator"}),
                     tether=Tether.hold(scratch / "evaluator"))
        http_port = free_port()
        try:
            reward = holder.start("reward", "reward", RewardServiceConfig, merge(
                {"server": SERVER, "math": {"workers": 1}, "http": {"listen": f"127.0.0.1:{http_port}"}},
                setup.config.reward))
            grpc_reward = holder.client_config(reward)

            def evaluate(weights: Path, version: int, name: str) -> dict[str, Any]:
                with RewardClient(grpc_reward) as client:
                    result = evaluate_weights(weights, version, setup.rollout, setup.spec, setup.assets.eval,
                                              client, output_dir=scratch / name / "eval")
                return {"pass@1": result["pass@1"], f"pass@{result['n']}": result[f"pass@{result['n']}"],
                        "evaluator": "zerobubble.tooling.launcher.final_eval.evaluate_weights", "output_dir":
                        str(scratch / name / "eval")}

            before = evaluate(setup.assets.model, 0, "start")
            figures["pass@1_before"] = round(before["pass@1"], 4)
            runs: dict[str, list[dict[str, Any]]] = {system: [] for system in systems}
            for seed in seeds:
                for system in systems:
                    if system == "zerobubble":
                        run = run_zerobubble(setup, seed, steps)
                    else:
                        run = run_trl(setup, trl, seed, steps, python, f"http://127.0.0.1:{http_port}")
                    after = evaluate(run.pop("weights"), run["version"], f"{system}-seed{seed}")
                    gain = after["pass@1"] - before["pass@1"]
                    runs[system].append({
                        **run, "pass@1_after": round(after["pass@1"], 4), "eval": after, "gain": round(gain, 4),
                        "gain_per_1k_samples": gain / run["samples_trained"] * 1000,
                        "gain_per_minute": gain / (run["wall_seconds"] / 60),
                    })
                    print(json.dumps({"system": system, **runs[system][-1]}), flush=True)
        finally:
            holder.stop_all()
    figures["runs"] = runs
    figures["summary"] = {system: summary(system_runs) for system, system_runs in runs.items()}
    if set(SYSTEMS) <= set(runs):
        zb, trl = figures["summary"]["zerobubble"], figures["summary"]["trl"]
        figures["zerobubble_vs_trl"] = {
            key: round(zb[key]["mean"] / trl[key]["mean"], 3) if trl[key]["mean"] else None
            for key in ("gain_per_1k_samples", "gain_per_minute")}
    return figures


def seed_list(text: str) -> list[int]:
    return [int(item) for item in text.split(",") if item.strip()]


def system_list(text: str) -> tuple[str, ...]:
    systems = tuple(item.strip() for item in text.split(",") if item.strip())
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown or not systems:
        raise argparse.ArgumentTypeError(f"unknown {unknown or 'empty list'}; known: {', '.join(SYSTEMS)}")
    return systems


def add_comparison_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of a bench that runs the project beside TRL over seeds."""
    parser.add_argument("--seeds", type=seed_list, default=[0, 1], help="comma-separated seeds, each run by "
                        "every system back to back (default 0,1)")
    parser.add_argument("--steps", type=int, help="training steps of every run (default: the shipped run's)")
    parser.add_argument("--systems", type=system_list, default=SYSTEMS,
                        help="comma-separated: zerobubble, trl (default both)")
    parser.add_argument("--warm-start-steps", type=int, help="supervised steps of the tiny model (default: the "
                        "shipped run's)")
    parser.add_argument("--trl-venv", type=Path, default=Path(".venv-trl"),
                        help="the TRL environment (make trl-env); without it the TRL side is skipped")
    add_run_folders(parser)


def comparison_options(args) -> dict[str, Any]:
    return {"seeds": args.seeds, "steps": args.steps, "systems": args.systems,
            "warm_start_steps": args.warm_start_steps, "trl_venv": args.trl_venv, "cache": args.cache,
            "workdir": args.workdir}


def register_bench(benches) -> None:
    parser = benches.add_parser("learning", help="the demo vs TRL's GRPOTrainer on the same settings: held-out "
                                "pass@1 gained per sample and per minute over seeds")
    add_comparison_arguments(parser)
    parser.set_defaults(measure=lambda args: bench_learning(**comparison_options(args)))
