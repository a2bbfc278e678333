"""`zerobubble up` with a teacher: the launcher starts the teacher service beside the others, points the trainer at
it with the run's token, and steps train on its log-probs (DISTILL)."""

from __future__ import annotations

import math

import yaml
from e2e_helpers import metrics_rows, run_up
from stack import tiny_assets

from zerobubble.tooling.tiny.model import make_tiny_model

STEPS = 2


def test_up_starts_the_teacher_and_trains_with_distillation(tmp_path):
    student, train, held_out = tiny_assets(tmp_path / "assets", train_size=16, eval_size=4)
    # Another tiny model with the student's tokenizer: the teacher.
    teacher = make_tiny_model(tmp_path / "teacher", size="1m", seed=5)
    run_dir = tmp_path / "run"
    sets = {"model": student, "train_data": train, "eval_data": held_out, "run_dir": run_dir,
            "tiny_model.warm_start_steps": 0, "run.algorithm": "DISTILL", "teacher.model.path": teacher,
            "run.max_new_tokens": 8, "run.num_generations": 4, "trainer.max_steps": STEPS,
            "trainer.batch.groups_per_step": 4, "trainer.strategy.optim.warmup_steps": 1,
            "rollout.generation.prompts_per_batch": 4,
            "rollout.eval.samples_per_prompt": 2, "final_eval": False, "pipeline.torch_threads": 1}
    run_up([*(f"--set={k}={v}" for k, v in sets.items())], cwd=tmp_path)
    rows = metrics_rows(run_dir)
    assert [row["step"] for row in rows] == list(range(1, STEPS + 1))
    assert all(math.isfinite(row["teacher_reverse_kl"]) and row["teacher_reverse_kl"] != 0 for row in rows)
    trainer = yaml.safe_load((run_dir / "configs" / "trainer.yaml").read_text())
    served = yaml.safe_load((run_dir / "configs" / "teacher.yaml").read_text())
    assert trainer["algorithm"]["preset"] == "DISTILL"
    assert trainer["teacher"]["auth_token_env"] == served["server"]["auth_token_env"], "the run's token both ways"
    assert (run_dir / "logs" / "teacher.log").exists()
