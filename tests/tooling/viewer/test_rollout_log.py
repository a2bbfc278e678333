"""What the trainer's rollout log holds for the viewer: each response's token ids, their text through the model's
own tokenizer, behaviour log-probs, length and the advantage the step trained it with; cut at
tracking.rollout_log.max_tokens, and none of the tokens with tokens off."""

from __future__ import annotations

import json
import statistics

import numpy as np
import pytest
from transformers import AutoTokenizer

from zerobubble.common.codec import encode_array
from zerobubble.tooling.tiny.model import make_tiny_model
from zerobubble.trainer.algorithms.presets import algorithm_config
from zerobubble.trainer.collate import collate
from zerobubble.trainer.config import TrainerServiceConfig
from zerobubble.trainer.tracking import ROLLOUT_LOG, Tracker
from zerobubble.trainer.update import sample_advantages
from zerobubble.v1 import common_pb2

GROUPS, GENERATIONS, MAX_TOKENS = 3, 4, 6


def group(index: int, vocab: int) -> common_pb2.ExperienceGroup:
    rng = np.random.default_rng(index)
    prompt = common_pb2.Prompt(prompt_id=f"q{index}", epoch=0, gt_answer="7", data_source=f"set{index % 2}",
                               messages_json=json.dumps([{"role": "user", "content": f"{index}+7="}]))
    trajectories = []
    for k in range(GENERATIONS):
        length = 3 + 2 * k + index  # some longer than MAX_TOKENS
        trajectories.append(common_pb2.Trajectory(
            response_ids=encode_array(rng.integers(3, vocab, length, dtype=np.int32)),
            behaviour_logprobs=encode_array(-rng.random(length, dtype=np.float32) * 4),
            reward=float((k + index) % 3 == 0), answer_ok=(k + index) % 3 == 0, policy_version=index,
            finish_reason=common_pb2.FINISH_REASON_LENGTH if k == 3 else common_pb2.FINISH_REASON_STOP,
            response_text=f"response {k}", temperature=1.0))
    return common_pb2.ExperienceGroup(prompt=prompt, prompt_ids=encode_array(np.array([1, 2], dtype=np.int32)),
                                      trajectories=trajectories)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", size="1m", seed=0)


def logged(run_dir, model, groups, advantages, **rollout_log) -> list[dict]:
    config = TrainerServiceConfig(model=str(model), run_dir=run_dir, tracking={
        "rollout_log": {"interval_steps": 1, "groups": len(groups), **rollout_log}})
    tracker = Tracker(config)
    tracker.log_step({"step": 1, "policy_version": 1}, groups, lambda: advantages)
    tracker.close()
    return [json.loads(line) for line in (run_dir / ROLLOUT_LOG).read_text().splitlines()]


def test_each_response_carries_its_tokens_their_text_log_probs_and_the_advantage_it_trained_with(tmp_path, model):
    tokenizer = AutoTokenizer.from_pretrained(model)
    groups = [group(i, tokenizer.vocab_size) for i in range(GROUPS)]
    advantages = sample_advantages(collate(groups, pad_id=0), algorithm_config("GRPO"), max_new_tokens=16)
    rows = logged(tmp_path, model, groups, advantages, max_tokens=MAX_TOKENS)

    assert sorted(row["prompt_id"] for row in rows) == [f"q{i}" for i in range(GROUPS)]
    cut = 0
    for row in rows:
        index = int(row["prompt_id"][1:])
        assert row["data_source"] == f"set{index % 2}"
        rewards = [t.reward for t in groups[index].trajectories]
        assert all("loss_mask" not in r and "episode" not in r for r in row["responses"])
        for k, (response, trajectory) in enumerate(zip(row["responses"], groups[index].trajectories, strict=True)):
            ids = np.frombuffer(trajectory.response_ids.data, dtype=np.int32).tolist()
            logprobs = np.frombuffer(trajectory.behaviour_logprobs.data, dtype=np.float32).tolist()
            assert response["length"] == len(ids)
            assert response["token_ids"] == ids[:MAX_TOKENS]
            assert response["logprobs"] == pytest.approx(logprobs[:MAX_TOKENS], abs=1e-4)
            assert response["tokens"] == [tokenizer.decode([i]) for i in ids[:MAX_TOKENS]]
            assert response.get("tokens_cut", False) == (len(ids) > MAX_TOKENS)
            cut += len(ids) > MAX_TOKENS
            # GRPO: the reward standardised within its group.
            expected = (rewards[k] - statistics.mean(rewards)) / (statistics.stdev(rewards) + 1e-4)
            assert response["advantage"] == pytest.approx(expected, abs=1e-4)
            assert response["finish_reason"] == ("FINISH_REASON_LENGTH" if k == 3 else "FINISH_REASON_STOP")
            assert "token_versions" not in response
    assert 0 < cut < GROUPS * GENERATIONS


def test_an_overlong_response_left_out_of_the_loss_has_no_advantage(model):
    groups = [group(i, 256) for i in range(GROUPS)]
    batch = collate(groups, pad_id=0)
    kept = sample_advantages(batch, algorithm_config("GRPO"), max_new_tokens=16)
    filtered = sample_advantages(batch, algorithm_config("GRPO", overlong_filtering=True), max_new_tokens=16)
    truncated = batch.truncated.tolist()
    assert any(truncated) and any(a != 0 for a, t in zip(kept, truncated, strict=True) if t)
    # The filter masks a truncated response out of the loss; the others keep the advantage they had.
    assert filtered == pytest.approx([0.0 if t else a for a, t in zip(kept, truncated, strict=True)], abs=1e-6)


def test_tokens_off_leaves_them_out(tmp_path, model):
    groups = [group(i, 256) for i in range(GROUPS)]
    rows = logged(tmp_path, model, groups, [0.0] * GROUPS * GENERATIONS, tokens=False)
    assert rows and all(set(r) == {"text", "reward", "answer_ok", "format_ok", "policy_version", "finish_reason",
                                   "length", "advantage"} for row in rows for r in row["responses"])


def test_an_episode_logs_its_loss_mask_and_how_it_went(tmp_path, model):
    episode = group(0, 256)
    trajectory = episode.trajectories[3]  # 9 tokens: the model's 2, an observation's 3, the model's 4
    trajectory.loss_mask.CopyFrom(encode_array(np.array([1, 1, 0, 0, 0, 1, 1, 1, 1], dtype=np.uint8)))
    trajectory.episode.CopyFrom(common_pb2.EpisodeInfo(environment="calculator", turns=2, tool_calls=1,
                                                       step_rewards=[0.0, 1.0], ended_reason="done"))
    rows = logged(tmp_path, model, [episode], [0.0] * GENERATIONS, max_tokens=5)
    responses = rows[0]["responses"]
    assert responses[3]["loss_mask"] == [1, 1, 0, 0, 0] and responses[3]["tokens_cut"]
    assert responses[3]["episode"]["turns"] == 2 and responses[3]["episode"]["ended_reason"] == "done"
    assert all("loss_mask" not in r and "episode" not in r for r in responses[:3])


@pytest.mark.skipif("version_spans" not in common_pb2.Trajectory.DESCRIPTOR.fields_by_name,
                    reason="this build's Trajectory has no version_spans: every token is its policy_version's")
def test_each_token_carries_the_version_of_its_span(tmp_path, model):
    spanned = group(0, 256)
    trajectory = spanned.trajectories[3]  # 9 tokens
    for start, version in ((0, 3), (2, 4), (5, 6)):
        trajectory.version_spans.add(start=start, version=version)
    rows = logged(tmp_path, model, [spanned], [0.0] * GENERATIONS)
    assert rows[0]["responses"][3]["token_versions"] == [3, 3, 4, 4, 4, 6, 6, 6, 6]
    assert "token_versions" not in rows[0]["responses"][0]
