"""`make-task` and `make-tiny-model` as registered on a fresh parser: files written, one JSON line printed."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from zerobubble.tooling.tiny.commands import register
from zerobubble.tooling.tiny.task import read_task


def run(argv: list[str], capsys) -> dict:
    parser = argparse.ArgumentParser(prog="zerobubble")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    assert args.run(args) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    return json.loads(lines[0])


def test_make_task_writes_both_files(tmp_path, capsys):
    report = run(["make-task", "arithmetic", str(tmp_path / "task"), "--train-size", "12", "--eval-size", "5"], capsys)
    assert len(read_task(report["train"])) == 12 and len(read_task(report["eval"])) == 5


@pytest.fixture
def restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_make_tiny_model_with_a_short_warm_start_reports_its_figures(tmp_path, capsys, restore_threads):
    task_dir = tmp_path / "task"
    run(["make-task", "arithmetic", str(task_dir), "--train-size", "8", "--eval-size", "3"], capsys)
    report = run(["make-tiny-model", str(tmp_path / "model"), "--size", "1m", "--seed", "1", "--threads", "1",
                  "--warm-start-task", str(task_dir), "--warm-start-steps", "3", "--eval-samples", "1"], capsys)
    assert report["parameters"] == 1_018_368 and report["size"] == "1m"
    assert torch.get_num_threads() == 1
    assert (tmp_path / "model" / "model.safetensors").is_file()
    assert report["warm_start"]["steps"] == 3
    assert report["eval"]["samples"] == 3 and 0.0 <= report["eval"]["accuracy"] <= 1.0


def test_unknown_size_and_task_are_refused(tmp_path):
    parser = argparse.ArgumentParser(prog="zerobubble")
    register(parser.add_subparsers(dest="command", required=True))
    with pytest.raises(SystemExit):
        parser.parse_args(["make-tiny-model", str(tmp_path), "--size", "3m"])
    with pytest.raises(SystemExit):
        parser.parse_args(["make-task", "geometry", str(tmp_path)])
