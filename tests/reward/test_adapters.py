"""The adapters other frameworks call, loaded and called the way those frameworks do, against a running
`zerobubble serve reward` (with a bearer token, which the frameworks' own HTTP clients cannot send).

- verl 0.9.1: custom_reward_function.path "pkg://..." is imported (verl/utils/import_utils.py load_module),
  reward_kwargs are merged into the call (verl/trainer/ppo/reward.py _call_with_kwargs), and the reward
  manager calls compute_score(data_source=, solution_str=, ground_truth=, extra_info=) (reward_manager/naive.py),
  with reward_router_address= and reward_model_tokenizer= too when a reward model router is configured.
- OpenRLHF 0.11.2: a --reward.remote_url ending in .py is loaded with spec_from_file_location("reward_func", path)
  and reward_func(queries, prompts, labels) runs in asyncio.to_thread (openrlhf/utils/agent.py).
- TRL 1.16.0: GRPOTrainer calls reward_func(prompts=, completions=, completion_ids=, **columns) where columns
  are the dataset's other columns plus trainer_state, log_extra and log_metric (grpo_trainer.py
  _calculate_rewards). The real trainer runs in test_adapter_trl.py.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import socket
from functools import partial

import pytest
from http_helpers import serve_reward

from zerobubble.reward.adapters import RewardEndpoint, RewardServiceError
from zerobubble.reward.adapters import openrlhf as openrlhf_adapter
from zerobubble.reward.adapters.trl import TRLReward

TOKEN = "adapter-token"


@pytest.fixture(scope="module")
def served():
    with serve_reward(**{"server.auth_token": TOKEN}) as served:
        yield served


@pytest.fixture
def env(served, monkeypatch):
    monkeypatch.setenv("ZEROBUBBLE_REWARD_URL", served.url)
    monkeypatch.setenv("ZEROBUBBLE_AUTH_TOKEN", TOKEN)
    monkeypatch.delenv("ZEROBUBBLE_REWARD_VERIFIER", raising=False)
    return served


def _verl_reward_fn(reward_kwargs: dict):
    """verl's get_custom_reward_fn for path pkg://zerobubble.reward.adapters.verl, name compute_score."""
    raw_fn = importlib.import_module("zerobubble.reward.adapters.verl").compute_score

    def _call_with_kwargs(raw_fn, extra_kwargs, *args, **kwargs):
        return raw_fn(*args, **{**kwargs, **extra_kwargs})

    return partial(_call_with_kwargs, raw_fn, reward_kwargs)


def test_verl_compute_score(served, monkeypatch):
    monkeypatch.setenv("ZEROBUBBLE_AUTH_TOKEN", TOKEN)
    compute_score = _verl_reward_fn({"url": served.url, "verifier": "boxed"})
    right = compute_score(data_source="openai/gsm8k", solution_str="so \\boxed{72}", ground_truth="72",
                          extra_info={"index": 0, "num_turns": None, "rollout_reward_scores": {}})
    assert right == {"score": 1.0, "acc": 1.0, "format_ok": 1.0, "pred": "72"}
    several = compute_score(data_source="numina", solution_str="\\boxed{1} and \\boxed{-2}", ground_truth="-2, 1",
                            extra_info={}, reward_router_address="127.0.0.1:1", reward_model_tokenizer=None)
    assert several["score"] == 1.0
    wrong = compute_score(data_source="openai/gsm8k", solution_str="it is 71", ground_truth=72, extra_info=None)
    assert wrong == {"score": 0.0, "acc": 0.0, "format_ok": 0.0, "pred": ""}


def test_verl_reward_kwargs_pick_the_verifier(env):
    compute_score = _verl_reward_fn({"verifier": "think_answer_tags"})
    result = compute_score(data_source="x", solution_str="<think>a</think><answer>5</answer>", ground_truth="5",
                           extra_info={})
    assert result["score"] == 1.0 and result["format_ok"] == 1.0


def test_openrlhf_reward_func_file(env):
    spec = importlib.util.spec_from_file_location("reward_func", openrlhf_adapter.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    prompt = "Put the answer in \\boxed{}. 6*7="
    replies = [asyncio.run(asyncio.to_thread(module.reward_func, [prompt + response], [prompt], [label]))
               for response, label in ((" \\boxed{42}", "42"), (" 42", "42"))]
    assert [reply["rewards"] for reply in replies] == [[1.0], [0.0]]
    assert replies[0] == {"rewards": [1.0], "scores": [1.0], "extra_logs": {"answer_ok": [1.0], "format_ok": [1.0]}}


def test_openrlhf_reward_func_names_the_bad_field(env):
    with pytest.raises(RewardServiceError) as refused:
        openrlhf_adapter.reward_func(["q a"], ["q"], [{"not": "an answer"}])
    assert (refused.value.status, refused.value.field) == (400, "labels[0]")


def test_trl_reward_called_as_grpo_trainer_calls_it(env):
    reward = TRLReward(verifier="boxed")
    assert reward.__name__ == "zerobubble_boxed"
    columns = {"gt_answer": ["4", "4", "(1,2), (2,1)"], "trainer_state": object(), "log_extra": print,
               "log_metric": print}
    standard = reward(prompts=["2+2=", "2+2=", "pairs?"], completions=["\\boxed{4}", "\\boxed{5}",
                                                                        "\\boxed{(2,1)}, \\boxed{(1,2)}"],
                      completion_ids=[[1], [2], [3]], **columns)
    conversational = reward(
        prompts=[[{"role": "user", "content": "2+2="}]] * 3,
        completions=[[{"role": "assistant", "content": text}] for text in ("4", "\\boxed{4}", "\\boxed{(1,2)}")],
        completion_ids=[[1], [2], [3]], **columns)
    assert (standard, conversational) == ([1.0, 0.0, 1.0], [0.0, 1.0, 0.0])
    with pytest.raises(ValueError, match="no column 'answer'"):
        TRLReward(answer_column="answer")(prompts=["p"], completions=["c"], gt_answer=["1"])


def test_wrong_token_is_refused(env, monkeypatch):
    monkeypatch.setenv("ZEROBUBBLE_AUTH_TOKEN", "wrong")
    with pytest.raises(RewardServiceError) as refused:
        TRLReward()(prompts=["p"], completions=["\\boxed{1}"], gt_answer=["1"])
    assert (refused.value.status, refused.value.code) == (401, "UNAUTHENTICATED")


def test_every_call_has_a_deadline():
    # A socket that takes connections and never answers: the call ends at its deadline, retries included.
    with socket.create_server(("127.0.0.1", 0)) as silent:
        endpoint = RewardEndpoint(url=f"http://127.0.0.1:{silent.getsockname()[1]}", timeout=1.0)
        with pytest.raises(TimeoutError):
            endpoint.post("/v1/score", {"verifier": "boxed", "response": "x", "gt_answer": "1"})
