"""The OpenAI endpoint's sessions become training groups: a real rollout service that generates nothing itself
(openai.exclusive), a real buffer and reward service, the real `openai` client. A group leased with POST /v1/groups
is pushed to the buffer when its last session closes, each trajectory holding exactly the tokens its session's
last calls sent and received; a session closed without a reward is scored by the row's verifier; a group one of
whose sessions goes idle gives its prompt back."""

from __future__ import annotations

import contextlib
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from stack import start_buffer, start_reward, tiny_assets

from zerobubble.common.config import ConfigError, load_config
from zerobubble.rollout.app import build
from zerobubble.rollout.config import RolloutServiceConfig
from zerobubble.rollout.openai_endpoint import Call, stitch
from zerobubble.rollout.openai_groups import chain_trajectory, common_prefix

TOKEN = "groups-token"
MAX_NEW_TOKENS = 6
IDLE_S = 4.0


@contextlib.contextmanager
def open_stack(folder, **settings) -> Iterator[tuple[str, object, object, object]]:
    """The endpoint's base URL, the buffer, rollout host and reward servers."""
    model, train, _ = tiny_assets(folder, train_size=2, eval_size=1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GROUPS_TOKEN", TOKEN)
        reward = start_reward(**{"server.auth_token_env": "GROUPS_TOKEN"})
        buffer = start_buffer(train, folder / "wal", **{
            "run_spec.max_new_tokens": MAX_NEW_TOKENS, "run_spec.max_prompt_tokens": 256,
            "run_spec.num_generations": 2, "server.auth_token_env": "GROUPS_TOKEN"})
        config = load_config(RolloutServiceConfig, None, {
            "server.listen": "127.0.0.1:0", "server.metrics_port": None, "server.grace_seconds": 0.5,
            "server.auth_token_env": "GROUPS_TOKEN", "buffer.auth_token_env": "GROUPS_TOKEN",
            "reward_service.auth_token_env": "GROUPS_TOKEN", "reward_service.address": reward.address,
            "worker_id": "agents", "model.path": str(model), "trainer": None, "buffer.address": buffer.address,
            "openai.enabled": True, "openai.exclusive": True, "openai.session_idle_s": IDLE_S, **settings})
        host = build(config).start()
        yield f"http://127.0.0.1:{host.openai.port}", buffer, host, reward
        host.stop(0.5)
        buffer.stop(0)
        reward.stop(0)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with open_stack(tmp_path_factory.mktemp("tiny")) as (endpoint, buffer, host, _):
        yield endpoint, buffer.core, host


def post(url: str, body: dict) -> tuple[int, dict]:
    return post_raw(url, json.dumps(body).encode())


def post_raw(url: str, data: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=data, headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"})
    try:
        with urllib.request.urlopen(request, timeout=120) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def run_agent(endpoint: str, base_url: str, messages: list[dict], calls: int) -> list[dict]:
    """A small agent loop through the openai client: a call, the tool's result, another call; what it received."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{endpoint}{base_url}", api_key=TOKEN, max_retries=0)
    tools = [{"type": "function", "function": {"name": "add", "description": "Adds.", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}]
    messages, received = list(messages), []
    for turn in range(calls):
        answer = client.chat.completions.create(model="zerobubble-policy", messages=messages, tools=tools,
                                                max_tokens=MAX_NEW_TOKENS)
        received.append(answer.model_extra)
        messages += [{"role": "assistant", "content": answer.choices[0].message.content},
                     {"role": "tool", "content": str(turn)}]
    return received


def test_a_groups_sessions_are_pushed_as_one_group_with_the_tokens_the_client_received(stack):
    endpoint, buffer, host = stack
    status, group = post(f"{endpoint}/v1/groups", {})
    assert status == 200 and len(group["sessions"]) == 2, group
    # The row as an environment's reset sees it: the agent can score its own sessions with the ground truth.
    row = group["row"]
    assert row["messages"] and row["ground_truth"] and set(row) == {"prompt_id", "messages", "ground_truth",
                                                                    "data_source"}, row
    received = [run_agent(endpoint, base_url, group["row"]["messages"], calls)
                for base_url, calls in zip(group["base_urls"], (3, 2), strict=True)]
    # A reward that is not a finite number is refused naming it, and the session stays open (nothing lost).
    for raw in (b'{"reward": 1e309}', b'{"reward": -1e400}', b'{"reward": NaN}', b'{"reward": Infinity}'):
        status, refused = post_raw(f"{endpoint}/v1/sessions/{group['sessions'][0]}/close", raw)
        assert status == 400 and refused["error"]["param"] == "reward", (raw, refused)
    status, first = post(f"{endpoint}/v1/sessions/{group['sessions'][0]}/close", {"reward": 1.0})
    assert status == 200 and "group" not in first and buffer.stats()["groups_in"] == 0
    # The second closes without a reward: the arithmetic verifier judges its last answer.
    status, second = post(f"{endpoint}/v1/sessions/{group['sessions'][-1]}/close", {})
    assert status == 200, second
    pushed = second["group"]
    assert pushed["prompt_id"] == group["row"]["prompt_id"] and pushed["rewards"][0] == 1.0
    assert pushed["rewards"][1] in (0.0, 1.0)
    stats = buffer.stats()
    assert stats["groups_in"] == 1 and stats["queued_groups"] == 1, stats
    prefix = pushed["prompt_ids"]
    # The group's prompt: what the sessions' trained chains (their last samples) share, at least the row's prompt
    # that every first call began with (more when the chains are later calls whose conversations agree further).
    assert prefix == common_prefix([closed["samples"][-1]["prompt_ids"] for closed in (first, second)])
    row_prompt = common_prefix([[*calls[0]["prompt_token_ids"]] for calls in received])
    assert prefix[:len(row_prompt)] == row_prompt
    for calls, trajectory in zip(received, pushed["trajectories"], strict=True):
        last = calls[-1]
        # The trained chain ends with the session's last call: its prompt and completion, token for token.
        assert prefix + trajectory["response_ids"] == last["prompt_token_ids"] + last["completion_token_ids"]
        mask = trajectory["loss_mask"]
        assert mask[-len(last["completion_token_ids"]):] == [1] * len(last["completion_token_ids"])
        unmasked = [t for t, m in zip(trajectory["response_ids"], mask, strict=True) if m]
        # Only the model's own tokens train; the chain's prompt past the group's prefix is masked.
        sampled = [t for call in calls for t in call["completion_token_ids"]]
        assert unmasked == sampled[len(sampled) - len(unmasked):]
        assert mask[:len(last["prompt_token_ids"]) - len(prefix)] == [0] * (len(last["prompt_token_ids"])
                                                                            - len(prefix))


def test_a_group_whose_session_goes_idle_gives_its_prompt_back_and_pushes_nothing(stack):
    endpoint, buffer, _ = stack
    before = buffer.stats()["groups_in"]
    status, group = post(f"{endpoint}/v1/groups", {})
    assert status == 200, group
    run_agent(endpoint, group["base_urls"][0], group["row"]["messages"], 1)
    status, closed = post(f"{endpoint}/v1/sessions/{group['sessions'][0]}/close", {"reward": 0.5})
    assert status == 200 and "group" not in closed
    # The data has no third prompt: while this group holds the last one, nothing is left to lease.
    assert post(f"{endpoint}/v1/groups", {})[0] == 429
    time.sleep(IDLE_S + 0.5)
    # The idle session is dropped with its group, whose prompt goes back: it can be leased again.
    deadline = time.monotonic() + 30
    while (answer := post(f"{endpoint}/v1/groups", {}))[0] != 200 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert answer[0] == 200 and answer[1]["row"]["prompt_id"] == group["row"]["prompt_id"], answer
    assert post(f"{endpoint}/v1/sessions/{group['sessions'][1]}/close", {"reward": 0})[0] == 404
    assert buffer.stats()["groups_in"] == before
    # A session of a group closes once its agent ran, with a number or no reward at all.
    again = answer[1]["sessions"][0]
    status, refused = post(f"{endpoint}/v1/sessions/{again}/close", {"reward": 1})
    assert status == 409 and refused["error"]["param"] == "session_id"
    status, refused = post(f"{endpoint}/v1/sessions/{again}/close", {"reward": "high"})
    assert status == 400 and refused["error"]["param"] == "reward"


def open_all_but_the_last_close(endpoint: str) -> dict:
    """A group whose sessions each made one call, all closed but the last."""
    status, group = post(f"{endpoint}/v1/groups", {})
    assert status == 200, group
    for base_url in group["base_urls"]:
        run_agent(endpoint, base_url, group["row"]["messages"], 1)
    for session in group["sessions"][:-1]:
        assert post(f"{endpoint}/v1/sessions/{session}/close", {"reward": 1.0})[0] == 200
    return group


def test_a_group_the_reward_service_cannot_score_is_answered_503_and_its_prompt_goes_back(tmp_path):
    # The verifier's service stops before the group's last session closes without a reward, and stays away past
    # the worker's retries: the close is answered 503 naming the group, nothing reaches the buffer, and the
    # prompt can be leased again.
    with open_stack(tmp_path, **{"reward_service.retry_seconds": 1.0,
                                 "reward_service.timeout_seconds": 2.0}) as (endpoint, buffer, _, reward):
        buffer = buffer.core
        group = open_all_but_the_last_close(endpoint)
        reward.stop(0)
        status, refused = post(f"{endpoint}/v1/sessions/{group['sessions'][-1]}/close", {})
        assert status == 503 and refused["error"]["param"] == "group", refused
        assert "went back to the buffer" in refused["error"]["message"]
        assert buffer.stats()["groups_in"] == 0
        deadline = time.monotonic() + 30
        leased = {"row": {}}
        while time.monotonic() < deadline:
            status, leased = post(f"{endpoint}/v1/groups", {})
            if status == 200 and leased["row"]["prompt_id"] == group["row"]["prompt_id"]:
                break
            time.sleep(0.2)
        assert leased["row"].get("prompt_id") == group["row"]["prompt_id"], leased


def test_a_group_the_buffer_cannot_take_is_answered_503_and_the_endpoint_goes_on(tmp_path):
    # The buffer stops before the group's last session closes and stays away past the worker's retries: the close
    # is answered 503 naming the group, saying the prompt comes back only when its lease expires (it could not be
    # given back), and the endpoint still answers the next caller instead of hanging on the buffer.
    with open_stack(tmp_path, **{"buffer.retry_seconds": 1.0, "buffer.timeout_seconds": 2.0}) as (
            endpoint, buffer_server, _, _):
        group = open_all_but_the_last_close(endpoint)
        buffer_server.stop(0)
        status, refused = post(f"{endpoint}/v1/sessions/{group['sessions'][-1]}/close", {"reward": 0.0})
        assert status == 503 and refused["error"]["param"] == "group", refused
        assert "when its lease expires" in refused["error"]["message"], refused
        status, refused = post(f"{endpoint}/v1/groups", {})
        assert status == 503 and refused["error"]["param"] == "groups", refused


def test_exclusive_without_the_endpoint_is_refused_naming_the_field(tmp_path):
    with pytest.raises(ConfigError) as refused:
        load_config(RolloutServiceConfig, None, {"model.path": str(tmp_path), "openai.exclusive": True})
    assert "openai" in str(refused.value) and "exclusive" in str(refused.value)


def test_a_chains_prompt_past_the_groups_prefix_is_masked_and_takes_the_next_sampled_version():
    chain = {**stitch([Call([1, 2, 3], [4, 5], [-0.1, -0.2], [7, 7]), Call([1, 2, 3, 4, 5, 9], [6], [-0.3], [8])])[-1],
             "finish_reason": "length"}
    assert common_prefix([[1, 2, 3], [1, 2, 8, 8]]) == [1, 2]
    sample = chain_trajectory(chain, [1, 2], "six", 1.0)
    assert sample.response_ids.tolist() == [3, 4, 5, 9, 6]
    assert sample.loss_mask.tolist() == [0, 1, 1, 0, 1]
    assert sample.logprobs.tolist() == pytest.approx([0.0, -0.1, -0.2, 0.0, -0.3])
    assert sample.versions.tolist() == [7, 7, 7, 7, 8] and sample.finish_reason == "length"
    assert sample.support is None, "calls over the whole vocabulary need no support"


def test_a_chain_keeps_the_support_each_call_sampled_from_so_the_trainer_replays_it():
    # The second call drew at top-p: its token came from the 3 most likely, which the trainer must renormalise over.
    calls = [Call([1, 2, 3], [4, 5], [-0.1, -0.2], [7, 7]), Call([1, 2, 3, 4, 5, 9], [6], [-0.3], [8], support=[3])]
    chain = {**stitch(calls)[-1], "finish_reason": "stop"}
    sample = chain_trajectory(chain, [1, 2], "six", 1.0)
    assert sample.response_ids.tolist() == [3, 4, 5, 9, 6]
    assert sample.support.tolist() == [0, 0, 0, 0, 3]


def test_a_group_of_the_last_prompt_refused_whole_then_training_ends_with_410_not_429(tmp_path):
    # The last group's last close carries an infinite reward: refused, the lease not completed, so the group is
    # pushed whole when a finite reward comes. Then the trainer's last step: a group request is answered 410 with
    # the state as its code, where it was 429 ("ask again") before.
    with open_stack(tmp_path, **{"openai.group_ground_truth": False}) as (endpoint, buffer, _, _):
        buffer = buffer.core
        group = open_all_but_the_last_close(endpoint)
        assert "ground_truth" not in group["row"]
        last = f"{endpoint}/v1/sessions/{group['sessions'][-1]}/close"
        status, refused = post_raw(last, b'{"reward": 1e309}')
        assert status == 400 and refused["error"]["param"] == "reward", refused
        assert buffer.stats()["groups_in"] == 0
        status, closed = post(last, {"reward": 0.5})
        assert status == 200 and closed["group"]["rewards"] == [1.0, 0.5], closed
        assert buffer.stats()["groups_in"] == 1
        buffer.set_policy_version(1, training_finished=True)
        status, refused = post(f"{endpoint}/v1/groups", {})
        assert status == 410 and refused["error"]["code"] == "training_finished", refused
