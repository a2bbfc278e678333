"""`zerobubble up` refuses bad input before it starts anything, naming the field; the CLI answers --help and
--version without torch, and a missing file is a message, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import pytest

import zerobubble.tooling.launcher.dry_run  # noqa: F401  (imports warm: the bound below is on the checks, not on torch)
from zerobubble.common.data import DataError, DataSpec, check_data
from zerobubble.tooling.cli import main

GOOD_ROW = {"messages": [{"role": "user", "content": "1+1?"}], "gt_answer": "2"}


def jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def bad_inputs(tmp: Path) -> list[tuple[list[str], str]]:
    """(up's arguments, what the message must name)."""
    good = jsonl(tmp / "good.jsonl", [GOOD_ROW])
    no_prompt = jsonl(tmp / "no-prompt.jsonl", [GOOD_ROW, {"gt_answer": "3"}])
    not_a_model = tmp / "not-a-model"
    not_a_model.mkdir()
    return [
        (["--set", "nonsense=1"], "nonsense"),
        (["--set", "run.num_generations=1"], "run.num_generations"),
        (["--set", "trainer.no_such_field=1"], "no_such_field"),
        (["--set", "trainer.batch.groups_per_step=three"], "batch.groups_per_step"),
        (["--set", "rollout.generation.temperature=-1"], "generation.temperature"),
        (["--set", "reward.math.workers=0"], "math.workers"),
        (["--set", "buffer.filters=3"], "filters"),
        (["-a", "NOPE"], "run.algorithm"),
        (["--set", "tiny_model.size=3m"], "tiny_model.size"),
        (["--config", str(tmp / "missing.yaml")], "missing.yaml"),
        (["-m", str(tmp / "missing-model")], "model: "),
        (["-m", "Qwen/Qwen2.5-0.5B-Instruct"], "hub id"),
        (["-m", str(not_a_model)], "config.json"),
        (["-d", str(tmp / "missing.jsonl")], "train_data"),
        (["-d", str(no_prompt)], "line 2: no prompt"),
        (["-d", str(good), "-ed", str(no_prompt)], "eval_data"),
        (["-d", str(good), "--set", "buffer.prompts.columns.bogus=x"], "columns.bogus"),
    ]


@pytest.fixture
def no_children(monkeypatch) -> list:
    """Any process started from here is recorded and refused."""
    started = []

    def refuse(*args, **kwargs):
        started.append(args)
        raise AssertionError(f"a process was started: {args}")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    return started


def test_bad_input_fails_in_seconds_naming_the_field_before_anything_starts(tmp_path, capsys, no_children):
    run_dir = tmp_path / "run"
    for argv, named in bad_inputs(tmp_path):
        started = time.monotonic()
        code = main(["up", *argv, "--set", f"run_dir={run_dir}"])
        elapsed = time.monotonic() - started
        err = capsys.readouterr().err
        assert code == 2, (argv, err)
        assert named in err, (argv, err)
        assert "Traceback" not in err, (argv, err)
        assert elapsed < 5, (argv, elapsed)
    assert no_children == []
    assert not run_dir.exists(), "a refused run wrote its folder"
    assert not (tmp_path / ".assets").exists(), "a refused run made the tiny model or the task"


def test_check_data_reads_a_big_file_only_as_long_as_it_is_allowed(tmp_path):
    path = jsonl(tmp_path / "big.jsonl", [{**GOOD_ROW, "id": i} for i in range(20000)] + [{"gt_answer": "3"}])
    spec = DataSpec(path=path)
    assert check_data(spec, field="buffer.prompts", default_split="train", seconds=0) is False
    with pytest.raises(DataError, match="line 20001: no prompt"):
        check_data(spec, field="buffer.prompts", default_split="train", seconds=60)
    good = DataSpec(path=jsonl(tmp_path / "good.jsonl", [GOOD_ROW]))
    assert check_data(good, field="buffer.prompts", default_split="train", seconds=60) is True
    with pytest.raises(DataError, match="no prompts"):
        check_data(DataSpec(path=jsonl(tmp_path / "empty.jsonl", [])), field="buffer.prompts",
                   default_split="train", seconds=60)


def test_help_and_version_answer_without_torch():
    code = """
import sys
from zerobubble.tooling.cli import main
for argv in (["--help"], ["up", "--help"], ["--version"]):
    try:
        main(argv)
    except SystemExit:
        pass
print([name for name in ("torch", "transformers", "vllm") if name in sys.modules])
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[-1] == "[]", "--help or --version imported " + lines[-1]
    assert f"zerobubble {version('zerobubble')}" in lines
    # Placeholders say what a value is, not the parser's internal name for it.
    assert "-m MODEL" in out.stdout and "--config FILE" in out.stdout and "REF_" not in out.stdout


@pytest.mark.parametrize("argv", [
    ["up", "--config", "{missing}/up.yaml"],
    ["up", "-d", "{missing}/train.jsonl"],
    ["up", "-m", "{missing}/model"],
    ["serve", "reward", "--config", "{missing}/reward.yaml"],
    ["score", "--file", "{missing}/rows.jsonl"],
    ["score", "--verifier", "code", "--tests", "{missing}/tests.json", "--response", "print(1)"],
    ["plot", "{missing}/run"],
])
def test_a_missing_file_is_a_message_naming_it_not_a_traceback(tmp_path, argv):
    missing = tmp_path / "missing"
    argv = [arg.format(missing=missing) for arg in argv]
    out = subprocess.run([sys.executable, "-m", "zerobubble", *argv], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert out.returncode != 0
    assert str(missing) in out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr, out.stderr
