"""`zerobubble bench learning` scaled down: the demo pipeline and TRL's GRPOTrainer (where .venv-trl exists, `make
trl-env`) each train two steps on the demo's task, and one evaluator scores both systems' final weights."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from zerobubble.bench.learning import register_bench

STEPS = 2
TRL_VENV = Path(__file__).resolve().parents[2] / ".venv-trl"


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register_bench(parser.add_subparsers(dest="what"))
    return parser.parse_args(["learning", *argv])


def test_unknown_system_is_refused_naming_the_flag(capsys):
    with pytest.raises(SystemExit):
        parse("--systems", "zerobubble,verl")
    err = capsys.readouterr().err
    assert "--systems" in err and "'verl'" in err


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
        assert run["eval"]["evaluator"] == "zerobubble.launcher.final_eval.evaluate_weights"
        rows = [json.loads(line) for line in
                (Path(run["eval"]["output_dir"]) / "heldout" / f"version-{run['version']:06d}.jsonl").open()]
        assert len(rows) == prompts * evaluator["samples_per_prompt"]
        assert sum(row["answer_ok"] for row in rows) / len(rows) == pytest.approx(run["pass@1_after"], abs=1e-3)
        summary = figures["summary"][system]
        assert summary["gain"]["mean"] == pytest.approx(run["gain"], abs=1e-3) and summary["gain"]["stdev"] is None
    if len(ran) == 2:
        assert set(figures["zerobubble_vs_trl"]) == {"gain_per_1k_samples", "gain_per_minute"}
