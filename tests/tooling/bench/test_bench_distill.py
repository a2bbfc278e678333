"""`zerobubble bench distill` scaled down: the distill demo's run (its student, a teacher made here, the distillation
term beside Dr.GRPO) and TRL's DistillationTrainer (where .venv-trl exists, `make trl-env`) each train two steps on
the same student, teacher and prompts, and one evaluator scores both systems' final weights."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import yaml

from zerobubble.tooling.bench.distill import register_bench

STEPS = 2
TRL_VENV = Path(__file__).resolve().parents[3] / ".venv-trl"


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register_bench(parser.add_subparsers(dest="what"))
    return parser.parse_args(["distill", *argv])


@pytest.mark.slow
def test_both_systems_distil_from_the_same_teacher_and_one_evaluator_scores_them(tmp_path):
    args = parse("--seeds", "0", "--steps", str(STEPS), "--warm-start-steps", "0", "--teacher-warm-start-steps", "5",
                 "--trl-venv", str(TRL_VENV), "--cache", str(tmp_path / "cache"), "--workdir", str(tmp_path / "work"))
    figures = args.measure(args)

    ran = ["zerobubble", "trl"] if (TRL_VENV / "bin" / "python").exists() else ["zerobubble"]
    if "trl" not in ran:
        assert "make trl-env" in figures["skipped"]["trl"]
    assert figures["benchmark"] == "distill" and sorted(figures["runs"]) == sorted(ran)
    for system in ran:
        (run,) = figures["runs"][system]
        assert run["steps"] == STEPS and run["samples_trained"] == STEPS * figures["batch_samples"]
        assert run["gain"] == pytest.approx(run["pass@1_after"] - figures["pass@1_before"], abs=1e-3)
    # The project's run distilled: its steps report the reverse KL to the teacher the run made.
    rows = [json.loads(line) for line in
            (tmp_path / "work" / "zerobubble-seed0" / "trainer" / "metrics.jsonl").read_text().splitlines()]
    assert rows and all(row["teacher_reverse_kl"] != 0 for row in rows)
    served = yaml.safe_load((tmp_path / "work" / "zerobubble-seed0" / "configs" / "teacher.yaml").read_text())
    teacher = served["model"]["path"]
    made = json.loads((Path(teacher) / "ready.json").read_text())
    assert made["steps"] == 5
    if "trl" in ran:
        # TRL distils from that same teacher, at the reverse KL, on the same number of samples a step.
        trl = json.loads((tmp_path / "work" / "trl-seed0" / "settings.json").read_text())
        assert Path(trl["teacher"]) == Path(teacher) and trl["beta"] == 1.0
        assert trl["batch_samples"] == figures["batch_samples"]
