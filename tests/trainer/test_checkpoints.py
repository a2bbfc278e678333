"""Checkpoints: a round trip restores weights, optimizer, schedule and RNG; a crash mid-write leaves the
previous checkpoint named and loadable; HF loads the weights; retention; FSDP2 on two ranks."""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from strategy_helpers import make_tiny_model, strategy_config, summed_nll, token_batch, two_rank_run
from transformers import AutoModelForCausalLM, AutoTokenizer

from zerobubble.trainer import checkpoints as checkpoint_module
from zerobubble.trainer.checkpoints import Checkpoints, TrainerState, latest_checkpoint
from zerobubble.trainer.strategies import make_strategy

HELPERS = Path(__file__).parent


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture
def strategy(model_dir):
    strategy = make_strategy(strategy_config(warmup_steps=3), model_dir)
    yield strategy
    strategy.close()


def train(strategy, steps: int, seed: int = 0) -> None:
    for step in range(steps):
        nll, count = summed_nll(strategy.model, token_batch(seed=seed + step))
        strategy.backward(nll / count)
        strategy.step()


def weights(strategy) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in strategy.full_state_dict()}


def draws() -> tuple:
    return torch.rand(4).tolist(), np.random.rand(4).tolist(), [random.random() for _ in range(4)]


def assert_same_weights(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> None:
    assert first.keys() == second.keys()
    for name in first:
        assert torch.equal(first[name], second[name]), name


def test_round_trip_restores_weights_optimizer_schedule_and_rng(strategy, tmp_path):
    train(strategy, 2)
    store = Checkpoints(tmp_path / "checkpoints")
    path = store.save(strategy, TrainerState(step=2, policy_version=2, buffer_delivery=5, extra={"epoch": 1}))
    assert path.name == "step-000002" and store.latest() == path
    saved_weights = weights(strategy)
    saved_moments = {k: v["exp_avg_sq"].clone() for k, v in strategy.optimizer.state_dict()["state"].items()}
    after_save = draws()
    train(strategy, 1, seed=10)
    after_save_weights = weights(strategy)
    torch.manual_seed(999)
    np.random.seed(999)
    random.seed(999)

    state = store.load(strategy)
    assert state == TrainerState(step=2, policy_version=2, buffer_delivery=5, extra={"epoch": 1})
    assert strategy.steps == 2
    assert_same_weights(weights(strategy), saved_weights)
    restored_moments = strategy.optimizer.state_dict()["state"]
    for key, moment in saved_moments.items():
        assert torch.equal(restored_moments[key]["exp_avg_sq"], moment)
    assert draws() == after_save
    # The same update again (warm-up lr, Adam moments and step counts all restored) gives the same weights.
    train(strategy, 1, seed=10)
    assert_same_weights(weights(strategy), after_save_weights)


def test_checkpoint_is_an_hf_model_folder(strategy, tmp_path):
    train(strategy, 1)
    path = Checkpoints(tmp_path).save(strategy, TrainerState(step=1))
    loaded = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ours = weights(strategy)
    for name, tensor in loaded.state_dict().items():
        # The tied output head is saved once, under the embedding's name.
        source = "model.embed_tokens.weight" if name == "lm_head.weight" else name
        assert torch.equal(tensor, ours[source]), name
    tokenizer = AutoTokenizer.from_pretrained(path)
    text = "12 + 30 = \\boxed{42}\n"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text


def test_retention_keeps_the_newest(strategy, tmp_path):
    store = Checkpoints(tmp_path, keep=2)
    for step in range(1, 5):
        store.save(strategy, TrainerState(step=step))
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-000003", "step-000004"]
    assert (tmp_path / "latest").read_text().strip() == "step-000004"


def test_exception_mid_write_leaves_the_previous_checkpoint(strategy, tmp_path, monkeypatch):
    store = Checkpoints(tmp_path)
    train(strategy, 1)
    first = store.save(strategy, TrainerState(step=1))
    first_weights = weights(strategy)
    train(strategy, 1, seed=5)

    def fail(*args):
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint_module, "copy_model_files", fail)
    with pytest.raises(OSError, match="disk full"):
        store.save(strategy, TrainerState(step=2))
    assert (tmp_path / ".step-000002.partial").is_dir()
    assert latest_checkpoint(tmp_path) == first and not (tmp_path / "step-000002").exists()
    assert store.load(strategy).step == 1
    assert_same_weights(weights(strategy), first_weights)
    monkeypatch.undo()
    store.save(strategy, TrainerState(step=2))
    assert not (tmp_path / ".step-000002.partial").exists() and store.latest().name == "step-000002"


def test_killed_writer_leaves_the_previous_checkpoint(model_dir, tmp_path):
    """A process killed (SIGKILL) while it writes step 2: step 1 stays named by `latest` and loads."""
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(HELPERS)!r})
        from strategy_helpers import strategy_config
        from zerobubble.trainer import checkpoints
        from zerobubble.trainer.checkpoints import Checkpoints, TrainerState
        from zerobubble.trainer.strategies import make_strategy

        strategy = make_strategy(strategy_config(), {str(model_dir)!r})
        store = Checkpoints({str(tmp_path)!r})
        store.save(strategy, TrainerState(step=1, policy_version=1))

        def stall(*args):
            print("writing", flush=True)
            time.sleep(600)

        checkpoints.copy_model_files = stall
        store.save(strategy, TrainerState(step=2, policy_version=2))
    """)
    writer = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "writing"
    finally:
        writer.kill()
        writer.wait()
    assert (tmp_path / ".step-000002.partial" / "model.safetensors").is_file()  # really killed mid-write
    path = latest_checkpoint(tmp_path)
    assert path == tmp_path / "step-000001"
    strategy = make_strategy(strategy_config(), model_dir)
    assert Checkpoints(tmp_path).load(strategy) == TrainerState(step=1, policy_version=1)
    strategy.close()


def test_broken_latest_pointer_falls_back_to_the_newest_complete(strategy, tmp_path):
    store = Checkpoints(tmp_path, keep=5)
    for step in (1, 2):
        store.save(strategy, TrainerState(step=step))
    (tmp_path / "latest").write_text("step-000009\n")
    assert latest_checkpoint(tmp_path) == tmp_path / "step-000002"
    assert latest_checkpoint(tmp_path / "nothing-here") is None


def test_fsdp_two_ranks_save_full_weights_and_load_on_both():
    ranks = two_rank_run()
    checkpoint = ranks[0]["run_dir"] / "checkpoints" / "step-000002"
    assert latest_checkpoint(checkpoint.parent) == checkpoint
    loaded = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).state_dict()
    for name, tensor in ranks[0]["full"].items():
        assert torch.equal(loaded[name], tensor), name
    for rank in ranks:
        assert rank["state"] == TrainerState(step=2, policy_version=2, buffer_delivery=7, extra={"rank_seen": 2})
        assert_same_weights(rank["restored"], rank["saved"])
        after_save, after_load = rank["draws"]
        assert torch.equal(after_save, after_load)
        third, third_again = rank["third"]
        assert third == third_again and third_again.step == 3
        assert_same_weights(*rank["third_weights"])
    # Each rank restored its own RNG stream.
    assert not torch.equal(ranks[0]["draws"][1], ranks[1]["draws"][1])
