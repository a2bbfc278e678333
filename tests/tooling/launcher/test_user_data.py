"""`zerobubble up` with a user's data: the held-out set is read with the training set's columns, and `zerobubble
bench data` loads each format end to end and reports its figures beside the every-row-a-dict reading."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from zerobubble.rollout.config import EvalConfig
from zerobubble.tooling.bench.data import bench_data
from zerobubble.tooling.launcher.config import UpConfig
from zerobubble.tooling.launcher.run import Run


def test_the_held_out_set_is_read_with_the_training_columns(tmp_path):
    columns = {"prompt_key": "question", "answer_key": "label"}
    run = Run(UpConfig(run_dir=tmp_path, buffer={"prompts": {"columns": columns, "skip_bad_rows": True,
                                                              "split": "train", "epochs": 2}}))
    spec = EvalConfig(datasets={"heldout": run.heldout_spec(tmp_path / "test.jsonl")}).datasets["heldout"]
    assert spec.columns.prompt_key == "question" and spec.columns.answer_key == "label" and spec.skip_bad_rows
    assert spec.split is None  # a folder's test split, not the training one
    assert EvalConfig(datasets={"heldout": Run(UpConfig(run_dir=tmp_path)).heldout_spec(tmp_path / "t.jsonl")}
                      ).datasets["heldout"].columns.prompt_key is None


def test_bench_data_loads_every_format_and_reports_rows_and_memory(tmp_path):
    result = bench_data(rows=3000, formats=("jsonl", "parquet", "folder"), workdir=tmp_path)
    json.dumps(result)
    for name in ("jsonl", "jsonl_as_dicts", "parquet", "parquet_as_dicts", "folder"):
        figures = result[name]
        assert figures["rows"] == 3000 and figures["rows_per_second"] > 0
        assert figures["peak_rss_mb"] >= figures["rss_before_mb"] > 0
    assert not list(tmp_path.iterdir()), "the scratch folder is removed"


def test_bench_data_refuses_an_unknown_format():
    done = subprocess.run([str(Path(sys.executable).parent / "zerobubble"), "bench", "data", "--formats", "csv"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "expected some of jsonl, parquet, folder, got 'csv'" in done.stderr


def test_the_tiny_model_warms_up_on_a_users_set_in_any_form(tmp_path):
    from zerobubble.tooling.launcher.assets import prepare_assets

    train = tmp_path / "data" / "trl.jsonl"
    train.parent.mkdir()
    train.write_text("".join(json.dumps({"prompt": f"{a}+{a}=", "solution": str(2 * a)}) + "\n" for a in range(6)))
    config = UpConfig(run_dir=tmp_path / "run", train_data=train, eval_data=train,
                      tiny_model={"warm_start_steps": 2}, pipeline={"torch_threads": 1})
    assets = prepare_assets(config, tmp_path / "cache")
    assert json.loads((assets.model / "ready.json").read_text())["steps"] == 2
    rows = [json.loads(line) for line in (assets.model / "warm-start.jsonl").read_text().splitlines()]
    assert rows[3] == {"messages": [{"role": "user", "content": "3+3="}], "gt_answer": "6"}
