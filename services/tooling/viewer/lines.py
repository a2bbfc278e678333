"""The run's JSONL files as the viewer reads them, one bounded line at a time: a line longer than the viewer's
limit or nested deeper than its limit is skipped with a note (never read whole, never parsed), and a growing file
is read on from where the last look stopped. `LineIndex` reads a file by line number without loading it: the byte
offset, length and training step of each complete line, indexed in memory as the run writes."""

from __future__ import annotations

import json
import re
import threading
from array import array
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

# Small reads: the index grows by a few bytes a line, and its scan holds no more than a chunk.
CHUNK_BYTES = 1 << 20
MAX_LINE_BYTES = 32 << 20
MAX_DEPTH = 64
# The trainer writes each row with its step first; a row that does not is indexed with step -1.
_STEP = re.compile(rb'\{"step": (\d+)')
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_OPENING = np.frombuffer(b"[{", np.uint8)


class BadLine(ValueError):
    """A line the viewer does not parse: too long, too deep, not JSON or not an object."""


def depth(line: bytes) -> int:
    """How deep the line's arrays and objects nest, counted without parsing it (brackets inside strings aside)."""
    brackets = np.frombuffer(_STRING.sub(b"", line).translate(None, _NOT_BRACKETS), np.uint8)
    if not brackets.size:
        return 0
    return int(np.cumsum(np.where(np.isin(brackets, _OPENING), 1, -1)).max())


def parse_row(line: bytes, max_depth: int = MAX_DEPTH) -> dict[str, Any]:
    """One JSONL line as a row; BadLine saying why not."""
    if (nesting := depth(line)) > max_depth:
        raise BadLine(f"nested {nesting} deep, over the viewer's {max_depth}")
    try:
        row = json.loads(line)
    except ValueError:
        raise BadLine("not JSON") from None
    if not isinstance(row, dict):
        raise BadLine("not a JSON object")
    return row


def too_long(length: int, max_line_bytes: int) -> str:
    return f"{length} bytes, over the viewer's line limit of {max_line_bytes}"


class LineIndex:
    def __init__(self, locate: Callable[[], Path], max_line_bytes: int = MAX_LINE_BYTES):
        self.locate = locate            # the file, checked anew at each look (it may be replaced by a link)
        self.max_line_bytes = max_line_bytes
        self.offsets = array("q")   # where each complete line starts
        self.lengths = array("q")   # its length, newline excluded
        self.steps = array("q")     # the step each line starts with
        self.end = 0                # just past the last complete line indexed
        self.scanned = 0            # how far past `end` the unfinished last line was looked through
        self.lock = threading.Lock()

    def refresh(self) -> int:
        """Indexes the lines completed since the last call, reading only what was written since; the number of
        lines."""
        with self.lock:
            try:
                f = open(self.locate(), "rb")
            except FileNotFoundError:
                return 0
            with f:
                size = f.seek(0, 2)
                if size < max(self.end, self.scanned):  # the file was replaced (a run started over in the folder)
                    self.offsets, self.lengths, self.steps = array("q"), array("q"), array("q")
                    self.end = self.scanned = 0
                position = max(self.end, self.scanned)
                f.seek(position)
                while chunk := f.read(CHUNK_BYTES):
                    start = 0
                    while (newline := chunk.find(b"\n", start)) >= 0:
                        self._add(f, self.end, position + newline - self.end, chunk, position)
                        self.end = position + newline + 1
                        start = newline + 1
                    position += len(chunk)
                self.scanned = position
            return len(self.offsets)

    def _add(self, f, offset: int, length: int, chunk: bytes, chunk_at: int) -> None:
        if length == 0:  # blank lines are not rows
            return
        head = chunk[offset - chunk_at: offset - chunk_at + 40] if offset >= chunk_at else b""
        if len(head) < min(40, length):  # the line began in an earlier chunk
            here = f.tell()
            f.seek(offset)
            head = f.read(min(40, length))
            f.seek(here)
        match = _STEP.match(head)
        self.offsets.append(offset)
        self.lengths.append(length)
        self.steps.append(int(match.group(1)) if match else -1)

    def __len__(self) -> int:
        return len(self.offsets)

    def _row(self, f, number: int) -> dict[str, Any]:
        if self.lengths[number] > self.max_line_bytes:
            raise BadLine(too_long(self.lengths[number], self.max_line_bytes))
        f.seek(self.offsets[number])
        return parse_row(f.read(self.lengths[number]))

    def read(self, number: int) -> dict[str, Any]:
        """Line `number` (from 0), parsed; BadLine (a ValueError) naming the line when it is not read."""
        with open(self.locate(), "rb") as f:
            try:
                return self._row(f, number)
            except BadLine as exc:
                raise BadLine(f"line {number + 1} of {self.locate().name}: {exc}") from None

    def rows(self, numbers: Iterable[int]) -> Iterator[tuple[int, dict[str, Any] | BadLine]]:
        """Lines by number through one open file, parsed; a line that is not read comes back as its BadLine."""
        with open(self.locate(), "rb") as f:
            for number in numbers:
                try:
                    yield number, self._row(f, number)
                except BadLine as exc:
                    yield number, exc
