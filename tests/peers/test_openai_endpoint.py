"""The OpenAI-compatible endpoint of a real rollout service (tiny model, transformers engine, a real buffer) driven
by the real `openai` client: a small agent loop of several calls with a tool, whose recorded samples hold exactly the
token ids the client received, the model's tokens unmasked and everything between them masked; and the edges
(unknown fields, huge max_tokens, n > 1, streaming, no token, unknown sessions) refused naming the field."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest
from stack import start_buffer, tiny_assets

from zerobubble.common.config import load_config
from zerobubble.rollout.app import build
from zerobubble.rollout.config import RolloutServiceConfig
from zerobubble.rollout.openai_endpoint import Call, stitch
from zerobubble.tooling.ports import free_port

TOKEN = "s3cret-token"
MAX_NEW_TOKENS = 6
MAX_CALLS = 3


@pytest.fixture(scope="module")
def endpoint(endpoint_host):
    return f"http://127.0.0.1:{endpoint_host.openai.port}"


@pytest.fixture(scope="module")
def endpoint_host(tmp_path_factory, monkeypatch_module):
    folder = tmp_path_factory.mktemp("tiny")
    model, train, _ = tiny_assets(folder, train_size=2, eval_size=1)
    buffer = start_buffer(train, folder / "wal", **{"run_spec.max_new_tokens": MAX_NEW_TOKENS,
                                                    "run_spec.max_prompt_tokens": 256})
    monkeypatch_module.setenv("PEERS_ROLLOUT_TOKEN", TOKEN)
    config = load_config(RolloutServiceConfig, None, {
        "server.listen": "127.0.0.1:0", "server.metrics_port": None, "server.grace_seconds": 0.5,
        "server.auth_token_env": "PEERS_ROLLOUT_TOKEN", "buffer.auth_token_env": "PEERS_ROLLOUT_TOKEN",
        "worker_id": "openai", "model.path": str(model), "trainer": None, "buffer.address": buffer.address,
        # A reward service that never answers: the worker's loop waits after its first batch.
        "reward_service.address": f"127.0.0.1:{free_port()}", "reward_service.retry_seconds": 3600,
        "openai.enabled": True, "openai.max_sessions": 2, "openai.max_calls_per_session": MAX_CALLS})
    host = build(config).start()
    yield host
    host.stop(0.5)
    buffer.stop(0)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def post(url: str, body: dict, token: str | None = TOKEN) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_an_agent_loop_through_the_openai_client_is_recorded_token_for_token(endpoint):
    from openai import OpenAI

    status, opened = post(f"{endpoint}/v1/sessions", {"row": {"ground_truth": "7"}})
    assert status == 200
    client = OpenAI(base_url=f"{endpoint}{opened['base_url']}", api_key=TOKEN, max_retries=0)
    assert [model.id for model in client.models.list().data] == ["zerobubble-policy"]
    tools = [{"type": "function", "function": {"name": "add", "description": "Adds.", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}]
    messages = [{"role": "user", "content": "What is 3+4? Use the tool."}]
    received = []
    for turn in range(3):
        answer = client.chat.completions.create(model="zerobubble-policy", messages=messages, tools=tools,
                                                max_tokens=MAX_NEW_TOKENS, temperature=1.0)
        extra = answer.model_extra
        received.append(Call(extra["prompt_token_ids"], extra["completion_token_ids"], [],
                             [extra["policy_version"]] * len(extra["completion_token_ids"])))
        assert 0 < answer.usage.completion_tokens == len(extra["completion_token_ids"]) <= MAX_NEW_TOKENS
        # The agent's tool runs on its side; its result goes back as the next call's messages.
        messages += [{"role": "assistant", "content": answer.choices[0].message.content},
                     {"role": "tool", "content": str(3 + 4 + turn)}]
    status, closed = post(f"{endpoint}/v1/sessions/{opened['session_id']}/close", {"reward": 1.0})
    assert status == 200 and closed["reward"] == 1.0 and closed["row"] == {"ground_truth": "7"}
    samples = closed["samples"]
    expected = stitch(received)
    assert [(s["prompt_ids"], s["response_ids"], s["loss_mask"]) for s in samples] == [
        (s["prompt_ids"], s["response_ids"], s["loss_mask"]) for s in expected]
    # Every token the client received is in a sample, unmasked, with a behaviour log-prob; nothing else is.
    model_tokens = [token for sample in samples for token, mask in zip(sample["response_ids"], sample["loss_mask"],
                                                                       strict=True) if mask]
    assert model_tokens == [token for call in received for token in call.completion_ids]
    pairs = [(value, mask) for sample in samples for value, mask in zip(sample["logprobs"], sample["loss_mask"],
                                                                        strict=True)]
    assert all(value <= 0.0 for value, mask in pairs if mask) and any(value < 0.0 for value, mask in pairs if mask)
    assert all(value == 0.0 for value, mask in pairs if not mask)
    assert all(sample["policy_versions"][i] == received[0].policy_versions[0] for sample in samples
               for i, mask in enumerate(sample["loss_mask"]) if mask)
    # The tiny model's chat template re-renders an assistant turn other than as sampled, so the calls fork here;
    # test_calls_that_extend_each_other_form_one_sample_and_one_that_does_not_forks covers the extension.
    assert 1 <= len(samples) <= 3


def test_a_call_at_top_p_records_the_support_its_tokens_were_drawn_from(endpoint):
    # Without it the trainer would weigh these tokens by the full softmax, biased by the mass top-p cut off.
    status, opened = post(f"{endpoint}/v1/sessions", {"row": {}})
    assert status == 200
    calls = f"{endpoint}{opened['base_url']}/chat/completions"
    status, answer = post(calls, {"model": "zerobubble-policy", "messages": [{"role": "user", "content": "1+1?"}],
                                  "max_tokens": MAX_NEW_TOKENS, "top_p": 0.5})
    assert status == 200, answer
    status, closed = post(f"{endpoint}/v1/sessions/{opened['session_id']}/close", {"reward": 0.0})
    assert status == 200
    sample = closed["samples"][-1]
    assert len(sample["support"]) == len(sample["response_ids"]) == len(answer["completion_token_ids"])
    assert all(kept >= 1 for kept in sample["support"]), sample["support"]


def test_calls_that_extend_each_other_form_one_sample_and_one_that_does_not_forks():
    calls = [Call([1, 2], [3, 4], [-0.1, -0.2], [5, 5]), Call([1, 2, 3, 4, 9], [6], [-0.3], [6]),
             Call([1, 7], [8], [-0.4], [6])]
    first, second = stitch(calls)
    assert first == {"prompt_ids": [1, 2], "response_ids": [3, 4, 9, 6], "loss_mask": [1, 1, 0, 1],
                     "logprobs": [-0.1, -0.2, 0.0, -0.3], "policy_versions": [5, 5, -1, 6], "support": [0, 0, 0, 0]}
    assert second["prompt_ids"] == [1, 7] and second["loss_mask"] == [1]


@pytest.mark.parametrize(("extra", "field"), [
    ({"frequency_penalty": 0.5}, "frequency_penalty"),
    ({"max_tokens": 10 ** 9}, "max_tokens"),
    ({"n": 3}, "n"),
    ({"stream": True}, "stream"),
    ({"temperature": -1}, "temperature"),
    ({"messages": "hi"}, "messages"),
    ({"stop": 5}, "stop"),
    ({"stop": [1, 2]}, "stop"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"seed": "x"}, "seed"),
    ({"seed": 2 ** 70}, "seed"),
    ({"seed": -1}, "seed"),
    ({"temperature": "hot"}, "temperature"),
    ({"top_p": None}, "top_p"),
])
def test_bad_requests_are_refused_naming_the_field(endpoint, extra, field):
    status, opened = post(f"{endpoint}/v1/sessions", {})
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}
    status, refused = post(f"{endpoint}{opened['base_url']}/chat/completions", body)
    assert status == 400 and refused["error"]["param"] == field, refused
    post(f"{endpoint}/v1/sessions/{opened['session_id']}/close", {"reward": 0})


def test_a_reward_that_is_not_a_finite_number_is_refused_and_the_session_stays_open(endpoint):
    status, opened = post(f"{endpoint}/v1/sessions", {})
    close = f"{endpoint}/v1/sessions/{opened['session_id']}/close"
    for raw in (b'{"reward": 1e309}', b'{"reward": NaN}', b'{"reward": -Infinity}'):
        request = urllib.request.Request(close, data=raw, headers={"Authorization": f"Bearer {TOKEN}"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=60)
        assert refused.value.code == 400 and json.loads(refused.value.read())["error"]["param"] == "reward"
    status, closed = post(close, {"reward": 0.25})
    assert status == 200 and closed["reward"] == 0.25


def test_concurrent_calls_on_a_session_pass_its_call_limit_never(endpoint):
    """8 calls at once on a session allowed 3: at most 3 are answered and recorded, the others refused with 429."""
    from concurrent.futures import ThreadPoolExecutor

    status, opened = post(f"{endpoint}/v1/sessions", {})
    body = {"messages": [{"role": "user", "content": "Count."}], "max_tokens": MAX_NEW_TOKENS}
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: post(f"{endpoint}{opened['base_url']}/chat/completions", body), range(8)))
    statuses = sorted(status for status, _ in answers)
    assert statuses.count(200) == MAX_CALLS and set(statuses) == {200, 429}, statuses
    assert all(answer["error"]["param"] == "session_id" for status, answer in answers if status == 429)
    status, closed = post(f"{endpoint}/v1/sessions/{opened['session_id']}/close", {"reward": 0})
    recorded = sum(mask.count(1) > 0 for sample in closed["samples"] for mask in [sample["loss_mask"]])
    assert status == 200 and 1 <= recorded <= MAX_CALLS
    completions = sum(len(answer["completion_token_ids"]) for status, answer in answers if status == 200)
    assert sum(sum(sample["loss_mask"]) for sample in closed["samples"]) == completions


def test_calls_of_two_sessions_share_the_batchers_decode_steps_and_a_sessions_next_call_its_cache(
        endpoint, endpoint_host):
    """The transformers engine's continuous batcher serves the endpoint: calls made at once decode side by side
    (no engine lock between them), and a session's next call, whose prompt extends the last one's, reuses the
    cache kept under the session."""
    from concurrent.futures import ThreadPoolExecutor

    sessions = [post(f"{endpoint}/v1/sessions", {})[1] for _ in range(2)]
    body = {"messages": [{"role": "user", "content": "Count the letters of this sentence for me."}],
            "max_tokens": MAX_NEW_TOKENS, "temperature": 1.0}
    batcher = None
    for _ in range(MAX_CALLS - 1):   # a call of the limit left for the cache's turn below
        with ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(lambda s: post(f"{endpoint}{s['base_url']}/chat/completions", body), sessions))
        assert [status for status, _ in answers] == [200, 200], answers
        batcher = endpoint_host.engine.started_batcher
        if batcher is not None and batcher.stats.peak_running >= 2:
            break
    assert batcher is not None, "the calls did not go through the continuous batcher"
    assert batcher.stats.peak_running >= 2, batcher.stats
    reused = batcher.stats.reused_tokens
    status, again = post(f"{endpoint}{sessions[0]['base_url']}/chat/completions", body)
    assert status == 200 and batcher.stats.reused_tokens >= reused + len(again["prompt_token_ids"]) // 2
    for session in sessions:
        assert post(f"{endpoint}/v1/sessions/{session['session_id']}/close", {"reward": 0})[0] == 200


def test_the_token_sessions_and_their_limit_are_enforced(endpoint):
    status, refused = post(f"{endpoint}/v1/sessions", {}, token="wrong")
    assert status == 401 and refused["error"]["param"] == "Authorization"
    status, refused = post(f"{endpoint}/sessions/nope/v1/chat/completions",
                           {"messages": [{"role": "user", "content": "hi"}]})
    assert status == 404 and refused["error"]["param"] == "session_id"
    opened = [post(f"{endpoint}/v1/sessions", {})[1] for _ in range(2)]
    status, refused = post(f"{endpoint}/v1/sessions", {})
    assert status == 429
    for session in opened:
        assert post(f"{endpoint}/v1/sessions/{session['session_id']}/close", {"reward": 0})[0] == 200
    status, refused = post(f"{endpoint}/v1/sessions/{opened[0]['session_id']}/close", {"reward": 0})
    assert status == 404


def test_a_session_never_closed_is_dropped_after_its_idle_time():
    from zerobubble.rollout.config import OpenAIEndpointConfig
    from zerobubble.rollout.openai_endpoint import OpenAIEndpoint

    config = OpenAIEndpointConfig(enabled=True, max_sessions=1, session_idle_s=0.3)
    endpoint = OpenAIEndpoint(config, worker=None, max_new_tokens=4, token=None).start()
    try:
        url = f"http://127.0.0.1:{endpoint.port}"
        forgotten = post(f"{url}/v1/sessions", {}, token=None)[1]
        assert post(f"{url}/v1/sessions", {}, token=None)[0] == 429
        time.sleep(0.5)
        assert post(f"{url}/v1/sessions", {}, token=None)[0] == 200
        status, gone = post(f"{url}/v1/sessions/{forgotten['session_id']}/close", {"reward": 0}, token=None)
        assert status == 404 and gone["error"]["param"] == "session_id"
    finally:
        endpoint.stop()


def test_a_call_while_the_engine_closes_is_answered_503_and_the_session_stays_open(endpoint, endpoint_host,
                                                                                  monkeypatch):
    from zerobubble.rollout.continuous import BatcherClosed

    def closed(*_args, **_kwargs):
        raise BatcherClosed("the engine is closed")

    status, opened = post(f"{endpoint}/v1/sessions", {})
    monkeypatch.setattr(endpoint_host.worker, "complete", closed)
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": MAX_NEW_TOKENS}
    status, refused = post(f"{endpoint}{opened['base_url']}/chat/completions", body)
    assert status == 503 and refused["error"]["param"] == "session_id", refused
    monkeypatch.undo()
    # The refused call took no slot: the session calls again and closes.
    assert post(f"{endpoint}{opened['base_url']}/chat/completions", body)[0] == 200
    assert post(f"{endpoint}/v1/sessions/{opened['session_id']}/close", {"reward": 0})[0] == 200


class NewVersionOfTheSameWeights:
    """A weight receiver that, once armed, loads the engine's own weights as the next version at the next apply
    (whichever thread asks: the worker's own loop reaches its safe point too)."""

    def __init__(self):
        self.loaded_at: float | None = None
        self.armed = False

    def apply_to(self, engine) -> bool:
        if not self.armed:
            return False
        self.armed = False
        engine.load_weights(((name, tensor.clone()) for name, tensor in engine.model.state_dict().items()),
                            version=engine.policy_version + 1)
        self.loaded_at = time.monotonic()
        return True


def test_outside_in_flight_a_load_waits_for_the_call_under_way_whose_tokens_keep_one_version(endpoint_host,
                                                                                             monkeypatch):
    """The run takes weights between batches (the default): a safe point's load that comes while an endpoint call
    decodes in the batcher waits for the call's end, so every token of the call is of one version."""
    from concurrent.futures import ThreadPoolExecutor

    from zerobubble.rollout.engine import SamplingSettings

    worker, engine = endpoint_host.worker, endpoint_host.engine
    receiver = NewVersionOfTheSameWeights()
    monkeypatch.setattr(worker, "receiver", receiver)
    prompt = engine.tokenizer.encode("Count to a hundred:", add_special_tokens=False)
    tested = False
    for seed in range(8):   # a seed whose answer outlasts the moment the load comes (the model may end it early)
        start = engine.policy_version
        ended = {}

        def call(seed=seed, ended=ended):
            sample = worker.complete(prompt, SamplingSettings(n=1, temperature=1.0, max_new_tokens=400, seed=seed),
                                     key=f"one-version-{seed}")
            ended["at"] = time.monotonic()
            return sample

        with ThreadPoolExecutor(1) as pool:
            future = pool.submit(call)
            while (batcher := engine.started_batcher) is None or not batcher.stats.decode_steps:
                time.sleep(0.005)
            steps = batcher.stats.decode_steps
            while batcher.stats.decode_steps < steps + 20 and not future.done():
                time.sleep(0.005)
            load_asked = time.monotonic()
            receiver.armed = True
            worker.safe_point()
            sample, versions = future.result()
        worker.forget(f"one-version-{seed}")
        assert engine.policy_version == start + 1, "the safe point took the new weights"
        assert receiver.loaded_at >= ended["at"], "the load did not wait for the call"
        assert set(versions) == {start}, versions
        if load_asked < ended["at"]:
            tested = True
            break
    assert tested, "every call ended before its load was asked for: nothing was tested"
