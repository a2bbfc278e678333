"""Every size of a scoring request that reaches an allocation is bounded in bytes, as the wire counts them, and
refused at once naming the field, without echoing the oversized value; the service answers the next request."""

import grpc
import pytest
from reward_helpers import start_reward

from zerobubble.common.clients.reward import RewardClient, score_request
from zerobubble.common.config import ClientConfig

LIMIT = 1000
EMOJI = "\U0001F600"   # one character, four UTF-8 bytes: a limit in characters lets four times the bytes through
CODE = "```python\nprint(input())\n```"


@pytest.fixture(scope="module")
def small_reward():
    app = start_reward(**{"limits.max_response_bytes": LIMIT, "limits.max_answer_bytes": LIMIT,
                          "limits.max_id_bytes": LIMIT, "limits.max_test_bytes": LIMIT,
                          "limits.max_test_cases": 3, "limits.max_batch_items": 4})
    with RewardClient(ClientConfig(address=app.address, timeout_seconds=60, retry_seconds=0)) as client:
        yield client
    app.stop(grace=0)


@pytest.mark.parametrize(("request_", "code", "field"), [
    pytest.param(score_request("boxed", EMOJI * 300, "1"), grpc.StatusCode.RESOURCE_EXHAUSTED, "response",
                 id="response bytes"),
    pytest.param(score_request("boxed", "\\boxed{1}", EMOJI * 300), grpc.StatusCode.RESOURCE_EXHAUSTED, "gt_answer",
                 id="answer bytes"),
    pytest.param(score_request("boxed", "\\boxed{1}", "1", id=EMOJI * 300), grpc.StatusCode.RESOURCE_EXHAUSTED, "id",
                 id="id bytes"),
    pytest.param(score_request("code", CODE, test_cases={"inputs": ["a", EMOJI * 250], "outputs": ["a", "b"]}),
                 grpc.StatusCode.RESOURCE_EXHAUSTED, "test_cases", id="test bytes"),
    pytest.param(score_request("code", CODE, test_cases={"inputs": ["1"] * 4, "outputs": ["1"] * 4}),
                 grpc.StatusCode.RESOURCE_EXHAUSTED, "test_cases", id="test count"),
    pytest.param(score_request("b" * 100_000, "\\boxed{1}", "1"), grpc.StatusCode.INVALID_ARGUMENT, "verifier",
                 id="long unknown verifier"),
])
def test_oversized_field_is_refused_by_name_and_the_next_request_answers(small_reward, request_, code, field):
    with pytest.raises(grpc.RpcError) as refused:
        small_reward.unary("Score", request_)
    assert (refused.value.code(), refused.value.details().split(":")[0]) == (code, field), refused.value.details()
    assert len(refused.value.details()) < 500
    assert small_reward.score("boxed", "\\boxed{7}", "7").answer_ok


def test_limits_are_inclusive_in_bytes(small_reward):
    result = small_reward.unary("Score", score_request("boxed", "\\boxed{1}" + EMOJI * 247, "1", id=EMOJI * 250))
    assert result.id == EMOJI * 250
    tests = {"inputs": ["x", "y", EMOJI * 249], "outputs": ["x", "y", ""]}
    assert small_reward.unary("Score", score_request("code", CODE, test_cases=tests)).tests_total == 3


def test_batch_item_count_is_bounded(small_reward):
    items = [score_request("boxed", "\\boxed{1}", "1")] * 5
    with pytest.raises(grpc.RpcError) as refused:
        small_reward.score_batch(items)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert refused.value.details().startswith("items:")
    assert len(small_reward.score_batch(items[:4])) == 4
