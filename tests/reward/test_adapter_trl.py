"""TRL's GRPOTrainer trains the tiny model for two steps with the TRL adapter as its reward function, scored by a
running `zerobubble serve reward` over HTTP. Runs where trl is importable (`make test-trl` builds .venv-trl);
with ZEROBUBBLE_REQUIRE_TRL=1 a missing trl fails instead of skipping."""

from __future__ import annotations

import importlib.util
import os
from statistics import mean

import pytest
from http_helpers import serve_reward

from zerobubble.reward.adapters.trl import TRLReward
from zerobubble.reward.extraction import extract_boxed
from zerobubble.reward.math_judge import judge

REQUIRED = os.environ.get("ZEROBUBBLE_REQUIRE_TRL") == "1"
pytestmark = pytest.mark.skipif(importlib.util.find_spec("trl") is None and not REQUIRED,
                                reason="trl not importable (its own environment: `make test-trl`)")


class RecordedReward(TRLReward):
    """The adapter, keeping what TRL handed it and what it answered, call by call."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[list[str], list[str], list[float]]] = []

    def __call__(self, prompts, completions, **columns):
        rewards = super().__call__(prompts, completions, **columns)
        texts = [completion[-1]["content"] for completion in completions]
        self.calls.append((texts, list(columns["gt_answer"]), rewards))
        return rewards


def _expected(text: str, gold: str) -> float:
    """The boxed verifier's verdict, computed here without the service."""
    answer = extract_boxed(text).answer
    return float(answer is not None and judge(gold, answer)[0])


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # On a shared machine one intra-op thread is many times faster than spinning on busy cores.
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def warm_model(tmp_path_factory):
    from zerobubble.rollout.prompting import SYSTEM_PROMPTS
    from zerobubble.tooling.tiny.model import make_tiny_model
    from zerobubble.tooling.tiny.task import make_arithmetic_task, read_task
    from zerobubble.tooling.tiny.warm_start import warm_start

    folder = tmp_path_factory.mktemp("trl")
    model = make_tiny_model(folder / "model", size="1m", seed=0)
    train, _ = make_arithmetic_task(folder / "task", train_size=8, eval_size=1, seed=0)
    # A short supervised start on the same eight questions: the model writes \boxed{...}, right often enough
    # and wrong often enough at temperature 1 for both rewards to appear.
    warm_start(model, train, steps=120, batch_size=16, system_prompt=SYSTEM_PROMPTS["boxed"])
    return model, read_task(train)


def test_grpo_trainer_steps_with_the_adapter_as_reward(warm_model, tmp_path):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from zerobubble.rollout.prompting import SYSTEM_PROMPTS
    from zerobubble.tooling.tiny.task import chat_messages

    model_dir, rows = warm_model
    dataset = Dataset.from_list([{"prompt": chat_messages(row, SYSTEM_PROMPTS["boxed"]), "gt_answer": row.gt_answer}
                                 for row in rows])
    config = GRPOConfig(
        output_dir=str(tmp_path / "out"), max_steps=2, per_device_train_batch_size=8, num_generations=4,
        max_completion_length=12, learning_rate=1e-4, beta=0.0, logging_steps=1, save_strategy="no",
        report_to="none", use_cpu=True, bf16=False, seed=0, dataloader_num_workers=0,
    )
    with serve_reward() as served:
        reward = RecordedReward(served.url, verifier="boxed")
        trainer = GRPOTrainer(model=str(model_dir), reward_funcs=[reward], args=config, train_dataset=dataset)
        trainer.train()
    assert trainer.state.global_step == 2
    assert len(reward.calls) >= 2
    given = [(text, gold, got) for texts, golds, rewards in reward.calls
             for text, gold, got in zip(texts, golds, rewards, strict=True)]
    assert [got for _, _, got in given] == [_expected(text, gold) for text, gold, _ in given]
    assert {got for _, _, got in given} == {0.0, 1.0}, given
    # TRL trained on these rewards: what it logged under the adapter's name is their mean, step by step.
    logged = [entry["rewards/zerobubble_boxed/mean"] for entry in trainer.state.log_history
              if "rewards/zerobubble_boxed/mean" in entry]
    assert logged == pytest.approx([mean(rewards) for _, _, rewards in reward.calls][: len(logged)])
