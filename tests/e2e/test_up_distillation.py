"""`zerobubble up` with a teacher: the launcher makes the teacher (tiny_teacher) and starts the teacher service
beside the others, points the trainer at it with the run's token, steps train on its log-probs (DISTILL), and the
run's summary says what making the teacher took."""

from __future__ import annotations

import json
import math
from pathlib import Path

import yaml
from e2e_helpers import metrics_rows, run_up
from stack import tiny_assets

STEPS = 2


def test_up_starts_the_teacher_and_trains_with_distillation(tmp_path):
    student, train, held_out = tiny_assets(tmp_path / "assets", train_size=16, eval_size=4)
    run_dir = tmp_path / "run"
    # The teacher: another tiny model with the student's tokenizer, made by the run (a few supervised steps).
    sets = {"model": student, "train_data": train, "eval_data": held_out, "run_dir": run_dir,
            "tiny_model.warm_start_steps": 0, "run.algorithm": "DISTILL", "tiny_teacher.seed": 5,
            "tiny_teacher.warm_start_steps": 3,
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
    made = json.loads((Path(served["model"]["path"]) / "ready.json").read_text())
    assert made["steps"] == 3
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["teacher_preparation_seconds"] == made["seconds"] > 0


def test_up_starts_a_teacher_per_routed_data_source_and_the_trainer_scores_that_source_with_it(tmp_path):
    student, train, held_out = tiny_assets(tmp_path / "assets", train_size=16, eval_size=4)
    # Every row is of the routed source, whose teacher is the student itself: at step 1 (the student's own
    # weights) its log-ratios are all zero, where the run's teacher (another tiny model) gives them a gap.
    rows = [json.loads(line) for line in train.read_text().splitlines()]
    train.write_text("".join(json.dumps({**row, "data_source": "copy"}) + "\n" for row in rows))
    run_dir = tmp_path / "run"
    sets = {"model": student, "train_data": train, "eval_data": held_out, "run_dir": run_dir,
            "run.algorithm": "DISTILL", "tiny_teacher.seed": 5, "tiny_teacher.warm_start_steps": 3,
            "teachers_by_data_source.copy.model.path": student,
            "run.max_new_tokens": 8, "run.num_generations": 4, "trainer.max_steps": 1,
            "trainer.strategy.optim.warmup_steps": 0,
            "trainer.batch.groups_per_step": 4, "rollout.generation.prompts_per_batch": 4,
            "rollout.eval.samples_per_prompt": 2, "final_eval": False, "pipeline.torch_threads": 1}
    run_up([*(f"--set={k}={v}" for k, v in sets.items())], cwd=tmp_path)
    [row] = metrics_rows(run_dir)
    assert abs(row["teacher_reverse_kl"]) < 1e-4, "the routed source was scored by the run's teacher"
    trainer = yaml.safe_load((run_dir / "configs" / "trainer.yaml").read_text())
    routed = yaml.safe_load((run_dir / "configs" / "teacher-copy.yaml").read_text())
    assert Path(routed["model"]["path"]) == student
    assert set(trainer["teachers_by_data_source"]) == {"copy"}
    assert trainer["teachers_by_data_source"]["copy"]["address"] != trainer["teacher"]["address"]
    assert (run_dir / "logs" / "teacher-copy.log").exists() and (run_dir / "logs" / "teacher.log").exists()
