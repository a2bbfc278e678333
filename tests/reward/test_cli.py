"""The `zerobubble` command as a user runs it: score, serve (with SIGTERM), demo."""

import json
import os
import signal
import subprocess
import sys
import threading

from zerobubble.common.clients.reward import RewardClient
from zerobubble.common.config import ClientConfig

ZB = [sys.executable, "-m", "zerobubble"]
SMALL = ["--set", "math.workers=1", "--set", "sandbox.slots=1"]


def run(*args, stdin=None, timeout=120):
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([*ZB, *args], input=stdin, capture_output=True, text=True, timeout=timeout, env=env)


def test_score_one_from_stdin(reward_host):
    done = run("score", "--server", reward_host.address, "--verifier", "boxed", "--gt", "1/2", "--json",
               stdin="so \\boxed{0.5}")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result == {"reward": 1.0, "format_ok": True, "answer_ok": True, "extracted_answer": "0.5", "reason": ""}


def test_score_file_json_and_table(reward_host, tmp_path):
    rows = [
        {"verifier": "boxed", "response": "\\boxed{3}", "gt_answer": "3"},
        {"verifier": "think_answer_tags", "response": "<think>x</think><answer>4</answer>", "gt_answer": "5"},
        {"verifier": "code", "response": "```python\nprint(int(input()) * 2)\n```",
         "test_cases": {"inputs": ["2\n"], "outputs": ["4\n"]}},
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    done = run("score", "--file", str(path), "--json", "--server", reward_host.address)
    assert done.returncode == 0, done.stderr
    results = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["answer_ok"] for r in results] == [True, False, True]
    assert results[2]["tests_passed"] == 1
    table = run("score", "--file", str(path), "--server", reward_host.address)
    assert table.returncode == 0 and "think_answer_tags" in table.stdout and "3 scored" in table.stdout


def test_score_without_server_starts_one(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"verifier": "boxed", "response": "\\boxed{2}", "gt_answer": "2"}))
    done = run("score", "--file", str(path), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["answer_ok"] is True


def test_score_bad_input_is_explained(reward_host, tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"verifier": "boxed", "response": "x", "gt_answer": "1"}\nnot json\n')
    done = run("score", "--file", str(path), "--server", reward_host.address)
    assert done.returncode != 0 and "line 2: not JSON" in done.stderr
    path.write_text(json.dumps({"verifier": "nope", "response": "x", "gt_answer": "1"}))
    done = run("score", "--file", str(path), "--server", reward_host.address)
    assert done.returncode == 2 and "INVALID_ARGUMENT" in done.stderr and "unknown verifier 'nope'" in done.stderr


def test_serve_reports_config_errors_by_field():
    done = run("serve", "reward", "--set", "math.workers=0")
    assert done.returncode == 2 and "math.workers" in done.stderr


def test_serve_finishes_in_flight_calls_on_sigterm():
    proc = subprocess.Popen([*ZB, "serve", "reward", "--listen", "127.0.0.1:0", *SMALL],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        address = json.loads(line)["address"]
        outcome = {}
        slow = "```python\nimport time\ntime.sleep(1.5)\nprint('done')\n```"

        def call():
            with RewardClient(ClientConfig(address=address, timeout_seconds=30)) as client:
                outcome["result"] = client.score("code", slow, test_cases={"inputs": [""], "outputs": ["done"]})

        caller = threading.Thread(target=call)
        caller.start()
        # The call is in flight once the sandbox has started the program.
        with RewardClient(address) as probe:
            probe.list_verifiers()
        threading.Event().wait(0.7)
        os.kill(proc.pid, signal.SIGTERM)
        caller.join(30)
        assert outcome["result"].answer_ok
        assert proc.wait(30) == 0
    finally:
        proc.kill()


def test_demo_prints_a_table():
    done = run("demo", timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    for verifier in ("boxed", "think_answer_tags", "code"):
        assert verifier in done.stdout
