"""`zerobubble score`: one completion from flags/stdin, or a JSONL file, as JSON lines or a table."""

from __future__ import annotations

import json
import sys

import grpc
from rich.console import Console
from rich.table import Table

from zerobubble.common.clients.reward import score_request
from zerobubble.reward.local import reward_client

_FIELDS = ("reward", "format_ok", "answer_ok", "extracted_answer", "reason")


def _read_rows(args) -> list[dict]:
    if args.file is None:
        response = args.response if args.response is not None else sys.stdin.read()
        row = {"verifier": args.verifier, "response": response, "prompt": args.prompt}
        if args.gt is not None:
            row["gt_answer"] = args.gt
        if args.tests is not None:
            row["test_cases"] = json.loads(args.tests.read_text())
        return [row]
    rows = []
    for number, line in enumerate(args.file.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SystemExit(f"zerobubble score: {args.file} line {number}: not JSON ({exc})") from None
        if not isinstance(row, dict) or "response" not in row:
            raise SystemExit(f"zerobubble score: {args.file} line {number}: expected an object with 'response'")
        if not isinstance(row.get("metadata", {}), dict):
            raise SystemExit(f"zerobubble score: {args.file} line {number}: metadata: expected an object")
        rows.append(row)
    return rows


def _request(row: dict, index: int, partial_credit: bool):
    return score_request(
        row.get("verifier", "boxed"), row["response"], row.get("gt_answer"), row.get("test_cases"),
        id=str(index), partial_credit=partial_credit, prompt=row.get("prompt", ""), metadata=row.get("metadata"),
    )


def as_dict(result) -> dict:
    out = {name: getattr(result, name) for name in _FIELDS}
    out["reward"] = round(out["reward"], 6)
    if result.tests_total:
        out.update(tests_passed=result.tests_passed, tests_total=result.tests_total)
    return out


def _flat(text: str, limit: int) -> str:
    return " ".join(text.split())[:limit]


def print_table(rows: list[dict], results: list[dict], title: str, notes: list[str] | None = None) -> None:
    """Rows as given, results as _as_dict makes them; `notes` adds a first column describing each row."""
    table = Table(title=title)
    columns = ["case"] if notes else ["#"]
    for column in [*columns, "verifier", "response", "reward", "format", "answer", "extracted", "reason"]:
        table.add_column(column, overflow="fold", max_width=40 if column in ("response", "extracted") else None)
    for index, (row, result) in enumerate(zip(rows, results, strict=True)):
        table.add_row(
            notes[index] if notes else str(index), row.get("verifier", "boxed"), _flat(row["response"], 80),
            f"{result['reward']:g}", "yes" if result["format_ok"] else "no", "yes" if result["answer_ok"] else "no",
            _flat(result["extracted_answer"], 60), result["reason"],
        )
    Console().print(table)


def run_score(args) -> int:
    rows = _read_rows(args)
    requests = [_request(row, index, args.partial_credit) for index, row in enumerate(rows)]
    try:
        with reward_client(args.server, args.config, timeout=args.timeout) as client:
            by_id = {r.id: r for r in client.score_stream(requests, timeout=args.timeout)}
    except grpc.RpcError as exc:
        print(f"zerobubble score: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 2
    results = [as_dict(by_id[str(index)]) for index in range(len(rows))]
    if args.json:
        for result in results:
            print(json.dumps(result))
    else:
        print_table(rows, results, title=f"{len(rows)} scored")
    return 0
