"""`zerobubble eval MODEL --data FILE`: pass@1 and pass@k of a model folder on a data set, scored by a reward
service started for it, with the per-sample rows and the summary in --out; bad targets are named."""

from __future__ import annotations

import json

import pytest
import torch
from stack import tiny_assets

from zerobubble.tooling.cli import main


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_eval_of_a_model_folder_reports_pass_at_1_and_k(tmp_path, capsys):
    model, _, held_out = tiny_assets(tmp_path / "assets", train_size=4, eval_size=3)
    out = tmp_path / "eval"
    assert main(["eval", str(model), "--data", str(held_out), "--samples", "2", "--out", str(out),
                 "--set", "run.max_new_tokens=8"]) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert summary["prompts"] == 3 and summary["n"] == 2 and summary["version"] == 0
    assert 0.0 <= summary["pass@1"] <= summary["pass@2"] <= 1.0
    rows = [json.loads(line) for line in (out / "heldout" / "version-000000.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and all(len(row["text"]) <= 8 * 8 for row in rows)
    assert json.loads((out / "summary.jsonl").read_text()) == summary


def test_eval_names_what_it_cannot_evaluate(tmp_path, capsys):
    model, _, held_out = tiny_assets(tmp_path / "assets", train_size=4, eval_size=3)
    assert main(["eval", str(tmp_path / "nowhere"), "--data", str(held_out)]) == 2
    assert "MODEL_OR_RUN: no such folder" in capsys.readouterr().err
    assert main(["eval", str(tmp_path), "--data", str(held_out)]) == 2
    assert "neither a Hugging Face model folder" in capsys.readouterr().err
    assert main(["eval", str(model), "--data", str(tmp_path / "missing.jsonl")]) == 2
    assert "--data: no such file" in capsys.readouterr().err
