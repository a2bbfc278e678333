"""`zerobubble view` over real HTTP on a run folder written here: malformed queries and paths outside the run folder
refused with a 4xx naming the field and nothing of what lies outside; the rollout log filtered and paged by line,
followed as it grows, and a million logged samples paged through without the log in memory."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from viewer_helpers import get_json, raw_get, viewer, viewer_pid

from zerobubble.tooling.viewer.run import METRICS, RunFolder

SECRET = "not-for-the-viewer-5f1c"
SOURCES = ("gsm8k", "math")


def group_row(step: int, index: int, generations: int = 4) -> dict:
    """A rollout-log row as the trainer writes it; rewards, versions, lengths and finish reasons vary by step and
    index so that each filter keeps a known set."""
    cut = "FINISH_REASON_LENGTH"
    responses = [{"text": f"answer {k}", "reward": float((step + index) % 3 == 0 and k < 2), "answer_ok": False,
                  "format_ok": True, "policy_version": max(step - 1 - k % 2, 0),
                  "finish_reason": cut if k == generations - 1 and step % 2 else "FINISH_REASON_STOP",
                  "length": 4 + k + step % 5, "advantage": 0.0, "token_ids": [1, 2], "logprobs": [-0.1, -0.2]}
                 for k in range(generations)]
    return {"step": step, "trained_policy_version": step, "prompt_id": f"p{step}-{index}", "epoch": 0,
            "data_source": SOURCES[index % 2], "messages": [{"role": "user", "content": f"{step}+{index}="}],
            "gt_answer": str(step + index), "responses": responses}


def write_run(run_dir: Path, steps: int, groups: int) -> list[dict]:
    rows = [group_row(step, i) for step in range(1, steps + 1) for i in range(groups)]
    (run_dir / "trainer").mkdir(parents=True)
    (run_dir / "trainer" / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "trainer" / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "policy_version": s, "reward_mean": 0.1 * s, "groups": ["a@0"]}) + "\n"
        for s in range(1, steps + 1)))
    for version in (0, 4):
        folder = run_dir / "eval" / "heldout"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"version-{version:06d}.jsonl").write_text("".join(
            json.dumps({"prompt_id": str(q), "sample": k, "text": f"v{version} q{q} s{k}", "reward": float(k == 0),
                        "answer_ok": k == 0, "finish_reason": "stop", "data_source": None}
                       | ({"question": f"{q}+{q}=", "gt_answer": str(2 * q)} if k == 0 else {})) + "\n"
            for q in range(3) for k in range(2)))
    (run_dir / "eval" / "summary.jsonl").write_text("".join(
        json.dumps({"version": v, "dataset": "heldout", "prompts": 3, "n": 2, "pass@1": 0.5}) + "\n" for v in (0, 4)))
    return rows


def make_run(tmp_path: Path) -> tuple[Path, list[dict]]:
    """A run folder, a secret file beside it, and links inside it that lead to the secret's folder."""
    outside = tmp_path / "outside"
    (outside / "leak").mkdir(parents=True)
    (outside / "leak" / "version-000000.jsonl").write_text(json.dumps({"prompt_id": SECRET}) + "\n")
    (outside / "secret.txt").write_text(SECRET)
    run_dir = tmp_path / "run"
    rows = write_run(run_dir, steps=6, groups=4)
    (run_dir / "eval" / "leak").symlink_to(outside / "leak")
    (run_dir / "trainer" / "outside").symlink_to(outside)
    return run_dir, rows


@pytest.fixture
def run(tmp_path):
    run_dir, rows = make_run(tmp_path)
    with viewer(run_dir) as base:
        yield base, run_dir, rows


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """One viewer for the tests that only read."""
    run_dir, rows = make_run(tmp_path_factory.mktemp("served"))
    with viewer(run_dir) as base:
        yield base, run_dir, rows


def lines_of(base: str, query: str) -> list[int]:
    """Every matching line, following the pages' cursors."""
    found, cursor = [], 0
    while cursor is not None:
        status, page = get_json(base, f"/api/rollouts?{query}&limit=3&cursor={cursor}")
        assert status == 200, page
        assert len(page["groups"]) <= 3
        found += [g["line"] for g in page["groups"]]
        cursor = page["next"]
    return found


def test_paths_outside_the_run_folder_are_refused_and_show_nothing_of_it(served):
    base, _, _ = served
    for target in ["/static/../../outside/secret.txt", "/static/..%2f..%2foutside%2fsecret.txt",
                   "/static/%2e%2e/%2e%2e/etc/passwd", "/../../etc/passwd", "/etc/passwd", "//etc/passwd",
                   "/trainer/rollouts.jsonl", "/trainer/outside/secret.txt", "/static/viewer.js/../../secret.txt",
                   "/static/", "/static/index.html%00.js", "/api/eval-pair?dataset=../outside&a=0&b=0",
                   "/api/eval-pair?dataset=leak&a=0&b=0", "/api/eval-pair?dataset=%2e%2e&a=0&b=0",
                   "/api/eval-pair?dataset=heldout/../../outside&a=0&b=0"]:
        status, body = raw_get(base, target)
        assert 400 <= status < 500, (target, status)
        assert SECRET.encode() not in body and b"root:" not in body, target
        assert json.loads(body)["error"]["message"], target
    # The link inside the run folder names a data set that the run does not have as far as the viewer goes.
    status, body = get_json(base, "/api/eval-pair?dataset=leak&a=0&b=0")
    assert status == 404 and body["error"]["field"] == "dataset"
    assert get_json(base, "/api/evals")[1]["answers"] == {"heldout": [0, 4]}
    status, _ = raw_get(base, "/api/group?line=0", method="POST")
    assert status == 405


@pytest.mark.parametrize(("target", "field"), [
    ("/api/rollouts?limit=x", "limit"), ("/api/rollouts?limit=0", "limit"), ("/api/rollouts?limit=100000", "limit"),
    ("/api/rollouts?cursor=-1", "cursor"), ("/api/rollouts?step_min=1.5", "step_min"),
    ("/api/rollouts?reward_min=nan", "reward_min"), ("/api/rollouts?reward_max=inf", "reward_max"),
    ("/api/rollouts?finish=exploded", "finish"), ("/api/rollouts?bogus=1", "bogus"),
    ("/api/rollouts?limit=1&limit=2", "limit"), ("/api/rollouts?source=" + "x" * 300, "source"),
    ("/api/rollouts?version=%ff%fe", "version"), ("/api/group", "line"), ("/api/group?line=", "line"),
    ("/api/group?line=24", "line"), ("/api/group?line=99999999999999999999999", "line"),
    ("/api/metrics?since=-5", "since"), ("/api/eval-pair?dataset=heldout&a=0", "b"),
    ("/api/eval-pair?dataset=heldout&a=0&b=3", "b"), ("/api/eval-pair?dataset=&a=0&b=0", "dataset"),
])
def test_a_malformed_query_gets_a_4xx_naming_the_field(served, target, field):
    status, body = get_json(served[0], target)
    assert 400 <= status < 500, (status, body)
    assert body["error"]["field"] == field, body


def test_the_rollout_log_is_filtered_and_paged_by_line(served):
    base, _, rows = served
    every = list(range(len(rows)))
    assert lines_of(base, "") == every

    def expected(group=lambda r: True, response=lambda r: True):
        return [n for n, row in enumerate(rows) if group(row) and any(response(x) for x in row["responses"])]

    assert lines_of(base, "step_min=3&step_max=4") == expected(lambda r: 3 <= r["step"] <= 4)
    assert lines_of(base, "source=math") == expected(lambda r: r["data_source"] == "math")
    assert lines_of(base, "reward_min=0.5") == expected(response=lambda x: x["reward"] >= 0.5)
    assert lines_of(base, "finish=length") == expected(response=lambda x: x["finish_reason"].endswith("LENGTH"))
    assert lines_of(base, "version=3&length_min=9") == expected(
        response=lambda x: x["policy_version"] == 3 and x["length"] >= 9)
    assert lines_of(base, "length_max=5&step_min=5") == expected(
        lambda r: r["step"] >= 5, lambda x: x["length"] <= 5)
    assert 0 < len(expected(response=lambda x: x["reward"] >= 0.5)) < len(rows)

    status, group = get_json(base, "/api/group?line=5")
    assert status == 200 and {**group, "line": None} == {**rows[5], "line": None} and group["line"] == 5
    status, page = get_json(base, "/api/rollouts?limit=1")
    assert "token_ids" not in page["groups"][0]["responses"][0], "a page carries no tokens"


def test_the_viewer_follows_a_run_that_is_still_writing(run):
    base, run_dir, rows = run
    log = run_dir / "trainer" / "rollouts.jsonl"
    with open(log, "a") as out:
        out.write(json.dumps(group_row(7, 0)) + "\n" + json.dumps(group_row(7, 1))[:40])  # the second mid-write
        out.flush()
        assert get_json(base, "/api/rollouts?step_min=7")[1]["total"] == len(rows) + 1
        assert lines_of(base, "step_min=7") == [len(rows)]
        out.write(json.dumps(group_row(7, 1))[40:] + "\n")
    assert lines_of(base, "step_min=7") == [len(rows), len(rows) + 1]

    status, metrics = get_json(base, "/api/metrics?since=0")
    assert [r["step"] for r in metrics["rows"]] == list(range(1, 7)) and "groups" not in metrics["rows"][0]
    with open(run_dir / "trainer" / "metrics.jsonl", "a") as out:
        # A diverged step: Python's json writes NaN and Infinity, which browsers' JSON does not read.
        out.write(json.dumps({"step": 7, "policy_version": 7, "loss": float("nan"), "kl": float("inf")})
                  + "\n{\"step\": 8")
    status, more = get_json(base, f"/api/metrics?since={metrics['next']}")
    assert [r["step"] for r in more["rows"]] == [7] and more["rows"][0]["loss"] is None is more["rows"][0]["kl"]
    assert more["more"] is False

    status, pair = get_json(base, "/api/eval-pair?dataset=heldout&a=0&b=4")
    assert status == 200 and [q["prompt_id"] for q in pair["questions"]] == ["0", "1", "2"]
    assert [x["text"] for x in pair["questions"][1]["a"]] == ["v0 q1 s0", "v0 q1 s1"]
    assert [x["text"] for x in pair["questions"][1]["b"]] == ["v4 q1 s0", "v4 q1 s1"]
    assert (pair["questions"][2]["question"], pair["questions"][2]["gt_answer"]) == ("2+2=", "4")


def test_a_large_file_is_followed_in_pieces_each_row_once(tmp_path):
    run_dir = tmp_path / "run"
    write_run(run_dir, steps=300, groups=1)
    path = run_dir / "trainer" / "metrics.jsonl"
    folder, rows, since, answers = RunFolder(run_dir), [], 0, 0
    while True:
        answer = folder.follow(METRICS, since, limit=1000)
        rows += answer["rows"]
        since, answers = answer["next"], answers + 1
        if not answer["more"]:
            break
    assert [r["step"] for r in rows] == list(range(1, 301)) and since == path.stat().st_size
    assert answers >= path.stat().st_size // 1000
    # A file that started over (a run begun again in the folder) is read again from its start.
    path.write_text(json.dumps({"step": 1}) + "\n")
    again = folder.follow(METRICS, since)
    assert again["reset"] and [r["step"] for r in again["rows"]] == [1]


def _rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1])


@pytest.mark.slow
def test_a_million_logged_samples_are_paged_through_without_loading_the_log(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "trainer").mkdir(parents=True)
    log = run_dir / "trainer" / "rollouts.jsonl"
    steps, per_step = 15_625, 8   # 125,000 groups of 8: a million samples
    rng = random.Random(0)
    with open(log, "w") as out:
        for step in range(1, steps + 1):
            out.writelines(json.dumps(group_row(step, i, generations=8) | {"pad": "x" * rng.randrange(200)}) + "\n"
                           for i in range(per_step))
    size = log.stat().st_size
    with viewer(run_dir) as base:
        pid = viewer_pid(run_dir)
        get_json(base, "/api/metrics")
        before = _rss_kib(pid)
        status, last = get_json(base, f"/api/rollouts?step_min={steps}&limit=200")
        assert status == 200 and last["total"] == steps * per_step
        assert [g["line"] for g in last["groups"]] == list(range((steps - 1) * per_step, steps * per_step))
        assert last["next"] is None and last["scanned"] == per_step, "the step filter read only its own lines"
        # A filter that matches nothing answers with a cursor after a bounded scan, not after the whole log.
        status, none = get_json(base, "/api/rollouts?source=nowhere")
        assert status == 200 and none["groups"] == [] and none["next"] == none["scanned"] < steps * per_step
        status, group = get_json(base, f"/api/group?line={steps * per_step - 1}")
        assert group["prompt_id"] == f"p{steps}-{per_step - 1}"
        grown = _rss_kib(pid) - before
    assert grown * 1024 < size / 8, f"the viewer grew by {grown} KiB for a {size >> 20} MiB log"


def test_a_rollout_log_linked_out_of_the_run_folder_is_refused(tmp_path):
    run_dir, _ = make_run(tmp_path)
    log = run_dir / "trainer" / "rollouts.jsonl"
    secret_log = tmp_path / "outside" / "rollouts.jsonl"
    secret_log.write_text(json.dumps(group_row(1, 0) | {"prompt_id": SECRET}) + "\n")
    log.unlink()
    log.symlink_to(secret_log)
    with viewer(run_dir) as base:
        for target in ("/api/rollouts", "/api/group?line=0"):
            status, body = raw_get(base, target)
            assert status == 404 and SECRET.encode() not in body, (target, body[:300])
            assert b"leads outside the run folder" in body


def test_a_host_that_is_not_the_viewers_is_refused(served):
    """A DNS-rebinding page asks with its own name as Host; the viewer answers only its own names."""
    base = served[0]
    port = base.rsplit(":", 1)[1]
    for host in (f"rebind.evil.example:{port}", "evil.example", f"127.0.0.1.evil.example:{port}"):
        for target in ("/", "/api/metrics", "/api/rollouts"):
            status, body = get_json(base, target, host=host) if target != "/" else (raw_get(base, target,
                                                                                            host=host)[0], {})
            assert status == 403, (host, target, status)
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "localhost"):
        assert get_json(base, "/api/metrics", host=host)[0] == 200


def test_a_line_nested_too_deep_or_too_long_is_skipped_with_a_note_and_the_rest_is_served(tmp_path):
    run_dir = tmp_path / "run"
    rows = write_run(run_dir, steps=3, groups=2)
    limit = 1 << 20
    with open(run_dir / "trainer" / "metrics.jsonl", "a") as out:
        out.write('{"step": 4, "deep": ' + "[" * 5000 + "]" * 5000 + "}\n")
        out.write(json.dumps({"step": 5, "policy_version": 5}) + "\n")
    with open(run_dir / "trainer" / "rollouts.jsonl", "a") as out:
        out.write(json.dumps(group_row(4, 0) | {"pad": "x" * (3 * limit)}) + "\n")
        out.write('{"step": 4, "deep": ' + "[" * 100 + "]" * 100 + "}\n")  # deeper than the viewer reads
        out.write(json.dumps(group_row(4, 1)) + "\n")
    with viewer(run_dir, "--max-line-bytes", str(limit)) as base:
        status, metrics = get_json(base, "/api/metrics")
        assert status == 200 and [r["step"] for r in metrics["rows"]] == [1, 2, 3, 5], metrics
        assert len(metrics["skipped"]) == 1 and "5001 deep" in metrics["skipped"][0]["reason"]
        status, page = get_json(base, "/api/rollouts?step_min=4")
        assert status == 200 and [g["line"] for g in page["groups"]] == [len(rows) + 2], page
        assert [note["line"] for note in page["skipped"]] == [len(rows), len(rows) + 1]
        assert "line limit" in page["skipped"][0]["reason"] and "deep" in page["skipped"][1]["reason"]
        status, refused = get_json(base, f"/api/group?line={len(rows)}")
        assert status == 422 and f"line {len(rows) + 1}" in refused["error"]["message"], refused


def _read_bytes(pid: int) -> int:
    return int(next(line for line in Path(f"/proc/{pid}/io").read_text().splitlines()
                    if line.startswith("rchar:")).split()[1])


def test_a_growing_last_line_over_the_limit_is_read_once_not_at_every_poll(tmp_path):
    run_dir = tmp_path / "run"
    write_run(run_dir, steps=2, groups=1)
    limit, line = 1 << 20, 24 << 20
    metrics = run_dir / "trainer" / "metrics.jsonl"
    with open(metrics, "a") as out:
        out.write('{"step": 3, "pad": "' + "x" * line)  # still being written
        out.flush()
        with viewer(run_dir, "--max-line-bytes", str(limit)) as base:
            pid = viewer_pid(run_dir)
            since, polls = 0, []
            for _ in range(4):
                before = _read_bytes(pid)
                status, answer = get_json(base, f"/api/metrics?since={since}")
                assert status == 200, answer
                polls.append(_read_bytes(pid) - before)
                since = answer["next"]
            assert polls[-1] < line // 8 and polls[-2] < line // 8, polls
            out.write('"}\n' + json.dumps({"step": 4, "policy_version": 4}) + "\n")
            out.flush()
            status, answer = get_json(base, f"/api/metrics?since={since}")
            assert [r["step"] for r in answer["rows"]] == [4] and "line limit" in answer["skipped"][0]["reason"]
