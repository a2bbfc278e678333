"""The reward service over a real loopback channel: RPCs, errors, overload, metrics, reflection,
idle and competing streams."""

import asyncio
import statistics
import threading
import time
import urllib.request

import grpc
import pytest
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase
from idle_streams import health_check_seconds, idle_streams
from reward_helpers import start_reward

from zerobubble.common.clients.reward import RewardClient, score_request
from zerobubble.common.config import ClientConfig
from zerobubble.reward.examples import EXAMPLES
from zerobubble.v1 import reward_pb2

SCORE_STREAM = "/zerobubble.v1.RewardService/ScoreStream"

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


def test_a_thousand_idle_streams_leave_health_checks_and_unary_calls_answering(reward_host):
    # Each stream has one item scored (so the service surely serves it), then sends nothing more.
    first = [score_request("boxed", "so \\boxed{7}", "7", id=f"s{i}").SerializeToString() for i in range(1000)]
    with idle_streams(reward_host.address, SCORE_STREAM, first, client_streaming=True, within=180):
        seconds = health_check_seconds(reward_host.address)
        assert statistics.median(seconds) < 0.1, seconds
        with RewardClient(ClientConfig(address=reward_host.address, timeout_seconds=5, retry_seconds=0)) as client:
            started = time.monotonic()
            assert client.score("boxed", "\\boxed{2}", "2").answer_ok
            assert time.monotonic() - started < 1.0


def _score_stream(channel: grpc.aio.Channel):
    return channel.stream_stream(SCORE_STREAM, request_serializer=reward_pb2.ScoreRequest.SerializeToString,
                                 response_deserializer=reward_pb2.ScoreResult.FromString)


async def _results_ahead_of_a_newcomer(address: str, floods: int, per_flood: int) -> int:
    """Flood results that arrive after a newcomer stream (another client) sends its one item and
    before its result."""
    received = [0] * floods
    async with grpc.aio.insecure_channel(address) as flooder, grpc.aio.insecure_channel(address) as newcomer:
        await asyncio.wait_for(newcomer.channel_ready(), 30)

        async def flood(k: int) -> None:
            # An item that keeps the math worker busy for a while (~15 ms), so results on their way
            # to this client are few next to the items run.
            items = (score_request("boxed", "\\boxed{\\sin^2(x)+\\cos^2(x)}", "1", id=f"f{k}.{i}")
                     for i in range(per_flood))
            async for _ in _score_stream(flooder)(items, timeout=600):
                received[k] += 1

        floods_running = [asyncio.create_task(flood(k)) for k in range(floods)]
        try:
            # Every flood has had results, so each keeps its window of items in progress.
            while min(received) < 2:
                await asyncio.sleep(0.01)
            before = sum(received)
            item = score_request("boxed", "\\boxed{5}", "5", id="newcomer")
            results = [result async for result in _score_stream(newcomer)(iter([item]), timeout=600)]
            assert [r.id for r in results] == ["newcomer"] and results[0].answer_ok
            assert max(received) < per_flood, "a flood ran out before the newcomer was answered"
            return sum(received) - before
        finally:
            for task in floods_running:
                task.cancel()
            await asyncio.gather(*floods_running, return_exceptions=True)


def test_a_stream_flooding_items_does_not_starve_another_streams_single_item():
    floods = 8
    # One math worker; four sandbox slots only widen each stream's window (2 x all lanes' threads = 10).
    app = start_reward(**{"math.workers": 1, "sandbox.slots": 4})
    try:
        ahead = asyncio.run(_results_ahead_of_a_newcomer(app.address, floods, per_flood=60))
    finally:
        app.stop(grace=0)
    # Taking turns, the newcomer waits for about one item of each flood (plus results on their way);
    # first come first served, it would wait behind every flood's whole window: about 80 items.
    assert ahead <= 2 * floods, f"{ahead} flood results came before the newcomer's"
