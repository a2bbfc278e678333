"""The reward service over a real loopback channel: RPCs, errors, overload, metrics, reflection."""

import threading
import time
import urllib.request

import grpc
import pytest
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase
from reward_helpers import start_reward

from zerobubble.common.config import ClientConfig
from zerobubble.reward.client import RewardClient, score_request
from zerobubble.reward.examples import EXAMPLES

SQUARES = {"inputs": ["3\n", "12\n"], "outputs": ["9\n", "144\n"]}


def _code(body: str) -> str:
    return f"```python\n{body}\n```"


def test_builtin_examples(reward):
    results = reward.score_batch([request for _, _, request in EXAMPLES])
    assert [r.answer_ok for r in results] == [expected for _, expected, _ in EXAMPLES]
    by_name = {what: r for (what, _, _), r in zip(EXAMPLES, results, strict=True)}
    assert by_name["tags answer right, format broken"].format_ok is False
    assert by_name["boxed missing"].reason == "no_answer"
    assert by_name["code endless loop"].reason == "time_limit"


def test_score_fields(reward):
    result = reward.score("boxed", "thus \\boxed{\\frac{6}{8}}", "0.75")
    assert (result.reward, result.format_ok, result.answer_ok, result.extracted_answer) == (
        1.0, True, True, "\\frac{6}{8}")
    wrong = reward.score("boxed", "thus \\boxed{0.7}", "0.75")
    assert (wrong.reward, wrong.answer_ok, wrong.reason) == (0.0, False, "")


def test_reference_reward_values():
    app = start_reward(**{"rewards.correct": 10.0, "sandbox.slots": 1, "math.workers": 1})
    try:
        with RewardClient(app.address) as client:
            assert client.score("boxed", "\\boxed{4}", "4").reward == 10.0
            assert client.score("boxed", "\\boxed{5}", "4").reward == 0.0
            assert client.list_verifiers().correct_reward == 10.0
    finally:
        app.stop(grace=0)


def test_code_partial_credit(reward):
    half = _code("n = int(input())\nprint(9 if n == 3 else 0)")
    assert reward.score("code", half, test_cases=SQUARES).reward == 0.0
    partial = reward.score("code", half, test_cases=SQUARES, partial_credit=True)
    assert (partial.reward, partial.tests_passed, partial.tests_total) == (0.5, 1, 2)


def test_stream_answers_every_item(reward):
    requests = [score_request("boxed", f"\\boxed{{{i}}}", str(i if i % 2 else i + 1), id=f"r{i}") for i in range(20)]
    results = {r.id: r for r in reward.score_stream(requests)}
    assert set(results) == {f"r{i}" for i in range(20)}
    assert all(results[f"r{i}"].answer_ok == bool(i % 2) for i in range(20))


def test_list_verifiers(reward):
    listing = reward.list_verifiers()
    assert {v.name: v.available for v in listing.verifiers} == {
        "boxed": True, "think_answer_tags": True, "code": True}
    assert {v.name: v.ground_truth for v in listing.verifiers}["code"] == "test_cases"


@pytest.mark.parametrize(
    ("request_", "code", "field"),
    [
        (score_request("boxd", "x", "1"), grpc.StatusCode.INVALID_ARGUMENT, "verifier: unknown verifier 'boxd'"),
        (score_request("boxed", "\\boxed{1}"), grpc.StatusCode.INVALID_ARGUMENT, "gt_answer"),
        (score_request("code", _code("print(1)")), grpc.StatusCode.INVALID_ARGUMENT, "test_cases"),
        (score_request("code", _code("print(1)"), test_cases={"inputs": ["1"], "outputs": []}),
         grpc.StatusCode.INVALID_ARGUMENT, "test_cases.outputs: 1 inputs but 0 outputs"),
        (score_request("code", _code("print(1)"), test_cases={"inputs": [], "outputs": []}),
         grpc.StatusCode.INVALID_ARGUMENT, "test_cases.inputs"),
        (score_request("boxed", "x" * 300_000, "1"), grpc.StatusCode.RESOURCE_EXHAUSTED, "response: 300000 bytes"),
    ],
)
def test_bad_requests_name_the_field(reward, request_, code, field):
    with pytest.raises(grpc.RpcError) as err:
        reward.unary("Score", request_)
    assert err.value.code() == code
    assert field in err.value.details()


def test_bad_item_refuses_the_whole_batch_by_index(reward):
    items = [score_request("boxed", "\\boxed{1}", "1"), score_request("nope", "x", "1")]
    with pytest.raises(grpc.RpcError) as err:
        reward.score_batch(items)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "items[1].verifier" in err.value.details()


def test_bad_stream_item_after_good_ones_loses_nothing(reward):
    good = [score_request("boxed", f"\\boxed{{{i}}}", str(i), id=f"g{i}") for i in range(5)]
    bad = score_request("boxed", "\\boxed{1}", id="bad")
    received = []
    with pytest.raises(grpc.RpcError) as err:
        for result in reward.score_stream([*good, bad, *good]):
            received.append(result.id)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "stream item 5 (id 'bad'): gt_answer" in err.value.details()
    assert sorted(received) == sorted(r.id for r in good)


def test_overload_is_refused_promptly():
    app = start_reward(**{"limits.max_pending_items": 2, "sandbox.slots": 1, "math.workers": 1})
    slow = score_request("code", _code("import time\ntime.sleep(1.5)"), test_cases={"inputs": [""], "outputs": [""]})
    try:
        with RewardClient(ClientConfig(address=app.address, retry_seconds=0)) as client:
            holders = [threading.Thread(target=client.unary, args=("Score", slow)) for _ in range(2)]
            for holder in holders:
                holder.start()
            while app.scorer.pending < 2:
                time.sleep(0.01)
            started = time.monotonic()
            with pytest.raises(grpc.RpcError) as err:
                client.score("boxed", "\\boxed{1}", "1")
            assert time.monotonic() - started < 0.5
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "limits.max_pending_items" in err.value.details()
            for holder in holders:
                holder.join()
            assert client.score("boxed", "\\boxed{1}", "1").answer_ok
    finally:
        app.stop(grace=0)


def test_reflection_and_metrics(reward_host, reward):
    reward.score("boxed", "\\boxed{2}", "2")
    reward.score("boxed", "no box", "2")
    services = ProtoReflectionDescriptorDatabase(grpc.insecure_channel(reward_host.address)).get_services()
    assert "zerobubble.v1.RewardService" in services
    body = urllib.request.urlopen(f"http://127.0.0.1:{reward_host.metrics_port}/metrics", timeout=5).read()
    text = body.decode()
    assert 'zerobubble_reward_items_total{outcome="correct",verifier="boxed"}' in text
    assert 'zerobubble_reward_items_total{outcome="no_answer",verifier="boxed"}' in text
    assert "zerobubble_reward_latency_seconds_bucket" in text
    for name in ("zerobubble_reward_queue_depth", "zerobubble_reward_sandbox_kills_total",
                 "zerobubble_reward_math_worker_replacements_total", "zerobubble_reward_timeouts"):
        assert name in text, name
