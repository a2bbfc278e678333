"""What the front refuses, and how: no key or a wrong one is 401 before anything runs; bad, malformed or truncated
input is a 4xx whose message names the field, both as raw HTTP and as the official client reports it; an unserved
route is a 404 (never a 5xx, which the client would retry for minutes); a body over the limit is 413; and a caller
that hangs up mid-poll loses nothing."""

from __future__ import annotations

import time

import httpx
import numpy as np
import pytest
import tinker
from tinker import types
from tinker.proto import tinker_public_pb2 as pb
from tinker_data import DEADLINE, MODEL, TOKEN, next_token_datum

pytestmark = pytest.mark.slow

KEY = {"X-API-Key": TOKEN}


@pytest.mark.parametrize("headers", [{}, {"X-API-Key": "tml-wrong"}, {"Authorization": "Bearer tml-wrong"}],
                         ids=["no key", "wrong key", "wrong bearer"])
def test_a_call_without_the_key_is_401(tinker_server, headers):
    answer = httpx.post(f"{tinker_server.url}/api/v1/create_session", json={"sdk_version": "0.38.0", "tags": []},
                        headers=headers, timeout=10)
    assert answer.status_code == 401
    assert answer.json()["field"] == "Authorization"


def test_the_official_client_with_a_wrong_key_is_refused(tinker_server):
    with pytest.raises(tinker.AuthenticationError):
        tinker.ServiceClient(base_url=tinker_server.url, api_key="tml-not-the-key").create_lora_training_client(
            base_model=MODEL).result(DEADLINE)


def test_the_bearer_token_is_accepted_as_well_as_the_api_key_header(tinker_server):
    answer = httpx.get(f"{tinker_server.url}/api/v1/get_server_capabilities",
                       headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
    assert answer.status_code == 200
    assert answer.json()["supported_models"][0]["model_name"] == MODEL


@pytest.fixture(scope="module")
def client(service_client):
    return service_client.create_lora_training_client(base_model=MODEL, rank=4, seed=3).result(DEADLINE)


def _refused(call, status: int, field: str) -> None:
    with pytest.raises(tinker.APIStatusError) as caught:
        call()
    assert caught.value.status_code == status
    assert caught.value.body["field"] == field and field in caught.value.body["detail"]


def test_targets_of_the_wrong_length_are_refused_naming_the_field(client):
    datum = types.Datum(model_input=types.ModelInput.from_ints([1, 2, 3]),
                        loss_fn_inputs={"target_tokens": [2, 3, 4], "weights": [1.0, 1.0]})
    _refused(lambda: client.forward_backward([datum], "cross_entropy").result(DEADLINE), 422,
             "data[0].loss_fn_inputs.weights")


def test_an_rl_loss_without_advantages_is_refused_naming_the_field(client):
    datum = next_token_datum([1, 2, 3, 4], logprobs=[-1.0, -1.0, -1.0])
    _refused(lambda: client.forward_backward([datum], "ppo").result(DEADLINE), 422,
             "data[0].loss_fn_inputs.advantages")


def test_an_unknown_loss_setting_is_refused_naming_it(client):
    datum = next_token_datum([1, 2, 3, 4], logprobs=[-1.0] * 3, advantages=[1.0] * 3)
    _refused(lambda: client.forward_backward([datum], "ppo", {"clip_epsilon": 0.2}).result(DEADLINE), 422,
             "loss_fn_config.clip_epsilon")


def test_a_negative_learning_rate_is_refused_naming_the_field(service_client):
    # A client of its own: a refused call leaves the official client unable to send more.
    fresh = service_client.create_lora_training_client(base_model=MODEL, rank=4, seed=4).result(DEADLINE)
    _refused(lambda: fresh.optim_step(types.AdamParams(learning_rate=-1.0)).result(DEADLINE), 422,
             "adam_params.learning_rate")


def test_a_bad_sampling_setting_is_refused_naming_the_field(service_client):
    sampler = service_client.create_sampling_client(base_model=MODEL).result(DEADLINE)
    _refused(lambda: sampler.sample(types.ModelInput.from_ints([1, 2]), 1,
                                    types.SamplingParams(max_tokens=4, top_p=0.0)).result(DEADLINE),
             422, "sampling_params.top_p")


def test_a_base_model_this_server_does_not_serve_is_refused_naming_the_field(service_client):
    _refused(lambda: service_client.create_lora_training_client(base_model="Qwen/Qwen3-8B").result(DEADLINE), 422,
             "base_model")


def test_an_unserved_route_is_a_404_that_says_so(client):
    _refused(lambda: client.save_weights_external("checkpoint").result(DEADLINE), 404, "path")


def _post(server, path: str, *, timeout: float = 10, **kwargs) -> httpx.Response:
    return httpx.post(f"{server.url}/api/v1/{path}", headers={**KEY, **kwargs.pop("headers", {})}, timeout=timeout,
                      **kwargs)


def test_malformed_and_unknown_requests_name_their_field(tinker_server, client):
    cases = [
        (_post(tinker_server, "forward_backward", content=b"\xff\x00garbage",
               headers={"Content-Type": "application/x-protobuf"}), 422, "body"),
        (_post(tinker_server, "forward_backward", content=pb.ForwardBackwardRequest(
            model_id="nobody:train:0", loss_fn="cross_entropy").SerializeToString(),
               headers={"Content-Type": "application/x-protobuf"}), 404, "model_id"),
        (_post(tinker_server, "forward_backward", json={"model_id": client.model_id}), 415, "Content-Type"),
        (_post(tinker_server, "retrieve_future", json={"request_id": "never-issued"}), 404, "request_id"),
        (_post(tinker_server, "optim_step", content=b"{not json"), 422, "body"),
        (_post(tinker_server, "optim_step", json={"model_id": client.model_id,
                                                  "adam_params": {"learning_rate": "fast"}}),
         422, "adam_params.learning_rate"),
        (_post(tinker_server, "create_model", json={"session_id": "x", "model_seq_id": 0, "base_model": MODEL}),
         404, "session_id"),
    ]
    for answer, status, field in cases:
        assert (answer.status_code, answer.json()["field"]) == (status, field), answer.text
        assert field in answer.json()["detail"]


def test_a_truncated_forward_backward_is_refused_naming_the_body(tinker_server, client):
    datum = pb.Datum()
    datum.model_input.add().encoded_text.tokens = b"\x01\x00\x00\x00" * 8
    whole = pb.ForwardBackwardRequest(model_id=client.model_id, loss_fn="cross_entropy", data=[datum])
    answer = _post(tinker_server, "forward_backward", content=whole.SerializeToString()[:-5],
                   headers={"Content-Type": "application/x-protobuf"})
    assert (answer.status_code, answer.json()["field"]) == (422, "body")


def _forward_only(model_id: str, rows: int, length: int) -> bytes:
    request = pb.ForwardBackwardRequest(model_id=model_id, loss_fn="cross_entropy", forward_only=True)
    for _ in range(rows):
        datum = request.data.add()
        datum.model_input.add().encoded_text.tokens = np.ones(length, dtype=np.int32).tobytes()
        for name, dtype, values in (("target_tokens", pb.DTYPE_INT64, np.ones(length, dtype=np.int64)),
                                    ("weights", pb.DTYPE_FLOAT32, np.ones(length, dtype=np.float32))):
            datum.loss_fn_inputs[name].CopyFrom(pb.Tensor(dtype=dtype, shape=[length], dense=values.tobytes()))
    return request.SerializeToString()


def _result(server, request_id: str) -> dict:
    """Polls as the client does: again while the answer is try_again (each poll is held up to poll_wait_s)."""
    end = time.monotonic() + DEADLINE
    while time.monotonic() < end:
        answer = _post(server, "retrieve_future", json={"request_id": request_id}, timeout=30)
        assert answer.status_code == 200, answer.text
        if answer.json().get("type") != "try_again":
            return answer.json()
    raise TimeoutError(f"{request_id} did not finish within {DEADLINE} s")


def test_a_poll_the_caller_abandons_loses_nothing(tinker_server, client):
    """A caller that hangs up in the middle of a poll finds the result at its next one, and the step it asked for
    applied once."""
    proto = {"Content-Type": "application/x-protobuf"}
    # Seconds of work ahead of the step in the one queue, so the step's first poll is held open.
    _post(tinker_server, "forward_backward", content=_forward_only(client.model_id, 16, 1000), headers=proto)
    step = _post(tinker_server, "optim_step", json={"model_id": client.model_id, "adam_params": {}}).json()
    with pytest.raises(httpx.TimeoutException):
        _post(tinker_server, "retrieve_future", json={"request_id": step["request_id"]}, timeout=0.2)
    answer = _result(tinker_server, step["request_id"])
    steps = answer["metrics"]["step:max"]
    assert _result(tinker_server, step["request_id"]) == answer  # fetched twice, the same answer
    following = client.optim_step(types.AdamParams()).result(DEADLINE)
    assert following.metrics["step:max"] == steps + 1  # and applied once


def test_a_body_over_the_limit_is_413(tinker_server):
    answer = _post(tinker_server, "forward_backward", content=b"\0" * (16 << 20 | 1),
                   headers={"Content-Type": "application/x-protobuf"})
    assert answer.status_code == 413 and answer.json()["field"] == "body"
