"""A run folder belongs to one run: `up` on a folder holding a run refuses, naming --resume and a fresh folder;
--overwrite clears it; --resume checks the model before it writes anything. The pre-flight names an unknown
verifier and a mistyped relative model path, with no process started."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from zerobubble.tooling.cli import main
from zerobubble.tooling.launcher.config import UpConfig, write_yaml
from zerobubble.tooling.launcher.run_folder import RUN_ENTRIES, clear, holds_run


@pytest.fixture(autouse=True)
def no_children(monkeypatch) -> list:
    """Nothing these tests run may start a process."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"a process was started: {args}")

    monkeypatch.setattr(subprocess, "Popen", refuse)


def model_folder(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    return path


def earlier_run(run_dir: Path, model: Path) -> Path:
    """What a finished run leaves: its config, write-ahead log, checkpoints and evaluations."""
    config = write_yaml(run_dir / "configs" / "up.yaml",
                        UpConfig(run_dir=run_dir, model=model).model_dump(mode="json"))
    (run_dir / "buffer-wal").mkdir()
    (run_dir / "buffer-wal" / "000001.log").write_bytes(b"old groups")
    (run_dir / "trainer" / "checkpoints" / "step-20").mkdir(parents=True)
    (run_dir / "eval").mkdir()
    (run_dir / "eval" / "summary.jsonl").write_text('{"version": 20, "pass@1": 0.9}\n')
    return config


def test_a_new_run_in_a_folder_holding_a_run_is_refused_naming_resume_and_a_fresh_folder(tmp_path, capsys):
    run_dir = tmp_path / "run"
    earlier_run(run_dir, model_folder(tmp_path / "model"))
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    assert main(["up", "-m", str(tmp_path / "model"), "--set", f"run_dir={run_dir}"]) == 2
    err = capsys.readouterr().err
    assert "run_dir" in err and f"--resume {run_dir}" in err and "fresh folder" in err and "--overwrite" in err
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before


def test_overwrite_passes_the_folder_check_and_clears_only_what_a_run_writes(tmp_path, capsys):
    run_dir = tmp_path / "run"
    earlier_run(run_dir, model_folder(tmp_path / "model"))
    # With --overwrite the folder is no reason to stop: the next check (here a bad verifier) is what stops it,
    # before anything is removed.
    assert main(["up", "--overwrite", "-m", str(tmp_path / "model"), "-rt", "nope",
                 "--set", f"run_dir={run_dir}"]) == 2
    err = capsys.readouterr().err
    assert "run.verifier" in err and "holds a run" not in err
    assert holds_run(run_dir)
    (run_dir / "notes.txt").write_text("the user's own")
    (run_dir / "plot.png").write_bytes(b"png")
    clear(run_dir)
    assert not holds_run(run_dir) and not any((run_dir / entry).exists() for entry in RUN_ENTRIES)
    assert (run_dir / "notes.txt").read_text() == "the user's own"
    with pytest.raises(SystemExit):
        main(["up", "--resume", str(tmp_path / "nowhere"), "--overwrite"])
    assert "not allowed with" in capsys.readouterr().err


def test_resume_with_another_model_is_refused_before_anything_is_written(tmp_path, capsys):
    run_dir = tmp_path / "run"
    config = earlier_run(run_dir, model_folder(tmp_path / "model"))
    other = model_folder(tmp_path / "other-model")
    saved = config.read_bytes()
    assert main(["up", "--resume", str(run_dir), "-m", str(other)]) == 2
    err = capsys.readouterr().err
    assert "model:" in err and str(other) in err and str(tmp_path / "model") in err
    assert config.read_bytes() == saved
    assert main(["up", "--resume", str(run_dir), "--set", "tiny_model.size=3m"]) == 2


def test_resuming_a_run_at_max_steps_says_there_is_nothing_left_to_do(tmp_path, capsys):
    run_dir = tmp_path / "run"
    config = write_yaml(run_dir / "configs" / "up.yaml", UpConfig(
        run_dir=run_dir, model=model_folder(tmp_path / "model"), trainer={"max_steps": 20}).model_dump(mode="json"))
    for step in (10, 20):
        (run_dir / "trainer" / "checkpoints" / f"step-{step:06d}").mkdir(parents=True)
        (run_dir / "trainer" / "checkpoints" / f"step-{step:06d}" / "trainer_state.json").write_text("{}")
    saved = config.read_bytes()
    assert main(["up", "--resume", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "20 steps (trainer.max_steps=20): nothing left to do" in out and "trainer.max_steps=40" in out
    assert config.read_bytes() == saved


def test_an_unknown_verifier_is_named_before_anything_starts(tmp_path, capsys):
    for argv, field in ((["-rt", "python"], "run.verifier: unknown verifier 'python'"),
                        (["--set", "run.by_data_source={apps: cod}"], "run.by_data_source.apps")):
        assert main(["up", *argv, "--set", f"run_dir={tmp_path / 'run'}"]) == 2
        err = capsys.readouterr().err
        assert field in err and "known: boxed, code, think_answer_tags" in err, err
    # A verifier the reward section adds is known.
    assert main(["up", "-rt", "mine", "-m", str(tmp_path / "missing"), "--set", f"run_dir={tmp_path / 'run'}",
                 "--set", "reward.custom_verifiers=[{name: mine, function: 'm:f'}]"]) == 2
    assert "unknown verifier" not in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_a_mistyped_relative_model_path_is_reported_as_a_path(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    for typed, shown in (("./models/qwen-typo", "./models/qwen-typo"), ("models/qwen-typo", "./models/qwen-typo"),
                         ("./x", "./x")):
        assert main(["up", "-m", typed, "--set", "run_dir=run"]) == 2
        err = capsys.readouterr().err
        assert f"no such folder {shown} (model)" in err and "hub id" not in err, err
    assert main(["up", "-m", "Qwen/Qwen2.5-0.5B-Instruct", "--set", "run_dir=run"]) == 2
    assert "hub id" in capsys.readouterr().err
