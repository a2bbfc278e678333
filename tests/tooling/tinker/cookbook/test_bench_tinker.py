"""`zerobubble bench tinker` scaled down: `zerobubble up` and the cookbook's own RL loop (in .venv-cookbook, against
a front) each train two steps from one student, warm-started as `--warm-start-steps` says, and the figures put the
two side by side."""

from __future__ import annotations

import argparse

import pytest

from zerobubble.tooling.bench.tinker import register_bench

STEPS = 2


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register_bench(parser.add_subparsers(dest="what"))
    return parser.parse_args(["tinker", *argv])


def test_both_loops_train_the_same_student_and_the_bench_puts_them_side_by_side(cookbook_python, tmp_path):
    venv = cookbook_python.parent.parent
    args = parse("--steps", str(STEPS), "--warm-start-steps", "3", "--cookbook-venv", str(venv),
                 "--cache", str(tmp_path / "cache"), "--workdir", str(tmp_path / "work"))
    figures = args.measure(args)

    assert figures["task"]["warm_start_steps"] == 3 and figures["task"]["steps"] == STEPS
    up, cookbook = figures["zerobubble"], figures["cookbook"]
    assert up["samples_trained"] == cookbook["samples_trained"] == STEPS * figures["task"]["batch_samples"]
    assert cookbook["steps"] == STEPS and cookbook["train_module"].startswith(str(venv))
    # Both started from the one student: their evaluators agree on it within the noise of 800 samples.
    assert cookbook["pass@1_before"] == pytest.approx(up["pass@1_before"], abs=0.06)
    for side in (up, cookbook):
        assert side["gain"] == pytest.approx(side["pass@1_after"] - side["pass@1_before"], abs=1e-3)
        assert side["gain_per_minute"] == pytest.approx(side["gain"] / (side["wall_seconds"] / 60), rel=1e-3)
    ratio = figures["cookbook_vs_zerobubble_gain_per_minute"]
    if up["gain_per_minute"]:
        assert ratio == pytest.approx(cookbook["gain_per_minute"] / up["gain_per_minute"], rel=1e-2, abs=1e-3)
    else:
        assert ratio is None, "no ratio to a run that gained nothing"
