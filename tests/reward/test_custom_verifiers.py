"""Custom verifiers and combinations in a real reward service: imported in its worker processes from a folder made
here, called over gRPC, HTTP and `zerobubble score`, and hostile ones answered with a reason while the service
goes on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import urllib.request

import grpc
import pytest
from reward_helpers import start_reward

from zerobubble.common.clients.reward import RewardClient, score_request
from zerobubble.common.config import ClientConfig, ConfigError, load_config
from zerobubble.reward.config import RewardServiceConfig

VERIFIERS = textwrap.dedent('''
    import os, sys, time

    def exact(response, gt, metadata):
        ok = response.strip() == gt
        return {"reward": 2.0 if ok else -1.0, "answer_ok": ok, "format_ok": bool(response.strip()),
                "extracted_answer": response.strip()}

    def length(response, gt, metadata):
        return float(len(response))

    def by_source(response, gt, metadata):
        return {"reward": 1.0, "answer_ok": metadata.get("data_source") == "puzzles",
                "extracted_answer": json.dumps(metadata, sort_keys=True)}

    def count_tests(response, gt, metadata):
        return {"reward": float(len(gt["inputs"])), "answer_ok": response in gt["outputs"]}

    def no_truth(response, gt, metadata):
        return 0.25 if gt is None else 99.0

    def hang(response, gt, metadata):
        while True:
            time.sleep(1)

    def raises(response, gt, metadata):
        raise ValueError("boom")

    def text(response, gt, metadata):
        return "yes"

    def nan(response, gt, metadata):
        return float("nan")

    def huge(response, gt, metadata):
        return {str(i): i for i in range(200_000)}

    def long_answer(response, gt, metadata):
        return {"reward": 1.0, "extracted_answer": "x" * 100_000}

    def exits(response, gt, metadata):
        sys.exit(3)

    def dies(response, gt, metadata):
        os._exit(1)

    import json
    not_callable = 3
''')

HOSTILE = {
    "hang": "timeout",
    "raises": "verifier_error: ValueError: boom",
    "text": "bad_result: expected a finite number or a dict with 'reward', got a str",
    "nan": "bad_result: expected a finite number or a dict with 'reward', got not finite",
    "huge": "bad_result: unknown keys ['0', '1', '2'] and more (expected reward, answer_ok, format_ok, "
            "extracted_answer)",
    "long_answer": "bad_result: 'extracted_answer' has 100000 bytes, over limits.max_answer_bytes=16384",
    "exits": "verifier_error: SystemExit: 3",
    "dies": "worker_crash",
}


def _custom(name, ground_truth="gt_answer", function=None):
    return {"name": name, "function": f"my_verifiers:{function or name}", "ground_truth": ground_truth}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("verifiers")
    (path / "my_verifiers.py").write_text(VERIFIERS)
    return path


def _settings(folder):
    customs = [_custom("exact"), _custom("length", "none"), _custom("by_source", "none"),
               _custom("count_tests", "test_cases"), _custom("no_truth", "none"),
               *(_custom(name, "none") for name in HOSTILE)]
    for entry in customs:
        entry["path"] = str(folder)
    combined = [{"name": "boxed_and_exact", "parts": [{"verifier": "boxed", "weight": 1.0},
                                                      {"verifier": "exact", "weight": 0.5}]}]
    return {"custom_verifiers": customs, "combined_verifiers": combined, "math.timeout_seconds": 2.0,
            "http.listen": "127.0.0.1:0"}


@pytest.fixture(scope="module")
def service(folder):
    app = start_reward(**_settings(folder))
    yield app
    app.stop(grace=1.0)


@pytest.fixture(scope="module")
def client(service):
    with RewardClient(ClientConfig(address=service.address, timeout_seconds=60)) as client:
        yield client


def test_listed_with_their_ground_truth(client):
    listed = {v.name: v for v in client.list_verifiers().verifiers}
    assert listed["exact"].ground_truth == "gt_answer" and listed["exact"].available
    assert listed["exact"].description == "custom: my_verifiers:exact"
    assert listed["count_tests"].ground_truth == "test_cases"
    assert listed["length"].ground_truth == "none"
    assert listed["boxed_and_exact"].ground_truth == "gt_answer"
    assert listed["boxed_and_exact"].description == "weighted sum: 1 x boxed + 0.5 x exact"


def test_dict_result_is_taken_as_given(client):
    right = client.score("exact", " 42 ", "42")
    assert (right.reward, right.answer_ok, right.format_ok, right.extracted_answer, right.reason) == (
        2.0, True, True, "42", "")
    wrong = client.score("exact", "41", "42")
    assert (wrong.reward, wrong.answer_ok) == (-1.0, False)


def test_number_result_is_the_reward_and_answer_ok_from_rewards_correct(client):
    short = client.score("length", "abc")
    assert (short.reward, short.answer_ok, short.format_ok) == (3.0, True, True)
    assert client.score("length", "").answer_ok is False


def test_ground_truth_and_metadata_reach_the_callable(client):
    tests = client.score("count_tests", "4", test_cases={"inputs": ["1", "2"], "outputs": ["3", "4"]})
    assert (tests.reward, tests.answer_ok) == (2.0, True)
    assert client.score("no_truth", "x").reward == 0.25
    routed = client.score("by_source", "x", metadata={"data_source": "puzzles", "level": 3})
    assert routed.answer_ok
    assert json.loads(routed.extracted_answer) == {"data_source": "puzzles", "level": 3}
    assert not client.score("by_source", "x").answer_ok


def test_missing_ground_truth_is_refused_by_name(client):
    with pytest.raises(grpc.RpcError) as caught:
        client.score("count_tests", "4")
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "test_cases" in caught.value.details()


def test_metadata_json_cannot_hold_is_refused_by_name(client):
    # A Struct carries any double, but NaN has no JSON form for the callable to receive.
    good = score_request("exact", "7", "7", metadata={"level": 1.0})
    bad = score_request("exact", "7", "7")
    bad.metadata.update({"level": float("nan")})
    with pytest.raises(grpc.RpcError) as caught:
        client.score_batch([good, bad])
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details().startswith("items[1].metadata:")
    assert client.score_batch([good])[0].answer_ok


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_callable_gets_a_reason_and_the_service_goes_on(client, name):
    result = client.score(name, "anything")
    assert result.reason == HOSTILE[name]
    assert (result.reward, result.answer_ok) == (0.0, False)
    assert client.score("exact", "7", "7").answer_ok


def test_hostile_items_in_one_batch_do_not_spoil_the_others(client, service):
    replaced = service.pool.replaced
    requests = [score_request(name, "x", id=name) for name in HOSTILE]
    requests += [score_request("exact", "5", "5", id="good"), score_request("boxed", "\\boxed{5}", "5", id="math")]
    results = {r.id: r for r in client.score_batch(requests)}
    assert {name: results[name].reason for name in HOSTILE} == HOSTILE
    assert results["good"].answer_ok and results["math"].answer_ok
    # The hang and os._exit cost their workers; sys.exit is caught like any exception.
    assert service.pool.replaced - replaced == 2


def test_combination_is_the_weighted_sum_of_its_parts(client):
    both = client.score("boxed_and_exact", "\\boxed{3}", "\\boxed{3}")
    assert (both.reward, both.answer_ok) == (1.0 + 0.5 * 2.0, True)
    boxed_only = client.score("boxed_and_exact", "so \\boxed{3}", "3")
    assert (boxed_only.reward, boxed_only.answer_ok, boxed_only.extracted_answer) == (1.0 + 0.5 * -1.0, False, "3")


def test_over_http(service):
    body = json.dumps({"items": [{"verifier": "exact", "response": "9", "gt_answer": "9"},
                                 {"verifier": "by_source", "response": "x", "metadata": {"data_source": "puzzles"}},
                                 {"verifier": "raises", "response": "x"}]}).encode()
    request = urllib.request.Request(f"{service.http.url}/v1/score", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as reply:
        results = json.loads(reply.read())["results"]
    assert [r["answer_ok"] for r in results] == [True, True, False]
    assert results[0]["reward"] == 2.0
    assert results[2]["reason"] == "verifier_error: ValueError: boom"


def test_with_zerobubble_score(service, tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("\n".join(json.dumps(row) for row in [
        {"verifier": "exact", "response": "8", "gt_answer": "8"},
        {"verifier": "by_source", "response": "x", "metadata": {"data_source": "puzzles"}},
        {"verifier": "boxed_and_exact", "response": "\\boxed{8}", "gt_answer": "\\boxed{8}"},
    ]))
    done = subprocess.run([sys.executable, "-m", "zerobubble", "score", "--server", service.address, "--file",
                           str(rows), "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    results = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(r["reward"], r["answer_ok"]) for r in results] == [(2.0, True), (1.0, True), (2.0, True)]


@pytest.mark.parametrize(("function", "message"), [
    ("no_such_module:f", "custom_verifiers[0].function: cannot import it: importing 'no_such_module' failed: "
                         "ModuleNotFoundError"),
    ("my_verifiers:missing", "custom_verifiers[0].function: cannot import it: module 'my_verifiers' has no "
                             "'missing'"),
    ("my_verifiers:not_callable", "custom_verifiers[0].function: cannot import it: my_verifiers:not_callable is a "
                                  "int, not a callable"),
])
def test_a_callable_that_does_not_import_stops_the_start(folder, function, message):
    entry = {"name": "broken", "function": function, "path": str(folder)}
    with pytest.raises(ConfigError) as caught:
        start_reward(**{"custom_verifiers": [entry], "math.workers": 1})
    assert str(caught.value).startswith(message)


def test_serve_reports_the_entry_and_exits(folder):
    done = subprocess.run(
        [sys.executable, "-m", "zerobubble", "serve", "reward", "--listen", "127.0.0.1:0", "--metrics-port", "0",
         "--set", "math.workers=1", "--set", "sandbox.slots=1", "--set",
         f"custom_verifiers=[{{name: x, function: 'my_verifiers:missing', path: '{folder}'}}]"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert done.returncode != 0
    assert "custom_verifiers[0].function" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(("settings", "field"), [
    ({"custom_verifiers": [{"name": "x", "function": "no colon"}]}, "custom_verifiers.0.function"),
    ({"custom_verifiers": [{"name": "x", "function": "m:f", "path": "/no/such/folder"}]}, "custom_verifiers.0.path"),
    ({"custom_verifiers": [{"name": "boxed", "function": "m:f"}]}, "custom_verifiers[0].name"),
    ({"combined_verifiers": [{"name": "c", "parts": [{"verifier": "nope", "weight": 1}]}]},
     "combined_verifiers[0].parts[0].verifier: unknown verifier 'nope'"),
    ({"combined_verifiers": [{"name": "c", "parts": [{"verifier": "reward_model", "weight": 1}]}]},
     "(set reward_model to add it)"),
    ({"combined_verifiers": [{"name": "c", "parts": [{"verifier": "boxed", "weight": 1},
                                                     {"verifier": "code", "weight": 1}]}]},
     "combined_verifiers[0].parts: an item carries an answer or test cases"),
    ({"combined_verifiers": [{"name": "c", "parts": [{"verifier": "boxed", "weight": float("nan")}]}]},
     "combined_verifiers.0.parts.0.weight"),
    ({"combined_verifiers": [{"name": "c", "parts": []}]}, "combined_verifiers.0.parts"),
])
def test_config_errors_name_the_field(settings, field):
    with pytest.raises(ConfigError) as caught:
        load_config(RewardServiceConfig, overrides=settings)
    assert field in str(caught.value)
