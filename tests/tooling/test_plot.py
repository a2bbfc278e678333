"""`zerobubble plot`: a run folder's metrics become one PNG; a folder without metrics is refused by name."""

from __future__ import annotations

import argparse
import json
import math
import struct

import pytest

from zerobubble.tooling import cli, plot
from zerobubble.tooling.plot import RunDataError, eval_curves, plot_run, read_jsonl, trailing_mean

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_SIGNATURE
    return struct.unpack(">II", data[16:24])


def run_command(argv: list[str]) -> int:
    """Parses argv with the subcommand that `register` adds, as the zerobubble command does."""
    parser = argparse.ArgumentParser(prog="zerobubble")
    plot.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.run(args)


def write_run(run_dir, steps=40, with_eval=True, beta=0.0):
    (run_dir / "trainer").mkdir(parents=True)
    with open(run_dir / "trainer" / "metrics.jsonl", "w") as out:
        for step in range(1, steps + 1):
            row = {"step": step, "policy_version": step, "reward_mean": step / steps + 0.1 * math.sin(step),
                   "answer_accuracy": step / steps, "format_accuracy": min(1.0, 2 * step / steps),
                   "entropy": 1.5 - step / steps, "response_length_mean": 20 + step, "staleness_mean": 0.5,
                   "staleness_max": 1}
            if beta:
                row["kl"] = 0.001 * step
            out.write(json.dumps(row) + "\n")
    if with_eval:
        (run_dir / "eval").mkdir()
        with open(run_dir / "eval" / "summary.jsonl", "w") as out:
            for version in (0, 20, 40):
                out.write(json.dumps({"version": version, "dataset": "arith", "pass@1": version / 50,
                                      "pass@4": version / 45}) + "\n")


def test_plot_writes_one_png_of_the_run(tmp_path):
    write_run(tmp_path, beta=0.01)
    path = plot_run(tmp_path)
    assert path == tmp_path / "plot.png"
    data = path.read_bytes()
    width, height = png_size(data)
    assert (width, height) == (1600, 900)
    assert len(data) > 50_000  # six panels of curves, not an empty canvas
    assert not list(tmp_path.glob("*.partial"))


def test_plot_without_kl_or_eval_and_to_another_path(tmp_path):
    write_run(tmp_path, steps=5, with_eval=False)
    out = tmp_path / "figures" / "curves.png"
    assert plot_run(tmp_path, out) == out
    assert out.read_bytes()[:8] == PNG_SIGNATURE
    assert not (tmp_path / "plot.png").exists()


def test_plot_command_prints_the_path(tmp_path, capsys):
    write_run(tmp_path, steps=3)
    assert run_command(["plot", str(tmp_path), "--out", str(tmp_path / "p.png")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:8] == PNG_SIGNATURE


def test_the_zerobubble_command_lists_plot_and_parses_it(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["plot", "--help"])
    assert exc.value.code == 0
    assert "RUN_DIR" in capsys.readouterr().out.upper()


def test_missing_metrics_names_the_file(tmp_path):
    with pytest.raises(RunDataError, match=str(tmp_path / "trainer" / "metrics.jsonl")):
        plot_run(tmp_path)


def test_missing_metrics_exits_with_the_path(tmp_path):
    with pytest.raises(SystemExit) as exc:
        run_command(["plot", str(tmp_path)])
    assert str(tmp_path / "trainer" / "metrics.jsonl") in str(exc.value.code)


def test_metrics_without_steps_are_refused(tmp_path):
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "metrics.jsonl").write_text('{"note": "no step"}\n')
    with pytest.raises(RunDataError, match="no training step"):
        plot_run(tmp_path)


def test_corrupt_line_names_file_and_line(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1}\n{"step": \n{"step": 3}\n')
    with pytest.raises(RunDataError, match=r"m\.jsonl:2"):
        read_jsonl(path)


def test_a_line_being_written_is_left_out(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, "rew')
    assert read_jsonl(path) == [{"step": 1}]


def test_eval_points_sit_at_the_step_that_made_the_version():
    steps = [{"step": 1, "policy_version": 3}, {"step": 2, "policy_version": 4}]
    summary = [{"version": 4, "dataset": "a", "pass@1": 0.5}, {"version": 0, "dataset": "a", "pass@1": 0.1},
               {"version": 9, "dataset": "b", "pass@1": 0.7}]
    assert eval_curves(summary, steps) == {"a": ([0.0, 2.0], [0.1, 0.5]), "b": ([9.0], [0.7])}


def test_trailing_mean():
    assert trailing_mean([1, 3, 5, 7], 2).tolist() == [1.0, 2.0, 4.0, 6.0]


def test_every_panel_reads_a_key_the_trainer_writes():
    from zerobubble.trainer.metrics import STEP_FIGURES

    keys = {key for panel in plot.PANELS for key, _ in panel.series}
    assert keys <= set(STEP_FIGURES)


def test_steps_trained_again_after_a_restart_take_the_later_row(tmp_path, monkeypatch):
    write_run(tmp_path, steps=5, with_eval=False)
    with open(tmp_path / "trainer" / "metrics.jsonl", "a") as out:  # a resumed trainer redoes steps 4 and 5
        for step in (4, 5):
            out.write(json.dumps({"step": step, "policy_version": step, "reward_mean": 9.0}) + "\n")
    drawn = {}
    monkeypatch.setattr(plot, "_draw", lambda run_dir, steps, evals, out, x_key: drawn.setdefault("steps", steps))
    plot_run(tmp_path)
    assert [row["step"] for row in drawn["steps"]] == [1, 2, 3, 4, 5]
    assert [row["reward_mean"] for row in drawn["steps"][3:]] == [9.0, 9.0]


def test_another_runs_evaluations_are_drawn_beside_this_runs(tmp_path, monkeypatch):
    write_run(tmp_path / "with-tool")
    write_run(tmp_path / "no-tool", steps=20)
    drawn = {}
    real_draw = plot._draw
    monkeypatch.setattr(plot, "_draw", lambda run_dir, steps, evals, out, x_key: (
        drawn.update(evals), real_draw(run_dir, steps, evals, out, x_key)))
    assert run_command(["plot", str(tmp_path / "with-tool"), "--beside", str(tmp_path / "no-tool")]) == 0
    path = tmp_path / "with-tool" / "plot.png"
    assert set(drawn) == {"arith", "arith, no-tool"}
    # The baseline's versions placed at its own steps: version 20 was its step 20.
    assert drawn["arith, no-tool"] == ([0.0, 20.0, 40.0], [0.0, 0.4, 0.8])
    assert png_size(path.read_bytes()) == (1600, 900)


def timed_run(run_dir, step_seconds, teacher_seconds=None):
    """Steps 1-4 ending every `step_seconds` from t=1000 (the first took `step_seconds` too), versions = steps,
    evaluations of versions 0 and 4; a summary naming the teacher's preparation when given."""
    write_run(run_dir, steps=4, with_eval=False)
    rows = [json.loads(line) for line in (run_dir / "trainer" / "metrics.jsonl").read_text().splitlines()]
    with open(run_dir / "trainer" / "metrics.jsonl", "w") as out:
        for row in rows:
            row.update(time=1000.0 + (row["step"] - 1) * step_seconds, step_seconds=step_seconds)
            out.write(json.dumps(row) + "\n")
    (run_dir / "eval").mkdir()
    (run_dir / "eval" / "summary.jsonl").write_text("".join(
        json.dumps({"version": v, "dataset": "arith", "pass@1": p}) + "\n" for v, p in ((0, 0.1), (4, 0.3))))
    if teacher_seconds is not None:
        (run_dir / "summary.json").write_text(json.dumps({"teacher_preparation_seconds": teacher_seconds}))


def test_in_minutes_runs_compare_at_equal_time_the_teachers_making_counted(tmp_path, monkeypatch):
    timed_run(tmp_path / "distill", step_seconds=30, teacher_seconds=120)
    timed_run(tmp_path / "rl", step_seconds=15)
    drawn = {}
    real_draw = plot._draw
    monkeypatch.setattr(plot, "_draw", lambda run_dir, steps, evals, out, x_key: (
        drawn.update(evals=evals, steps=steps, x_key=x_key), real_draw(run_dir, steps, evals, out, x_key)))
    assert run_command(["plot", str(tmp_path / "distill"), "--beside", str(tmp_path / "rl"), "--minutes"]) == 0
    # The distillation run starts after its teacher's 2 minutes; step 4 ended 4 steps of 30 s later.
    assert drawn["evals"]["arith"] == ([2.0, 4.0], [0.1, 0.3])
    # The baseline made no teacher: from 0, its 4 steps of 15 s.
    assert drawn["evals"]["arith, rl"] == ([0.0, 1.0], [0.1, 0.3])
    assert [row["minutes"] for row in drawn["steps"]] == [2.5, 3.0, 3.5, 4.0]
    assert drawn["x_key"] == "minutes"
    assert png_size((tmp_path / "distill" / "plot.png").read_bytes()) == (1600, 900)


def test_in_minutes_a_run_without_step_times_is_refused_naming_the_file(tmp_path):
    write_run(tmp_path)
    with pytest.raises(RunDataError, match=r"metrics\.jsonl: the first step has no time"):
        plot_run(tmp_path, minutes=True)


def test_in_minutes_a_summary_that_is_not_up_s_json_is_refused_naming_it(tmp_path):
    timed_run(tmp_path, step_seconds=30)
    (tmp_path / "summary.json").write_text("[1, 2")
    with pytest.raises(RunDataError, match=r"summary\.json is not the JSON object"):
        plot_run(tmp_path, minutes=True)
