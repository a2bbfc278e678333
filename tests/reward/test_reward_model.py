"""The reward_model verifier with a tiny, randomly initialised sequence classifier made here (the tiny model's
tokenizer): scores match the model's own, batches match one-at-a-time, and it scores over gRPC, HTTP and
`zerobubble score`."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
import torch
from reward_helpers import start_reward
from transformers import AutoModelForSequenceClassification, AutoTokenizer, Qwen2ForSequenceClassification

from zerobubble.common.clients.reward import RewardClient, score_request
from zerobubble.common.config import ClientConfig, ConfigError, load_config
from zerobubble.reward.config import RewardServiceConfig
from zerobubble.tooling.tiny.model import make_tokenizer, tiny_config

PAIRS = [("<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n", "It is 4."),
         ("Q: name a colour.\nA: ", "blue"),
         ("", "a response without a prompt, longer than the others so that padding matters"),
         ("Q: what is 2+2?\nA: ", "It is 4.")]


def make_classifier(path, num_labels=1):
    tokenizer = make_tokenizer()
    config = tiny_config("1m", tokenizer)
    config.num_labels = num_labels
    torch.manual_seed(0)
    Qwen2ForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def expected_score(path, text):
    """The model's own score of one text, unbatched."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    with torch.inference_mode():
        return model(**tokenizer(text, return_tensors="pt", add_special_tokens=False)).logits[0, 0].item()


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return make_classifier(tmp_path_factory.mktemp("rm"))


@pytest.fixture(scope="module")
def service(model_path):
    app = start_reward(**{"reward_model": {"path": str(model_path), "batch_size": 4, "torch_threads": 1},
                          "combined_verifiers": [{"name": "boxed_and_rm", "parts": [
                              {"verifier": "boxed", "weight": 1.0}, {"verifier": "reward_model", "weight": 0.5}]}],
                          "http.listen": "127.0.0.1:0", "math.workers": 1})
    yield app
    app.stop(grace=1.0)


@pytest.fixture(scope="module")
def client(service):
    with RewardClient(ClientConfig(address=service.address, timeout_seconds=60)) as client:
        yield client


def test_scores_are_the_models_own(client, model_path):
    for prompt, response in PAIRS:
        result = client.score("reward_model", response, prompt=prompt)
        assert result.reward == pytest.approx(expected_score(model_path, prompt + response), abs=1e-4)
        assert result.answer_ok == (result.reward >= 0.0) and result.format_ok and result.reason == ""


def test_the_prompt_counts(client):
    a = client.score("reward_model", "It is 4.", prompt=PAIRS[0][0])
    b = client.score("reward_model", "It is 4.", prompt=PAIRS[3][0])
    assert a.reward != pytest.approx(b.reward, abs=1e-6)


def test_a_batch_is_scored_in_batches_and_matches_one_at_a_time(client, service):
    alone = [client.score("reward_model", response, prompt=prompt).reward for prompt, response in PAIRS]
    batches = service.reward_model.batches
    requests = [score_request("reward_model", response, prompt=prompt, id=str(i))
                for i, (prompt, response) in enumerate(PAIRS * 4)]
    together = [r.reward for r in client.score_batch(requests)]
    assert together == pytest.approx(alone * 4, abs=1e-4)
    # 16 items with batch_size 4: fewer forward passes than items, none over the batch size.
    assert 4 <= service.reward_model.batches - batches < 16


def test_combined_with_math(client, model_path):
    prompt, response = "Q: 1+1?\nA: ", "\\boxed{2}"
    result = client.score("boxed_and_rm", response, "2", prompt=prompt)
    assert result.reward == pytest.approx(1.0 + 0.5 * expected_score(model_path, prompt + response), abs=1e-4)


def test_listed(client):
    listed = {v.name: v for v in client.list_verifiers().verifiers}
    assert listed["reward_model"].ground_truth == "none" and listed["reward_model"].available


def test_over_http_v1_and_openrlhf(service, model_path):
    prompt, response = PAIRS[1]
    want = expected_score(model_path, prompt + response)

    def post(path, body):
        request = urllib.request.Request(f"{service.http.url}{path}", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as reply:
            return json.loads(reply.read())

    scored = post("/v1/score", {"verifier": "reward_model", "prompt": prompt, "response": response})
    assert scored["reward"] == pytest.approx(want, abs=1e-4)
    # OpenRLHF sends prompt + response as one query, and the prompts beside them.
    openrlhf = post("/get_reward?verifier=reward_model", {"query": [prompt + response], "prompts": [prompt]})
    assert openrlhf["rewards"] == [pytest.approx(want, abs=1e-4)]


def test_with_zerobubble_score(service, model_path):
    prompt, response = PAIRS[0]
    done = subprocess.run([sys.executable, "-m", "zerobubble", "score", "--server", service.address,
                           "--verifier", "reward_model", "--prompt", prompt, "--response", response, "--json"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["reward"] == pytest.approx(expected_score(model_path, prompt + response), abs=1e-4)


def test_a_model_with_several_outputs_is_refused(tmp_path):
    make_classifier(tmp_path, num_labels=2)
    with pytest.raises(ConfigError, match=r"reward_model.path: .* has 2 outputs"):
        start_reward(**{"reward_model": {"path": str(tmp_path)}, "math.workers": 1})


def test_a_folder_without_a_model_is_refused_by_name(tmp_path):
    with pytest.raises(ConfigError, match=r"reward_model.path: .*is not a model folder"):
        load_config(RewardServiceConfig, overrides={"reward_model": {"path": str(tmp_path)}})


def test_torch_is_not_imported_without_a_reward_model():
    code = ("import sys; from reward_helpers import start_reward; app = start_reward(**{'math.workers': 1}); "
            "app.stop(grace=0); print('torch' in sys.modules, 'transformers' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=__file__.rpartition("/")[0])
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False"]


def test_an_item_the_model_does_not_score_in_time_answers_timeout_and_the_next_is_scored(model_path):
    from zerobubble.reward.config import RewardModelConfig
    from zerobubble.reward.reward_model import RewardModelVerifier
    from zerobubble.reward.verifiers import ScoreItem

    verifier = RewardModelVerifier(RewardModelConfig(path=model_path, timeout_seconds=0.5, torch_threads=1))
    real_score, release = verifier.model.score, threading.Event()

    def stuck_once(texts):  # a forward pass that hangs until released, as a wedged device would
        verifier.model.score = real_score
        release.wait(30)
        return real_score(texts)

    verifier.model.score = stuck_once
    try:
        started = time.monotonic()
        verdict = verifier.check(ScoreItem(verifier="reward_model", prompt="Q: ", response="stuck"))
        assert verdict.reason == "timeout" and not verdict.answer_ok
        assert time.monotonic() - started < 5
        release.set()
        text = PAIRS[1][0] + PAIRS[1][1]
        scored = verifier.check(ScoreItem(verifier="reward_model", prompt=PAIRS[1][0], response=PAIRS[1][1]))
        assert scored.reason == "" and scored.reward == pytest.approx(expected_score(model_path, text), abs=1e-4)
    finally:
        release.set()
        verifier.close()
