"""A growing JSONL file read by line number without loading it: the byte offset of each complete line, and the
training step it starts with, indexed in memory from where the last look stopped (the run may still be writing)."""

from __future__ import annotations

import json
import re
import threading
from array import array
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

# Small reads: the index grows by a few bytes a line, and its scan holds no more than a chunk and one line.
CHUNK_BYTES = 1 << 20
# The trainer writes each row with its step first; a row that does not is indexed with step -1.
_STEP = re.compile(rb'\{"step": (\d+)')


class LineIndex:
    def __init__(self, path: Path):
        self.path = path
        self.offsets = array("q")   # where each complete line starts
        self.steps = array("q")     # the step each line starts with
        self.end = 0                # just past the last complete line indexed
        self.lock = threading.Lock()

    def refresh(self) -> int:
        """Indexes the lines completed since the last call; the number of lines."""
        with self.lock:
            try:
                f = open(self.path, "rb")
            except FileNotFoundError:
                return 0
            with f:
                f.seek(0, 2)
                if f.tell() < self.end:  # the file was replaced (a run started over in the same folder)
                    self.offsets, self.steps, self.end = array("q"), array("q"), 0
                f.seek(self.end)
                pending = b""  # the start of a line not ended yet
                while chunk := f.read(CHUNK_BYTES):
                    pending += chunk
                    last = pending.rfind(b"\n")
                    if last >= 0:
                        self._add(pending[: last + 1])
                        pending = pending[last + 1:]
            return len(self.offsets)

    def _add(self, data: bytes) -> None:
        start = 0
        while (end := data.find(b"\n", start)) >= 0:
            if end > start:  # blank lines are not rows
                match = _STEP.match(data, start, min(end, start + 40))
                self.offsets.append(self.end + start)
                self.steps.append(int(match.group(1)) if match else -1)
            start = end + 1
        self.end += len(data)

    def __len__(self) -> int:
        return len(self.offsets)

    def read(self, number: int) -> dict[str, Any]:
        """Line `number` (from 0), parsed; ValueError when it is not a JSON object."""
        with open(self.path, "rb") as f:
            f.seek(self.offsets[number])
            row = json.loads(f.readline())
        if not isinstance(row, dict):
            raise ValueError(f"line {number + 1} of {self.path.name} is not a JSON object")
        return row

    def rows(self, numbers: Iterable[int]) -> Iterator[tuple[int, dict[str, Any] | None]]:
        """Lines by number through one open file, parsed; a line that is not a JSON object comes back as None."""
        with open(self.path, "rb") as f:
            for number in numbers:
                f.seek(self.offsets[number])
                try:
                    row = json.loads(f.readline())
                except ValueError:
                    row = None
                yield number, row if isinstance(row, dict) else None
