"""`zerobubble view` under the fuzz, at its default limits: a run folder whose files hold the lines that broke it (a
metrics row nested 5,000 deep, a 200 MB rollout line, a 300 MB last metrics line still being written) and requests
that come from elsewhere (a foreign Host or Origin). Each is answered below 500 and at once, skipped lines with a
note, the rest of each file served, and the growing line read once, not at every poll."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ANSWER_WITHIN_S = 10.0
MB = 1 << 20


def _rows(steps) -> str:
    return "".join(json.dumps({"step": s, "policy_version": s, "reward_mean": 0.5}) + "\n" for s in steps)


def _group(step: int, pad: int = 0) -> str:
    return json.dumps({"step": step, "prompt_id": f"p{step}", "messages": [{"role": "user", "content": "1+1="}],
                       "responses": [{"reward": 1.0, "length": 2}], "pad": "x" * pad}) + "\n"


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory):
    """(base URL, run folder, pid, the open file of the metrics line still being written)."""
    run_dir = tmp_path_factory.mktemp("hostile-view") / "run"
    (run_dir / "trainer").mkdir(parents=True)
    metrics = open(run_dir / "trainer" / "metrics.jsonl", "w")
    metrics.write(_rows([1]) + '{"step": 2, "deep": ' + "[" * 5000 + "]" * 5000 + "}\n" + _rows([3]))
    metrics.write('{"step": 4, "pad": "' + "x" * (300 * MB))
    metrics.flush()
    with open(run_dir / "trainer" / "rollouts.jsonl", "w") as log:
        log.write(_group(1) + _group(2, pad=200 * MB) + _group(3))
    process = subprocess.Popen([sys.executable, "-m", "zerobubble", "view", str(run_dir), "--port", "0"],
                               stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        yield json.loads(process.stdout.readline())["url"].rstrip("/"), run_dir, process.pid, metrics
    finally:
        metrics.close()
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _get(url: str, headers: dict | None = None) -> tuple[int, dict, float]:
    started = time.monotonic()
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=120) as reply:
            return reply.status, json.loads(reply.read()), time.monotonic() - started
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}"), time.monotonic() - started


def _rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1]) / 1024


def _read_mb(pid: int) -> float:
    io = Path(f"/proc/{pid}/io").read_text()
    return int(next(line for line in io.splitlines() if line.startswith("rchar:")).split()[1]) / MB


def test_a_row_nested_5000_deep_is_skipped_and_the_metrics_still_served(hostile_run):
    base, _, _, _ = hostile_run
    status, answer, took = _get(f"{base}/api/metrics")
    assert status == 200, answer
    assert [row["step"] for row in answer["rows"]] == [1, 3] and "deep" in answer["skipped"][0]["reason"]
    assert took < ANSWER_WITHIN_S


def test_a_200_mb_rollout_line_is_skipped_unread(hostile_run):
    base, _, pid, _ = hostile_run
    _get(f"{base}/api/rollouts")  # the index is built once
    before = _rss_mb(pid)
    for _ in range(3):
        status, page, took = _get(f"{base}/api/rollouts")
        assert status == 200 and [g["line"] for g in page["groups"]] == [0, 2], page
        assert page["skipped"][0]["line"] == 1 and "line limit" in page["skipped"][0]["reason"]
        assert took < ANSWER_WITHIN_S
        status, refused, _ = _get(f"{base}/api/group?line=1")
        assert status == 422 and "line 2" in refused["error"]["message"]
    assert _rss_mb(pid) - before < 64, f"the viewer grew by {_rss_mb(pid) - before:.0f} MB"


def test_a_growing_300_mb_last_line_is_read_once_not_at_every_poll(hostile_run):
    base, _, pid, metrics = hostile_run
    since, read = 0, []
    for _ in range(4):  # the page's polls
        before = _read_mb(pid)
        status, answer, took = _get(f"{base}/api/metrics?since={since}")
        assert status == 200 and took < ANSWER_WITHIN_S
        while answer["more"]:
            status, answer, _ = _get(f"{base}/api/metrics?since={answer['next']}")
        read.append(_read_mb(pid) - before)
        since = answer["next"]
    assert max(read[-2:]) < 16, f"MB read per poll: {read}"
    metrics.write('"}\n' + _rows([5]))
    metrics.flush()
    status, answer, _ = _get(f"{base}/api/metrics?since={since}")
    assert [row["step"] for row in answer["rows"]] == [5] and "line limit" in answer["skipped"][0]["reason"]


@pytest.mark.parametrize("headers", [{"Host": "rebind.evil.example"}, {"Host": "evil.example:8765"},
                                     {"Origin": "http://evil.example"}, {"Origin": "null"}])
def test_a_request_from_elsewhere_is_refused_with_403(hostile_run, headers):
    base, _, _, _ = hostile_run
    for path in ("/", "/api/metrics", "/api/rollouts?limit=1", "/static/viewer.js"):
        status, body, _ = _get(f"{base}{path}", headers)
        assert status == 403 and body["error"]["field"] in ("Host", "Origin"), (path, status, body)
