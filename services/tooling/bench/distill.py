"""`zerobubble bench distill`: the distillation demo (`zerobubble up --config distill-demo`: its student, a
teacher made here, Dr.GRPO with the distillation term) beside TRL's DistillationTrainer on the same student, teacher
and prompts, for several seeds back to back, each system's final weights scored by one evaluator. The machinery,
figures and evaluator are `zerobubble bench learning`'s (bench/learning.py); what differs is TRL's side:

- TRL distils alone, fully on-policy: the student samples one completion per prompt, and its loss at each position
  is the generalised JSD to the teacher's whole next-token distribution, at beta 1 the reverse KL (Agarwal et al.
  2024, GKD); no reward. The project's run learns from the teacher's log-prob of each sampled token and the
  verifier's reward (the demo's settings).
- batch: TRL per_device_train_batch_size = the demo's samples a step (groups x group size), one update each.
- optimizer, schedule, temperature, max_completion_length: the demo's, as `bench learning` sets them.
- cannot match: TRL reads the teacher's whole distribution at every position (a forward of the teacher in its own
  process), the project one log-prob per sampled token from the teacher service; TRL runs one process.
"""

from __future__ import annotations

from typing import Any

from zerobubble.tooling.bench.distill_trl import DistillSettings
from zerobubble.tooling.bench.learning import (
    Setup,
    TRLSide,
    add_comparison_arguments,
    bench_learning,
    comparison_options,
    rendered_prompts,
    trl_schedule,
)
from zerobubble.tooling.configs import DIRECTORY

DISTILL_DEMO = DIRECTORY / "distill-demo.yaml"


def distill_settings(setup: Setup, seed: int, steps: int, _reward_url: str) -> DistillSettings:
    if setup.assets.teacher is None:
        raise ValueError(f"{setup.config_file} makes no teacher (tiny_teacher): nothing to distil from")
    texts, ids, _ = rendered_prompts(setup)
    optim = setup.trainer.training_strategy().optim
    return DistillSettings(
        model=setup.assets.model, teacher=setup.assets.teacher, output_dir=setup.scratch / f"trl-seed{seed}",
        prompts=texts, prompt_ids=ids, steps=steps, seed=seed, batch_samples=setup.batch_samples,
        learning_rate=optim.lr, **trl_schedule(optim), weight_decay=optim.weight_decay, adam_betas=optim.betas,
        adam_epsilon=optim.eps, max_grad_norm=optim.max_grad_norm, beta=1.0, temperature=setup.trl_temperature(),
        max_completion_length=setup.spec.max_new_tokens, torch_threads=setup.config.pipeline.torch_threads,
    )


TRL_DISTILLATION = TRLSide(distill_settings, "zerobubble.tooling.bench.distill_trl")


def bench_distill(*, teacher_warm_start_steps: int | None = None, **options: Any) -> dict[str, Any]:
    overrides = {} if teacher_warm_start_steps is None else {"tiny_teacher.warm_start_steps": teacher_warm_start_steps}
    return bench_learning(**options, config_file=DISTILL_DEMO, trl=TRL_DISTILLATION, benchmark="distill",
                          config_overrides=overrides)


def register_bench(benches) -> None:
    parser = benches.add_parser("distill", help="the distillation demo vs TRL's DistillationTrainer on the same "
                                "student, teacher and prompts: held-out pass@1 gained per sample and per minute")
    add_comparison_arguments(parser)
    parser.add_argument("--teacher-warm-start-steps", type=int, help="supervised steps of the teacher made here "
                        "(default: the distill demo's)")
    parser.set_defaults(measure=lambda args: bench_distill(
        teacher_warm_start_steps=args.teacher_warm_start_steps, **comparison_options(args)))
