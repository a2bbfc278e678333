"""Prompt data sets in the forms users have them, for the buffer's training prompts and the evaluation sets.

Formats: JSON Lines, JSON (an array of rows), parquet, and local Hugging Face `datasets` folders (what
`save_to_disk` writes, or data files that `load_dataset` reads from a folder). Each row gives a prompt, a ground
truth (a math answer or code test cases), and optionally an id and a data source. Without a column mapping they are
recognised by their keys: this project's rows (`messages`, `gt_answer` or `test_cases`), verl's (`prompt` as
messages, `reward_model.ground_truth`, `data_source`), TRL's (`prompt` or `problem`, `solution`) and OpenRLHF's
(`context_messages`, `answer`); the mapping names other columns (OpenRLHF's `--input_key`/`--label_key`, verl's
`prompt_key`).

Rows are read in batches and kept as Arrow columns, not as one Python object per row, so a million-row set costs
about its text plus a few dozen bytes a row (`zerobubble bench data` measures it).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from zerobubble.common.config import ConfigError
from zerobubble.common.data_spec import (
    ANSWER_KEYS,
    DATA_SOURCE_KEYS,
    PROMPT_KEYS,
    TEST_CASES_KEYS,
    Columns,
    DataSpec,
)
from zerobubble.common.local_paths import missing_path
from zerobubble.v1 import common_pb2

log = logging.getLogger(__name__)

BATCH_ROWS = 4096
REPORTED_BAD_ROWS = 20
# One encoder for every row: json.dumps with options builds a new one per call.
_to_json = json.JSONEncoder(ensure_ascii=False).encode
_SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet", ".pq": "parquet"}
# What load_dataset reads from a folder of data files.
_FOLDER_SUFFIXES = {**_SUFFIXES, ".csv": "csv", ".tsv": "csv", ".arrow": "arrow"}
_FOLDER_METADATA = {"dataset_infos.json", "dataset_info.json", "dataset_dict.json", "state.json"}


class DataError(ConfigError):
    """A data set that cannot be used; the message names the file, the row and the field."""


@dataclass(frozen=True)
class PromptRow:
    prompt_id: str
    messages_json: str
    gt_answer: str | None = None
    test_inputs: tuple[str, ...] = ()
    test_outputs: tuple[str, ...] = ()
    data_source: str | None = None

    def to_message(self, epoch: int) -> common_pb2.Prompt:
        prompt = common_pb2.Prompt(prompt_id=self.prompt_id, epoch=epoch, messages_json=self.messages_json)
        if self.gt_answer is not None:
            prompt.gt_answer = self.gt_answer
        else:
            prompt.test_cases.inputs.extend(self.test_inputs)
            prompt.test_cases.outputs.extend(self.test_outputs)
        if self.data_source is not None:
            prompt.data_source = self.data_source
        return prompt


class BadRow(ValueError):
    """One row that cannot be used; the message names the field."""


def _nested(row: dict, parts: tuple[str, ...]) -> Any:
    value: Any = row
    for part in parts:
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _messages(value: Any, field: str) -> list[dict[str, str]]:
    if isinstance(value, str):
        if not value:
            raise BadRow(f"{field}: expected a non-empty prompt")
        return [{"role": "user", "content": value}]
    items = [value] if isinstance(value, dict) else value
    if not isinstance(items, list) or not items:
        raise BadRow(f"{field}: expected a {{role, content}} object or a non-empty list of them, or a string")
    messages = []
    for i, item in enumerate(items):
        where = f"{field}[{i}]" if isinstance(value, list) else field
        if not isinstance(item, dict):
            raise BadRow(f"{where}: expected an object with role and content")
        for key in ("role", "content"):
            if not isinstance(item.get(key), str):
                raise BadRow(f"{where}.{key}: expected a string")
        messages.append({"role": item["role"], "content": item["content"]})
    return messages


def _strings(value: Any, field: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadRow(f"{field}: expected a list of strings")
    return value


def _test_cases(value: Any, field: str) -> str:
    """The tests as compact JSON {inputs, outputs}, checked."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise BadRow(f"{field}: a string here must be JSON of {{inputs, outputs}} ({exc})") from None
    if not isinstance(value, dict):
        raise BadRow(f"{field}: expected an object with inputs and outputs")
    inputs = _strings(value.get("inputs"), f"{field}.inputs")
    outputs = _strings(value.get("outputs"), f"{field}.outputs")
    if len(inputs) != len(outputs) or not inputs:
        raise BadRow(f"{field}: expected as many outputs as inputs (at least one), got {len(inputs)} inputs and "
                     f"{len(outputs)} outputs")
    return _to_json({"inputs": inputs, "outputs": outputs})


class RowReader:
    """Turns one row of any recognised layout into (id, messages JSON, answer, tests JSON, data source)."""

    def __init__(self, columns: Columns, field: str):
        def keys(chosen: str | None, defaults: tuple[str, ...]) -> tuple[tuple[str, tuple[str, ...]], ...]:
            return tuple((key, tuple(key.split("."))) for key in (defaults if chosen is None else (chosen,)))

        self.prompt_keys = keys(columns.prompt_key, PROMPT_KEYS)
        self.answer_keys = keys(columns.answer_key, ANSWER_KEYS)
        self.test_keys = keys(columns.test_cases_key, TEST_CASES_KEYS)
        self.source_keys = keys(columns.data_source_key, DATA_SOURCE_KEYS)
        self.system_prompt = columns.system_prompt
        self.field = field
        # Which column gave each field, over the rows read: what a data summary reports.
        self.used: dict[str, set[str]] = {"prompt": set(), "answer": set(), "test_cases": set(), "data_source": set()}

    @staticmethod
    def _first(row: dict, keys: tuple[tuple[str, tuple[str, ...]], ...]) -> tuple[str, Any]:
        for key, parts in keys:
            # A key that itself holds a dot wins over the nested field it also names.
            value = row.get(key)
            if value is None and len(parts) > 1:
                value = _nested(row, parts)
            if value is not None:
                return key, value
        return keys[0][0], None

    @staticmethod
    def _names(keys: tuple[tuple[str, tuple[str, ...]], ...]) -> str:
        return " or ".join(key for key, _ in keys)

    def read(self, row: Any, default_id: int) -> tuple[str, str, str | None, str | None, str | None]:
        if not isinstance(row, dict):
            raise BadRow("expected a JSON object (a row with named fields)")
        raw_id = row.get("id", default_id)
        if not isinstance(raw_id, str | int) or isinstance(raw_id, bool) or str(raw_id) == "":
            raise BadRow("id: expected a non-empty string or an integer")
        key, prompt = self._first(row, self.prompt_keys)
        if prompt is None:
            raise BadRow(f"no prompt: expected {self._names(self.prompt_keys)} (or name the column in "
                         f"{self.field}.columns.prompt_key)")
        messages = _messages(prompt, key)
        if self.system_prompt and not any(m["role"] == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        answer_key, answer = self._first(row, self.answer_keys)
        tests_key, tests = self._first(row, self.test_keys)
        if answer is not None and tests is not None:
            raise BadRow(f"expected exactly one of {answer_key} (math) and {tests_key} (code)")
        if answer is None and tests is None:
            raise BadRow(f"no ground truth: expected {self._names(self.answer_keys)} (math) or "
                         f"{self._names(self.test_keys)} (code) (or name the column in {self.field}.columns)")
        if answer is not None and (not isinstance(answer, str | int | float) or isinstance(answer, bool)):
            raise BadRow(f"{answer_key}: expected a string or a number")
        source_key, source = self._first(row, self.source_keys)
        if source is not None and not isinstance(source, str):
            raise BadRow(f"{source_key}: expected a string")
        self.used["prompt"].add(key)
        self.used["answer" if answer is not None else "test_cases"].add(answer_key if answer is not None else tests_key)
        if source is not None:
            self.used["data_source"].add(source_key)
        return (str(raw_id), _to_json(messages),
                None if answer is None else str(answer),
                None if tests is None else _test_cases(tests, tests_key), source)


class IdIndex(Mapping[str, int]):
    """Prompt id -> position, from a sorted array of the ids' hashes: 16 bytes a row instead of a dict entry and a
    Python string per row. Hashes are this process's own (`hash`), which is all an in-memory index needs."""

    def __init__(self, ids: pa.ChunkedArray):
        self.ids = ids
        hashes = np.fromiter((hash(i) for i in _iter_strings(ids)), dtype=np.int64, count=len(ids))
        self.order = np.argsort(hashes, kind="stable")
        self.hashes = hashes[self.order]

    def _positions(self, prompt_id: str) -> Iterator[int]:
        h = hash(prompt_id)
        start = int(np.searchsorted(self.hashes, h, side="left"))
        for i in range(start, len(self.hashes)):
            if self.hashes[i] != h:
                break
            yield int(self.order[i])

    def __getitem__(self, prompt_id: str) -> int:
        if isinstance(prompt_id, str):
            for position in self._positions(prompt_id):
                if self.ids[position].as_py() == prompt_id:
                    return position
        raise KeyError(prompt_id)

    def __len__(self) -> int:
        return len(self.ids)

    def __iter__(self) -> Iterator[str]:
        return _iter_strings(self.ids)

    def duplicates(self) -> list[tuple[int, int]]:
        """(position, position of the first row with the same id) for every later row that repeats an id."""
        found = []
        same = np.flatnonzero(self.hashes[1:] == self.hashes[:-1])
        for run_start in same[np.r_[True, np.diff(same) > 1]] if len(same) else ():
            end = run_start + 1
            while end < len(self.hashes) and self.hashes[end] == self.hashes[run_start]:
                end += 1
            first_of: dict[str, int] = {}
            for position in sorted(int(p) for p in self.order[run_start:end]):
                prompt_id = self.ids[position].as_py()
                if prompt_id in first_of:
                    found.append((position, first_of[prompt_id]))
                else:
                    first_of[prompt_id] = position
        return sorted(found)


def _iter_strings(array: pa.ChunkedArray) -> Iterator[str]:
    for chunk in array.chunks:
        yield from chunk.to_pylist()


class _Builder:
    """Rows collected a batch at a time into Arrow chunks."""

    NAMES = ("ids", "messages", "answers", "tests", "sources")

    def __init__(self):
        self.chunks: dict[str, list[pa.Array]] = {name: [] for name in self.NAMES}
        self.lines: list[np.ndarray] = []
        self.pending: list[tuple] = []
        self.pending_lines: list[int] = []
        self.count = 0

    def add(self, values: tuple, line: int) -> None:
        self.pending.append(values)
        self.pending_lines.append(line)
        self.count += 1
        if len(self.pending) >= BATCH_ROWS:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        for name, column in zip(self.NAMES, zip(*self.pending, strict=True), strict=True):
            array = pa.array(column, pa.large_string())
            # Few distinct sources: one copy of each name.
            self.chunks[name].append(array.dictionary_encode() if name == "sources" else array)
        self.lines.append(np.asarray(self.pending_lines, dtype=np.int64))
        self.pending, self.pending_lines = [], []

    def columns(self) -> tuple[dict[str, pa.ChunkedArray], np.ndarray]:
        self.flush()
        types = {name: pa.dictionary(pa.int32(), pa.large_string()) if name == "sources" else pa.large_string()
                 for name in self.NAMES}
        columns = {name: pa.chunked_array(chunks, types[name]) for name, chunks in self.chunks.items()}
        lines = np.concatenate(self.lines) if self.lines else np.zeros(0, dtype=np.int64)
        return columns, lines


class BadRows:
    """How many rows were bad, and the first few, each with its place in the file and its field."""

    def __init__(self, path: Path, label: str):
        self.path, self.label = path, label
        self.count = 0
        self.reported: list[tuple[int, str]] = []

    def add(self, line: int, message: str) -> None:
        self.count += 1
        self.reported.append((line, message))
        self.reported.sort()
        del self.reported[REPORTED_BAD_ROWS:]

    def summary(self, total: int) -> str:
        listed = "".join(f"\n  {self.label} {line}: {message}" for line, message in self.reported)
        more = f"\n  ... and {self.count - len(self.reported)} more" if self.count > len(self.reported) else ""
        return f"{self.path}: {self.count} bad row(s) of {total}:{listed}{more}"


class DataSet(Sequence[PromptRow]):
    """The usable rows of a data set, by position (a Sequence of PromptRow) and by id (`index_of`)."""

    def __init__(self, columns: dict[str, pa.ChunkedArray], *, path: Path):
        self.columns = columns
        self.path = path
        self.skipped = 0  # bad rows left out (skip_bad_rows)
        self.index_of = IdIndex(columns["ids"])

    def __len__(self) -> int:
        return len(self.columns["ids"])

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if not -len(self) <= index < len(self):
            raise IndexError(index)
        ids, messages, answers, tests, sources = (self.columns[name][index].as_py() for name in _Builder.NAMES)
        cases = json.loads(tests) if tests is not None else {"inputs": (), "outputs": ()}
        return PromptRow(ids, messages, answers, tuple(cases["inputs"]), tuple(cases["outputs"]), sources)

    @property
    def fingerprint(self) -> str:
        """Names the set by its ids in order, so state kept for another set is not applied to this one."""
        digest = hashlib.sha256()
        for i, prompt_id in enumerate(_iter_strings(self.columns["ids"])):
            digest.update((prompt_id if i == 0 else "\n" + prompt_id).encode())
        return digest.hexdigest()[:16]


# Readers: (line or row number, the row, or None and why it could not be read).

def _jsonl_rows(path: Path) -> Iterator[tuple[int, Any, str | None]]:
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                yield number, json.loads(line), None
            except json.JSONDecodeError as exc:
                yield number, None, f"not JSON: {exc}"
            except RecursionError:
                yield number, None, "not JSON: nested too deeply"


def _json_rows(path: Path) -> Iterator[tuple[int, Any, str | None]]:
    with open(path, encoding="utf-8") as f:
        head = f.read(4096).lstrip()
    if head.startswith("{"):
        # Many ".json" data files are JSON Lines (one object per line), as Hugging Face's json loader accepts.
        yield from _jsonl_rows(path)
        return
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: not JSON: {exc}") from None
    if not isinstance(rows, list):
        raise DataError(f"{path}: expected a JSON array of rows (or JSON Lines, one object per line)")
    for number, row in enumerate(rows, start=1):
        yield number, row, None


def _parquet_rows(path: Path) -> Iterator[tuple[int, Any, str | None]]:
    import pyarrow.parquet as pq

    try:
        batches = pq.ParquetFile(path).iter_batches(batch_size=BATCH_ROWS)
        number = 0
        for batch in batches:
            for row in batch.to_pylist():
                number += 1
                yield number, row, None
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise DataError(f"{path}: not a readable parquet file: {exc}") from None


def _one_format(path: Path, field: str) -> None:
    """load_dataset reads a folder's files of its most common format and ignores the others: a folder that mixes
    formats would train on whichever it guessed."""
    found: dict[str, list[str]] = {}
    for file in sorted(path.rglob("*")):
        kind = _FOLDER_SUFFIXES.get(file.suffix.lower())
        hidden = any(part.startswith(".") for part in file.relative_to(path).parts)
        if kind and file.is_file() and not hidden and file.name not in _FOLDER_METADATA:
            found.setdefault(kind, []).append(str(file.relative_to(path)))
    if len(found) > 1:
        listed = "; ".join(f"{kind}: {', '.join(files[:3])}" for kind, files in found.items())
        raise DataError(f"{field}.path: {path} holds data files of {len(found)} formats ({listed}), and only one "
                        "would be read: give the file itself, or a folder of one format")


def _folder_rows(path: Path, split: str | None, default_split: str, field: str) -> Iterator[tuple[int, Any, None]]:
    """A Hugging Face `datasets` folder: save_to_disk's (memory-mapped Arrow) or data files load_dataset reads."""
    try:
        import datasets
    except ImportError:
        raise DataError(f"{field}.path: {path} is a folder, read as a Hugging Face datasets folder, which needs the "
                        "`datasets` package") from None
    datasets.disable_progress_bars()
    try:
        if (path / "state.json").exists() or (path / "dataset_dict.json").exists():
            data = datasets.load_from_disk(str(path))
        else:
            _one_format(path, field)
            data = datasets.load_dataset(str(path.resolve()))
    except (ValueError, FileNotFoundError, datasets.exceptions.DatasetGenerationError) as exc:
        raise DataError(f"{field}.path: {path} is not a data set folder that datasets can read: {exc}") from None
    if isinstance(data, datasets.DatasetDict):
        names = list(data)
        chosen = split or (names[0] if len(names) == 1 else default_split)
        if chosen not in data:
            raise DataError(f"{field}.split: {path} has the splits {', '.join(names)}; "
                            f"{'there is no ' + chosen if split else 'name the one to use'}")
        data = data[chosen]
    elif split is not None:
        raise DataError(f"{field}.split: {path} is a single data set without splits; leave split unset")
    number = 0
    for batch in data.iter(batch_size=BATCH_ROWS):
        keys = list(batch)
        for values in zip(*batch.values(), strict=True):
            number += 1
            yield number, dict(zip(keys, values, strict=True)), None


@dataclass(frozen=True)
class DataSummary:
    """What reading a set found: for the summary `up` prints before it starts."""

    path: Path
    format: str
    rows: int
    complete: bool  # False: the check stopped at its deadline, and `rows` are the first ones
    skipped: int
    columns: dict[str, list[str]]

    def describe(self) -> str:
        rows = f"{self.rows} rows" if self.complete else f"{self.rows}+ rows (the first ones checked)"
        used = ", ".join(f"{name} <- {' | '.join(keys)}" for name, keys in self.columns.items() if keys)
        return f"{self.path} ({self.format}): {rows}, {self.skipped} skipped; columns: {used}"


def data_format(path: Path) -> str:
    return "datasets folder" if path.is_dir() else _SUFFIXES.get(path.suffix.lower(), "unknown")


def _rows(spec: DataSpec, default_split: str, field: str) -> tuple[Iterator[tuple[int, Any, str | None]], str]:
    """The row iterator and what its numbers count ("line" or "row")."""
    path = spec.path
    if path.is_dir():
        return _folder_rows(path, spec.split, default_split, field), "row"
    if missing := missing_path(path, field):
        raise DataError(missing)
    kind = _SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise DataError(f"{field}.path: {path}: unknown format; expected .jsonl, .json, .parquet or a datasets folder")
    if spec.split is not None:
        raise DataError(f"{field}.split: {path} is one file without splits; leave split unset")
    readers = {"jsonl": _jsonl_rows, "json": _json_rows, "parquet": _parquet_rows}
    return readers[kind](path), "line" if kind == "jsonl" else "row"


def load_data(spec: DataSpec, *, field: str, default_split: str) -> DataSet:
    """Read the set, stopping with a summary of its bad rows (file, line or row, field) unless skip_bad_rows."""
    return _load(spec, field=field, default_split=default_split, deadline=None)[0]


def check_data(spec: DataSpec, *, field: str, default_split: str, seconds: float) -> bool:
    """What load_data would refuse, found before anything expensive starts: the rows read within `seconds` (all of
    a small set, the start of a big one) are checked as load_data checks them, with the same DataError. True when
    every row was read."""
    return inspect_data(spec, field=field, default_split=default_split, seconds=seconds).complete


def inspect_data(spec: DataSpec, *, field: str, default_split: str, seconds: float) -> DataSummary:
    """check_data's reading, and what it found: the format, the rows, the bad rows left out, the columns used."""
    reader = RowReader(spec.columns, field)
    data, complete = _load(spec, field=field, default_split=default_split, deadline=time.monotonic() + seconds,
                           reader=reader)
    return DataSummary(spec.path, data_format(spec.path), len(data), complete, data.skipped,
                       {name: sorted(keys) for name, keys in reader.used.items()})


def _load(spec: DataSpec, *, field: str, default_split: str, deadline: float | None,
          reader: RowReader | None = None) -> tuple[DataSet, bool]:
    """The set's usable rows, and whether they are all of them (reading stops at `deadline`)."""
    rows, label = _rows(spec, default_split, field)
    reader = reader or RowReader(spec.columns, field)
    builder, bad = _Builder(), BadRows(spec.path, label)
    total = 0
    complete = True
    try:
        for number, row, error in rows:
            if deadline is not None and time.monotonic() > deadline:
                complete = False
                break
            total += 1
            if error is None:
                try:
                    builder.add(reader.read(row, builder.count), number)
                    continue
                except BadRow as exc:
                    error = str(exc)
            bad.add(number, error)
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{spec.path}: cannot read: {exc}") from None
    columns, lines = builder.columns()
    data = DataSet(columns, path=spec.path)
    duplicates = data.index_of.duplicates()
    for position, first in duplicates:
        bad.add(int(lines[position]), f"id: {columns['ids'][position].as_py()!r} appears more than once (first at "
                                      f"{label} {lines[first]})")
    if bad.count and not spec.skip_bad_rows:
        raise DataError(f"{bad.summary(total)}\nfix them, or set {field}.skip_bad_rows to leave them out")
    if duplicates:
        keep = np.ones(len(data), dtype=bool)
        keep[[position for position, _ in duplicates]] = False
        mask = pa.array(keep)
        data = DataSet({name: column.filter(mask) for name, column in columns.items()}, path=spec.path)
    data.skipped = bad.count
    if bad.count:
        log.warning("skipping %s", bad.summary(total))
    if complete and not len(data):
        raise DataError(f"{spec.path}: no prompts")
    return data, complete
