"""`zerobubble bench learning` scaled down: the demo pipeline and TRL's GRPOTrainer (where .venv-trl exists, `make
trl-env`) each train two steps on the demo's task, and one evaluator scores both systems' final weights."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch
import yaml

from zerobubble.tooling.bench.learning import register_bench, trl_schedule
from zerobubble.tooling.configs import DEMO as DEMO_CONFIG
from zerobubble.trainer.optim import OptimConfig, lr_factor

STEPS = 2
TRL_VENV = Path(__file__).resolve().parents[3] / ".venv-trl"


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register_bench(parser.add_subparsers(dest="what"))
    return parser.parse_args(["learning", *argv])


def test_unknown_system_is_refused_naming_the_flag(capsys):
    with pytest.raises(SystemExit):
        parse("--systems", "zerobubble,verl")
    err = capsys.readouterr().err
    assert "--systems" in err and "'verl'" in err


# The demo's schedule with the length `up` derives for it (tests/tooling/launcher/test_run_settings.py).
DEMO_STEPS = 237
DEMO_OPTIM = {**yaml.safe_load(DEMO_CONFIG.read_text())["trainer"]["strategy"]["optim"], "total_steps": DEMO_STEPS}


@pytest.mark.parametrize("optim", [
    OptimConfig(**DEMO_OPTIM),
    OptimConfig(lr=1e-4),
    OptimConfig(lr=1e-4, warmup_steps=5, schedule="cosine", total_steps=40, min_lr_ratio=0.2),
    OptimConfig(lr=1e-4, warmup_steps=5),
], ids=["demo", "constant", "cosine-warmup", "constant-warmup"])
def test_trl_changes_the_learning_rate_as_the_demo_does(optim):
    """TRL's GRPOConfig names for the demo's schedule give the HF Trainer's scheduler the demo's factor at every
    step of a run of total_steps (HF's decay spans max_steps, which the bench makes the same), but for warm-up,
    where HF's lags one step (its first update is made at lr 0)."""
    from transformers import get_scheduler

    steps = optim.total_steps or 60
    schedule = trl_schedule(optim)
    parameter = torch.nn.Parameter(torch.zeros(1))
    hf = get_scheduler(schedule["lr_scheduler_type"], torch.optim.SGD([parameter], lr=optim.lr),
                       num_warmup_steps=schedule["warmup_steps"], num_training_steps=steps,
                       scheduler_specific_kwargs=schedule["lr_scheduler_kwargs"]).lr_lambdas[0]
    ours = lr_factor(optim)
    assert hf(0) == (0.0 if optim.warmup_steps else 1.0)
    for step in range(1, steps):
        expected = ours(step - 1) if step < optim.warmup_steps else ours(step)
        assert hf(step) == pytest.approx(expected, abs=1e-12), step
    if optim.schedule == "cosine":
        assert hf(steps - 1) < 1.0 and ours(steps) == pytest.approx(optim.min_lr_ratio)


@pytest.mark.slow
def test_both_systems_train_and_one_evaluator_scores_them(tmp_path):
    args = parse("--seeds", "0", "--steps", str(STEPS), "--warm-start-steps", "0", "--trl-venv", str(TRL_VENV),
                 "--cache", str(tmp_path / "cache"), "--workdir", str(tmp_path / "work"))
    figures = args.measure(args)

    ran = ["zerobubble", "trl"] if (TRL_VENV / "bin" / "python").exists() else ["zerobubble"]
    if "trl" not in ran:
        assert "make trl-env" in figures["skipped"]["trl"]
    assert sorted(figures["runs"]) == sorted(ran) and figures["steps"] == STEPS
    assert 0 <= figures["pass@1_before"] <= 1
    evaluator = figures["evaluator"]
    prompts = sum(1 for line in Path(evaluator["dataset"]).read_text().splitlines() if line.strip())
    for system in ran:
        (run,) = figures["runs"][system]
        assert run["steps"] == STEPS and run["samples_trained"] == STEPS * figures["batch_samples"]
        assert run["wall_seconds"] > 0 and run["load_mean"] > 0
        assert run["gain"] == pytest.approx(run["pass@1_after"] - figures["pass@1_before"], abs=1e-3)
        assert run["gain_per_minute"] == pytest.approx(run["gain"] / (run["wall_seconds"] / 60), abs=1e-3)
        # The same evaluator: every system's weights sampled on the whole held-out set, n times each, into
        # one file per version, as for the starting weights.
        assert run["eval"]["evaluator"] == "zerobubble.tooling.launcher.final_eval.evaluate_weights"
        rows = [json.loads(line) for line in
                (Path(run["eval"]["output_dir"]) / "heldout" / f"version-{run['version']:06d}.jsonl").open()]
        assert len(rows) == prompts * evaluator["samples_per_prompt"]
        assert sum(row["answer_ok"] for row in rows) / len(rows) == pytest.approx(run["pass@1_after"], abs=1e-3)
        summary = figures["summary"][system]
        assert summary["gain"]["mean"] == pytest.approx(run["gain"], abs=1e-3) and summary["gain"]["stdev"] is None
    if len(ran) == 2:
        assert set(figures["zerobubble_vs_trl"]) == {"gain_per_1k_samples", "gain_per_minute"}
    # Both decay the learning rate over the measured steps: the demo's cosine is cut to them, as TRL's spans them.
    trained = json.loads((tmp_path / "work" / "zerobubble-seed0" / "trainer" / "trainer-config.json").read_text())
    assert trained["strategy"]["optim"]["total_steps"] == STEPS != DEMO_STEPS
    if "trl" in ran:
        trl = json.loads((tmp_path / "work" / "trl-seed0" / "settings.json").read_text())
        assert {key: trl[key] for key in ("lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps")} == \
            trl_schedule(OptimConfig(**DEMO_OPTIM))
