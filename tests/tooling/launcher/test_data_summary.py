"""What `up` says about the user's data before it starts: the file, its detected format, rows, rows skipped and
the columns each field came from; a folder mixing formats is refused instead of read by a guess."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zerobubble.common.data import DataError, DataSpec, inspect_data
from zerobubble.tooling.cli import main
from zerobubble.tooling.launcher.config import UpConfig
from zerobubble.tooling.launcher.preflight import check_run_data

VERL = {"prompt": [{"role": "user", "content": "1+1?"}], "reward_model": {"ground_truth": "2"}, "data_source": "a"}
TRL = {"problem": "2+2?", "solution": "4"}


def jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_the_summary_names_format_rows_skipped_and_columns(tmp_path, capsys):
    train = jsonl(tmp_path / "train.jsonl", [VERL, TRL, {"nothing": 1}])
    held_out = tmp_path / "test.parquet"
    pq.write_table(pa.Table.from_pylist([TRL, TRL]), held_out)
    check_run_data(UpConfig(train_data=train, eval_data=held_out, buffer={"prompts": {"skip_bad_rows": True}}))
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (f"train_data: {train} (jsonl): 2 rows, 1 skipped; columns: prompt <- problem | prompt, "
                      "answer <- reward_model.ground_truth | solution, data_source <- data_source")
    assert out[1] == (f"eval_data: {held_out} (parquet): 2 rows, 0 skipped; columns: prompt <- problem, "
                      "answer <- solution")


def test_a_big_file_is_summarised_as_the_rows_checked(tmp_path):
    found = inspect_data(DataSpec(path=jsonl(tmp_path / "big.jsonl", [TRL] * 100)), field="buffer.prompts",
                         default_split="train", seconds=0)
    assert not found.complete and "+ rows (the first ones checked)" in found.describe()


def test_a_folder_of_mixed_formats_is_refused_naming_its_files(tmp_path, capsys, monkeypatch):
    pytest.importorskip("datasets")
    folder = tmp_path / "data"
    folder.mkdir()
    jsonl(folder / "train.jsonl", [TRL])
    pq.write_table(pa.Table.from_pylist([VERL]), folder / "train.parquet")
    (folder / "dataset_infos.json").write_text("{}")
    with pytest.raises(DataError, match=r"2 formats \(jsonl: train.jsonl; parquet: train.parquet\)"):
        inspect_data(DataSpec(path=folder), field="buffer.prompts", default_split="train", seconds=5)

    def refuse(*args, **kwargs):
        raise AssertionError(f"a process was started: {args}")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    assert main(["up", "-d", str(folder), "--set", f"run_dir={tmp_path / 'run'}"]) == 2
    assert "train_data: buffer.prompts.path" in capsys.readouterr().err
    (folder / "train.parquet").unlink()
    found = inspect_data(DataSpec(path=folder), field="buffer.prompts", default_split="train", seconds=5)
    assert found.format == "datasets folder" and found.rows == 1
