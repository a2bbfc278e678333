"""What the viewer reads of a run folder, and nothing else: the files `zerobubble up` writes there, found by fixed
names under the folder (a name from a request is checked against the evaluations the run has, never joined as a
path as given), and refused where a link leads out of the folder, the rollout log included. A line it cannot read
(too long, too deep, not a JSON object) is skipped with a note in the answer (`skipped`), never an error."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from zerobubble.tooling.viewer.lines import CHUNK_BYTES, MAX_LINE_BYTES, BadLine, LineIndex, parse_row, too_long
from zerobubble.tooling.viewer.query import EvalPairQuery, RolloutFilter

METRICS = Path("trainer") / "metrics.jsonl"
ROLLOUTS = Path("trainer") / "rollouts.jsonl"
EVAL_DIR = Path("eval")
EVAL_SUMMARY = EVAL_DIR / "summary.jsonl"
# What one answer carries of a JSONL file being followed; the page asks again while there is more.
FOLLOW_BYTES = 4 << 20
# An evaluation's answers at one version are read whole, up to this.
EVAL_FILE_BYTES = 64 << 20
_EVAL_FILE = re.compile(r"^version-(\d{6,})\.jsonl$")
# What one answer scans at most of a line too long to read, looking for its end (the page asks again for more).
SCAN_BYTES = 64 << 20
# Lines parsed for one page at most, matching or not: a filter that matches little answers with a cursor to go on
# from, not a scan of the whole log.
SCAN_LINES = 5_000
# What a page keeps of each response (the tokens are fetched with the group).
SUMMARY_KEYS = ("reward", "advantage", "answer_ok", "format_ok", "policy_version", "finish_reason", "length")


class NotInRun(LookupError):
    """What the request names is not in the run folder; `field` is the query parameter that named it."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.field = field


class RunFolder:
    def __init__(self, root: Path, max_line_bytes: int = MAX_LINE_BYTES):
        self.root = root.resolve()
        self.max_line_bytes = max_line_bytes
        self.rollouts = LineIndex(lambda: self.file(ROLLOUTS), max_line_bytes)
        # file -> (where a line too long to read starts, how far its end was looked for): the next look goes on
        # from there, so that a line still growing is never read again from its start.
        self._long: dict[Path, tuple[int, int]] = {}

    def file(self, relative: Path) -> Path:
        """`relative` inside the run folder, with every link resolved; NotInRun if it leads outside."""
        path = (self.root / relative).resolve()
        if not path.is_relative_to(self.root):
            raise NotInRun(f"{relative} leads outside the run folder")
        return path

    def follow(self, relative: Path, since: int, limit: int = FOLLOW_BYTES) -> dict[str, Any]:
        """The complete JSONL rows of a file from byte `since` on, up to about `limit` bytes of them; where the next
        read starts, whether there is more to read now, whether the file started over (read it all again), and the
        lines skipped (by byte offset, with why)."""
        reset, skipped = False, []
        try:
            f = open(self.file(relative), "rb")
        except FileNotFoundError:
            return {"rows": [], "next": 0, "more": False, "reset": since > 0, "skipped": []}
        with f:
            size = f.seek(0, 2)
            if size < since:  # the file started over: read it from the start
                since, reset = 0, True
            # A line longer than `limit` (known from an earlier look, or found now) is looked through for its end.
            looking = self._long.get(relative, (None, 0))[0] == since
            f.seek(since)
            data = b"" if looking else f.read(limit)
            if looking or data and b"\n" not in data and since + len(data) < size:
                end = self._line_end(f, relative, since, size)
                if end is None:  # its end is not written yet, or not found within this answer's scan
                    more = self._long[relative][1] < size
                    return {"rows": [], "next": since, "more": more, "reset": reset, "skipped": []}
                if end - since > self.max_line_bytes:
                    skipped.append({"at": since, "reason": too_long(end - since, self.max_line_bytes)})
                    since = end + 1
                    f.seek(since)
                    data = f.read(limit)  # the rows after it come in the same answer
                else:
                    f.seek(since)
                    data = f.read(end + 1 - since)
        complete = data[: data.rfind(b"\n") + 1]
        rows, at = [], since
        for line in complete.split(b"\n")[:-1]:
            try:
                if len(line) > self.max_line_bytes:
                    raise BadLine(too_long(len(line), self.max_line_bytes))
                if line.strip():
                    rows.append(parse_row(line))
            except BadLine as exc:
                skipped.append({"at": at, "reason": str(exc)})
            at += len(line) + 1
        following = since + len(complete)
        return {"rows": rows, "next": following, "more": size - following > len(data) - len(complete),
                "reset": reset, "skipped": skipped}

    def _line_end(self, f, relative: Path, start: int, size: int) -> int | None:
        """The offset of the newline ending the line at `start`, looked for from where the last look stopped, at
        most SCAN_BYTES further; None when not found yet."""
        begun, looked = self._long.get(relative, (None, 0))
        position = looked if begun == start and looked <= size else start
        f.seek(position)
        budget = SCAN_BYTES
        while budget > 0 and (chunk := f.read(min(CHUNK_BYTES, budget))):
            if (newline := chunk.find(b"\n")) >= 0:
                self._long.pop(relative, None)
                return position + newline
            position += len(chunk)
            budget -= len(chunk)
        self._long[relative] = (start, position)
        return None

    def metrics(self, since: int) -> dict[str, Any]:
        answer = self.follow(METRICS, since)
        # Which groups a step trained is long and not a figure.
        answer["rows"] = [{k: v for k, v in row.items() if k != "groups"} for row in answer["rows"]]
        return answer

    def evaluations(self, since: int) -> dict[str, Any]:
        answer = self.follow(EVAL_SUMMARY, since)
        answer["answers"] = self.eval_versions()
        return answer

    def eval_versions(self) -> dict[str, list[int]]:
        """Each evaluated data set and the policy versions whose answers it has."""
        found: dict[str, list[int]] = {}
        try:
            folders = sorted(p for p in self.file(EVAL_DIR).iterdir() if p.is_dir())
        except (FileNotFoundError, NotInRun):
            return found
        for folder in folders:
            if not folder.resolve().is_relative_to(self.root):  # a link out of the run folder
                continue
            versions = sorted(int(m.group(1)) for p in folder.iterdir() if (m := _EVAL_FILE.match(p.name)))
            if versions:
                found[folder.name] = versions
        return found

    def eval_pair(self, query: EvalPairQuery) -> dict[str, Any]:
        """Each question's answers at versions a and b, side by side, in the order of the data set."""
        versions = self.eval_versions()
        if query.dataset not in versions:
            raise NotInRun(f"no evaluation of a data set named {query.dataset!r} in this run", "dataset")
        sides = {}
        for side, version in (("a", query.a), ("b", query.b)):
            if version not in versions[query.dataset]:
                raise NotInRun(f"the run has no answers of {query.dataset} at policy version {version}", side)
            relative = EVAL_DIR / query.dataset / f"version-{version:06d}.jsonl"
            sides[side] = self.follow(relative, 0, limit=EVAL_FILE_BYTES)["rows"]
        questions: dict[str, dict[str, Any]] = {}
        for side, rows in sides.items():
            for row in rows:
                key = str(row.get("prompt_id"))
                entry = questions.setdefault(key, {"prompt_id": key, "data_source": row.get("data_source"),
                                                   "a": [], "b": []})
                entry[side].append(row)
                if "question" in row:
                    entry |= {"question": row["question"], "gt_answer": row.get("gt_answer")}
        return {"dataset": query.dataset, "a": query.a, "b": query.b,
                "questions": list(questions.values())[: query.limit], "total": len(questions)}

    def rollout_page(self, query: RolloutFilter) -> dict[str, Any]:
        """Up to `limit` matching groups from line `cursor` on, scanning at most SCAN_LINES lines; `next` is the
        line to go on from (null at the end of what is written so far)."""
        total = self.rollouts.refresh()
        steps = self.rollouts.steps
        candidates = (n for n in range(query.cursor, total) if _step_may_pass(steps[n], query))
        groups, skipped, scanned, stop = [], [], 0, None
        for number, row in self.rollouts.rows(candidates):
            scanned += 1
            if isinstance(row, BadLine):
                skipped.append({"line": number, "reason": str(row)})
            elif query.group_passes(row):
                groups.append(summary(number, row))
            if len(groups) == query.limit or scanned == SCAN_LINES:
                stop = number + 1 if number + 1 < total else None
                break
        return {"groups": groups, "total": total, "scanned": scanned, "next": stop, "skipped": skipped}

    def group(self, line: int) -> dict[str, Any]:
        total = self.rollouts.refresh()
        if line >= total:
            raise NotInRun(f"the rollout log has {total} groups, numbered from 0", "line")
        return {"line": line, **self.rollouts.read(line)}


def _step_may_pass(step: int, query: RolloutFilter) -> bool:
    """The index's step decides the step filters without reading the line (-1: unknown, read it)."""
    if step < 0:
        return True
    return not ((query.step_min is not None and step < query.step_min) or
                (query.step_max is not None and step > query.step_max))


def summary(line: int, row: dict[str, Any]) -> dict[str, Any]:
    messages = row.get("messages")
    prompt = ""
    if isinstance(messages, list):
        users = [m.get("content") for m in messages if isinstance(m, dict) and m.get("role") == "user"]
        prompt = str(users[-1]) if users else ""
    responses = [r for r in row.get("responses", []) if isinstance(r, dict)]
    return {"line": line, "step": row.get("step"), "prompt_id": row.get("prompt_id"), "prompt": prompt[:300],
            "data_source": row.get("data_source"), "gt_answer": row.get("gt_answer"),
            "responses": [{k: r.get(k) for k in SUMMARY_KEYS if k in r} for r in responses]}
