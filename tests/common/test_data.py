"""Users' data sets: verl parquet, TRL and OpenRLHF JSONL, JSON arrays and Hugging Face folders load with the path
alone; a column mapping overrides; bad rows are reported with file, row and field, or skipped when asked; a
hub id is refused naming the field; the buffer hands the rows out over gRPC."""

from __future__ import annotations

import json
import logging
import tracemalloc

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from stack import start_buffer

from zerobubble.buffer.config import PromptsConfig
from zerobubble.buffer.prompts import PromptSource
from zerobubble.common.clients.buffer import BufferClient
from zerobubble.common.data import DataError, DataSpec, load_data
from zerobubble.rollout.config import EvalConfig

QUESTIONS = [("What is 2+3?", "5"), ("What is 7-4?", "3"), ("What is 6+1?", "7")]


def verl_rows() -> list[dict]:
    """Rows as verl's data preprocessing scripts (examples/data_preprocess/gsm8k.py) write them."""
    return [{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": q}], "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": a}, "extra_info": {"split": "train", "index": i}}
            for i, (q, a) in enumerate(QUESTIONS)]


def write_jsonl(path, rows: list[dict]):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_verl_parquet(path):
    pq.write_table(pa.Table.from_pylist(verl_rows()), path)
    return path


def loaded(path, **spec) -> list:
    source = PromptSource.from_config(PromptsConfig(path=path, **spec))
    return [source.rows[i] for i in range(len(source))]


def messages(row) -> list[dict]:
    return json.loads(row.messages_json)


def test_a_verl_parquet_file_loads_with_its_path_alone(tmp_path):
    rows = loaded(write_verl_parquet(tmp_path / "train.parquet"))
    assert [r.gt_answer for r in rows] == ["5", "3", "7"]
    assert messages(rows[0]) == [{"role": "user", "content": "What is 2+3?"}]
    assert {r.data_source for r in rows} == {"openai/gsm8k"}
    assert [r.prompt_id for r in rows] == ["0", "1", "2"]


def test_trl_rows_load_with_their_path_alone(tmp_path):
    path = write_jsonl(tmp_path / "trl.jsonl", [
        {"prompt": "What is 2+3?", "solution": "5"},                                     # standard
        {"prompt": [{"role": "user", "content": "What is 7-4?"}], "solution": "3"},      # conversational
        {"problem": "What is 6+1?", "solution": "The sum is $\\boxed{7}$."},             # MATH-style
    ])
    rows = loaded(path)
    assert [messages(r) for r in rows] == [[{"role": "user", "content": q}] for q, _ in QUESTIONS]
    assert [r.gt_answer for r in rows] == ["5", "3", "The sum is $\\boxed{7}$."]


def test_openrlhf_rows_load_with_their_path_alone_and_its_key_flags_map_other_columns(tmp_path):
    rows = loaded(write_jsonl(tmp_path / "orlhf.jsonl", [
        {"context_messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": q}],
         "answer": a, "datasource": "arith"} for q, a in QUESTIONS]))
    assert messages(rows[1]) == [{"role": "system", "content": "Be brief."},
                                 {"role": "user", "content": "What is 7-4?"}]
    assert [r.gt_answer for r in rows] == ["5", "3", "7"] and rows[0].data_source == "arith"
    # Rows trained with --input_key question --label_key label: names recognition does not guess.
    path = write_jsonl(tmp_path / "keys.jsonl", [{"question": q, "label": a} for q, a in QUESTIONS])
    with pytest.raises(DataError, match="line 1: no prompt: expected messages or prompt"):
        loaded(path)
    rows = loaded(path, columns={"prompt_key": "question", "answer_key": "label"})
    assert [(messages(r)[0]["content"], r.gt_answer) for r in rows] == QUESTIONS


def test_an_explicit_mapping_overrides_the_recognised_keys(tmp_path):
    path = write_jsonl(tmp_path / "both.jsonl", [
        {"prompt": "raw", "query": "What is 2+3?", "answer": "wrong", "meta": {"final": 5}, "src": "mine"}])
    row = loaded(path, columns={"prompt_key": "query", "answer_key": "meta.final", "data_source_key": "src",
                                "system_prompt": "Answer in \\boxed{}."})[0]
    assert messages(row) == [{"role": "system", "content": "Answer in \\boxed{}."},
                             {"role": "user", "content": "What is 2+3?"}]
    assert row.gt_answer == "5" and row.data_source == "mine"


def test_code_rows_take_test_cases_as_an_object_or_as_json_text(tmp_path):
    tests = {"inputs": ["1\n"], "outputs": ["2\n"]}
    rows = loaded(write_jsonl(tmp_path / "code.jsonl", [{"prompt": "add one", "test_cases": tests},
                                                        {"prompt": "add one", "test_cases": json.dumps(tests)}]))
    for row in rows:
        message = row.to_message(0)
        assert message.WhichOneof("ground_truth") == "test_cases"
        assert list(message.test_cases.inputs) == ["1\n"] and list(message.test_cases.outputs) == ["2\n"]


def test_json_arrays_and_json_lines_named_json_both_load(tmp_path):
    array = tmp_path / "array.json"
    array.write_text(json.dumps([{"problem": q, "answer": a} for q, a in QUESTIONS]))
    assert [r.gt_answer for r in loaded(array)] == ["5", "3", "7"]
    lines = write_jsonl(tmp_path / "lines.json", [{"problem": q, "answer": a} for q, a in QUESTIONS])
    assert [r.gt_answer for r in loaded(lines)] == ["5", "3", "7"]


def test_hugging_face_folders_load_and_a_split_is_chosen(tmp_path):
    train = datasets.Dataset.from_list(verl_rows())
    train.save_to_disk(str(tmp_path / "single"))
    assert [r.gt_answer for r in loaded(tmp_path / "single")] == ["5", "3", "7"]

    test = datasets.Dataset.from_list(verl_rows()[:1])
    datasets.DatasetDict({"train": train, "test": test}).save_to_disk(str(tmp_path / "dict"))
    assert len(loaded(tmp_path / "dict")) == 3  # training prompts: train
    held_out = load_data(DataSpec(path=tmp_path / "dict"), field="eval.datasets.x", default_split="test")
    assert len(held_out) == 1
    with pytest.raises(DataError, match="prompts.split: .* has the splits train, test; there is no dev"):
        loaded(tmp_path / "dict", split="dev")

    # A folder of data files as a hub repository has them, read by load_dataset.
    (tmp_path / "repo" / "data").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(verl_rows()), tmp_path / "repo" / "data" / "train-00000-of-00001.parquet")
    assert [r.data_source for r in loaded(tmp_path / "repo")] == ["openai/gsm8k"] * 3


def test_a_hub_id_is_refused_naming_the_field_and_saying_why(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError, match="prompts.path: openai/gsm8k: .*hub id.*need network"):
        loaded("openai/gsm8k")
    with pytest.raises(DataError, match="eval.datasets.heldout.path: .*no such file"):
        load_data(EvalConfig(datasets={"heldout": "absent.jsonl"}).datasets["heldout"],
                  field="eval.datasets.heldout", default_split="test")
    (tmp_path / "rows.csv").write_text("a,b\n")
    with pytest.raises(DataError, match="prompts.path: rows.csv: unknown format"):
        loaded("rows.csv")


def test_bad_rows_stop_the_load_with_a_summary_naming_file_row_and_field(tmp_path):
    rows = [{"prompt": q, "answer": a} for q, a in QUESTIONS * 10]
    rows[3] = {"prompt": "no answer here"}
    rows[7] = {"prompt": [{"role": "user"}], "answer": "1"}
    rows[12] = {"prompt": "x", "answer": {"nested": 1}}
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(DataError) as refused:
        loaded(path)
    message = str(refused.value)
    assert f"{path}: 3 bad row(s) of 30" in message
    assert "line 4: no ground truth" in message
    assert "line 8: prompt[0].content: expected a string" in message
    assert "line 13: answer: expected a string or a number" in message
    assert "prompts.skip_bad_rows" in message


def test_skip_bad_rows_leaves_them_out_and_says_so_in_the_log(tmp_path, caplog):
    rows = [{"prompt": q, "answer": a} for q, a in QUESTIONS]
    rows.insert(1, {"prompt": "no answer"})
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    with caplog.at_level(logging.WARNING):
        source = PromptSource.from_config(PromptsConfig(path=path, skip_bad_rows=True))
    assert len(source) == 3 and source.rows.skipped == 1
    assert [source.rows[i].gt_answer for i in range(3)] == ["5", "3", "7"]
    assert f"skipping {path}: 1 bad row(s) of 4" in caplog.text and "line 2: no ground truth" in caplog.text


def test_duplicate_ids_are_bad_rows_named_with_both_lines(tmp_path):
    path = write_jsonl(tmp_path / "dup.jsonl", [{"id": f"q{i % 3}", "prompt": "x", "answer": "1"} for i in range(5)])
    with pytest.raises(DataError, match=r"line 4: id: 'q0' appears more than once \(first at line 1\)"):
        loaded(path)
    source = PromptSource.from_config(PromptsConfig(path=path, skip_bad_rows=True))
    assert dict(source.index_of) == {"q0": 0, "q1": 1, "q2": 2}
    assert source.index_of.get("q3") is None and "q1" in source.index_of


def test_rows_are_not_held_as_python_objects(tmp_path):
    # 40,000 rows held as PromptRow objects and a dict of ids would take well over 20 MB of the Python heap; the Arrow
    # columns the rows live in are outside it, so the heap's peak is the batch being read, whatever the size of the set.
    path = write_jsonl(tmp_path / "big.jsonl", [
        {"prompt": [{"role": "user", "content": f"What is {i}+1?"}], "reward_model": {"ground_truth": str(i + 1)}}
        for i in range(40_000)])
    pa.array(["warm"])  # pyarrow imports pandas on its first array, once per process: not the rows' cost
    tracemalloc.start()
    try:
        source = PromptSource.from_config(PromptsConfig(path=path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(source) == 40_000 and source.rows[39_999].gt_answer == "40000"
    assert source.index_of["39999"] == 39_999
    assert peak < 12 * 1024 * 1024, f"{peak / 2**20:.1f} MiB of Python objects at the peak"


def test_the_buffer_hands_out_verl_rows_over_grpc(tmp_path):
    host = start_buffer(write_verl_parquet(tmp_path / "train.parquet"), tmp_path / "wal")
    try:
        with BufferClient(host.address) as client:
            lease = client.lease("worker", 3)
        prompts = sorted(lease.prompts, key=lambda p: p.prompt_id)
        assert [p.gt_answer for p in prompts] == ["5", "3", "7"]
        assert json.loads(prompts[2].messages_json) == [{"role": "user", "content": "What is 6+1?"}]
    finally:
        host.stop(0)
