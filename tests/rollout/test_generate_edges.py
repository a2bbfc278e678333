"""The Generate RPC of a real rollout service (tiny model, transformers engine) fed what a careless or hostile
caller sends: every request is refused at once with the right code and the field named, nothing is allocated
for a refused request, and a normal call answers afterwards."""

from __future__ import annotations

import json
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

import grpc
import pytest
from stack import start_buffer, tiny_assets

from zerobubble.common.codec import decode_array
from zerobubble.common.config import load_config
from zerobubble.common.run_spec import RunSpec
from zerobubble.rollout.app import build
from zerobubble.rollout.config import RolloutServiceConfig
from zerobubble.tooling.ports import free_port
from zerobubble.v1 import rollout_pb2, rollout_pb2_grpc

INVALID = grpc.StatusCode.INVALID_ARGUMENT
TOO_LARGE = grpc.StatusCode.RESOURCE_EXHAUSTED
MAX_NEW_TOKENS = 8
MAX_PROMPT_TOKENS = 128
MESSAGES = json.dumps([{"role": "user", "content": "3+4="}])


@pytest.fixture(scope="module")
def rollout(tmp_path_factory):
    """A worker whose reward service never answers: its loop waits for it after its first batch, so the engine is
    the Generate RPC's alone."""
    folder = tmp_path_factory.mktemp("tiny")
    model, train, _ = tiny_assets(folder, train_size=2, eval_size=1)
    buffer = start_buffer(train, folder / "wal", **{"run_spec.max_new_tokens": MAX_NEW_TOKENS,
                                                    "run_spec.max_prompt_tokens": MAX_PROMPT_TOKENS})
    config = load_config(RolloutServiceConfig, None, {
        "server.listen": "127.0.0.1:0", "server.metrics_port": None, "server.grace_seconds": 0.5,
        "worker_id": "edges", "model.path": str(model), "trainer": None, "buffer.address": buffer.address,
        "reward_service.address": f"127.0.0.1:{free_port()}", "reward_service.retry_seconds": 3600,
        "requests.max_samples": 8, "requests.max_prompt_bytes": 4096, "requests.max_stop_strings": 2,
        "requests.max_stop_bytes": 16,
    })
    host = build(config).start()
    with grpc.insecure_channel(host.address) as channel:
        yield host, rollout_pb2_grpc.RolloutServiceStub(channel)
    host.stop(0.5)
    buffer.stop(0)


def generate(prompts=(MESSAGES,), raw=False, **sampling) -> rollout_pb2.GenerateRequest:
    return rollout_pb2.GenerateRequest(prompts=list(prompts), raw=raw, sampling=rollout_pb2.SamplingParams(**sampling))


def refusal(stub, request) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as refused:
        stub.Generate(request, timeout=60)
    return refused.value


def assert_normal_call_answers(stub) -> None:
    reply = stub.Generate(generate(n=2, temperature=1.0, max_new_tokens=4), timeout=60)
    assert len(reply.completions) == 2
    assert all(0 < decode_array(c.token_ids, "token_ids").size <= 4 for c in reply.completions)


@pytest.mark.parametrize(("request_", "code", "field"), [
    # The request that grew the service to gigabytes: max_new_tokens far past what the worker generates.
    pytest.param(generate(n=2, max_new_tokens=2**31 - 1), TOO_LARGE, "sampling.max_new_tokens", id="max_new_tokens"),
    pytest.param(generate(n=9), TOO_LARGE, "sampling.n", id="n"),
    pytest.param(generate(prompts=[MESSAGES] * 9), TOO_LARGE, "prompts", id="prompt count"),
    pytest.param(generate(prompts=[MESSAGES] * 3, n=3), TOO_LARGE, "sampling.n", id="n x prompts"),
    pytest.param(generate(stop=["a", "b", "c"]), TOO_LARGE, "sampling.stop", id="stop count"),
    pytest.param(generate(stop=["a", "\u00e9" * 9]), TOO_LARGE, "sampling.stop[1]", id="stop bytes"),
    pytest.param(generate(prompts=[MESSAGES, json.dumps([{"role": "user", "content": "x" * 5000}])]), TOO_LARGE,
                 "prompts[1]", id="prompt bytes"),
    pytest.param(generate(prompts=["7 " * 200], raw=True), TOO_LARGE, "prompts[0]", id="raw prompt tokens"),
    pytest.param(generate(prompts=[json.dumps([{"role": "system", "content": "y" * 2000},
                                               {"role": "user", "content": "1"}])]),
                 TOO_LARGE, "prompts[0]", id="uncuttable chat prompt"),
    # What answered UNKNOWN: chat JSON that is not a list of messages, NaN temperature, top_k -5, an empty stop
    # string, a raw prompt of no tokens.
    pytest.param(generate(prompts=['["a", "b"]']), INVALID, "prompts[0]", id="list of strings"),
    pytest.param(generate(prompts=[MESSAGES, json.dumps([{"role": "user"}])]), INVALID, "prompts[1]",
                 id="message without content"),
    pytest.param(generate(prompts=[json.dumps({"role": 3, "content": "x"})]), INVALID, "prompts[0]",
                 id="role not a string"),
    pytest.param(generate(prompts=["[" * 1500 + "]" * 1500]), INVALID, "prompts[0]", id="deep nesting"),
    pytest.param(generate(temperature=float("nan")), INVALID, "sampling.temperature", id="temperature nan"),
    pytest.param(generate(temperature=float("inf")), INVALID, "sampling.temperature", id="temperature inf"),
    pytest.param(generate(top_p=float("nan")), INVALID, "sampling.top_p", id="top_p nan"),
    pytest.param(generate(top_k=-5), INVALID, "sampling.top_k", id="top_k -5"),
    pytest.param(generate(stop=["a", ""]), INVALID, "sampling.stop[1]", id="empty stop"),
    pytest.param(generate(prompts=[""], raw=True), INVALID, "prompts[0]", id="raw prompt of no tokens"),
    pytest.param(generate(prompts=[]), INVALID, "prompts", id="no prompts"),
    pytest.param(generate(n=-1), INVALID, "sampling.n", id="negative n"),
    pytest.param(generate(max_new_tokens=-3), INVALID, "sampling.max_new_tokens", id="negative max_new_tokens"),
])
def test_bad_request_is_refused_naming_the_field_and_the_next_call_answers(rollout, request_, code, field):
    _, stub = rollout
    refused = refusal(stub, request_)
    assert (refused.code(), refused.details().split(":")[0]) == (code, field), refused.details()
    assert len(refused.details()) < 1000, "the refusal does not echo the request"
    assert_normal_call_answers(stub)


def test_limits_are_inclusive_and_default_to_the_worker_s_own(rollout):
    _, stub = rollout
    reply = stub.Generate(generate(prompts=[MESSAGES] * 4, n=2, temperature=1.0, max_new_tokens=MAX_NEW_TOKENS,
                                   stop=["z", "y" * 16]), timeout=60)
    assert len(reply.completions) == 8
    assert len(stub.Generate(generate(prompts=["7 " * 20], raw=True, max_new_tokens=2), timeout=60).completions) == 1
    # requests.max_new_tokens is not set: the run spec's max_new_tokens bounds the call.
    assert refusal(stub, generate(max_new_tokens=MAX_NEW_TOKENS + 1)).code() == TOO_LARGE
    limits = RolloutServiceConfig(model={"path": "unused"}, generation={"prompts_per_batch": 3}).generate_limits(
        RunSpec(num_generations=4, max_new_tokens=100))
    assert (limits.max_samples, limits.max_new_tokens) == (12, 100)


def test_status_pause_and_resume_answer_whatever_they_are_sent(rollout):
    _, stub = rollout
    for _ in range(2):
        stub.Pause(rollout_pb2.PauseRequest(), timeout=5)
    assert stub.Status(rollout_pb2.RolloutStatusRequest(), timeout=5).paused
    # Generate does not wait for the loop: a paused worker still answers it.
    assert_normal_call_answers(stub)
    for _ in range(2):
        stub.Resume(rollout_pb2.ResumeRequest(), timeout=5)
    status = stub.Status(rollout_pb2.RolloutStatusRequest(), timeout=5)
    assert not status.paused and status.worker_id == "edges" and status.engine == "transformers"


def test_calls_beyond_max_calls_are_refused_while_the_engine_is_busy(rollout):
    host, stub = rollout
    calls = host.generate_calls.limits.max_calls + 1
    with ThreadPoolExecutor(calls) as pool:
        # The worker's loop holds the engine while it generates: every call waits for it, holding its place.
        with host.worker.engine_lock:
            futures = [pool.submit(stub.Generate, generate(max_new_tokens=2), timeout=60) for _ in range(calls)]
            done, waiting = wait(futures, timeout=60, return_when=FIRST_COMPLETED)
            (first,) = done
            refused = first.exception()
            assert refused is not None and refused.code() == TOO_LARGE, refused
            assert "requests.max_calls" in refused.details()
        assert all(len(future.result(timeout=60).completions) == 1 for future in waiting)
    assert_normal_call_answers(stub)
