"""LoRA training: the config refuses what cannot work by name, only the adapters train, the weight sync carries the
adapters alone and a rollout engine that merges them computes the trainer's logits, each version replacing the
last; checkpoints are peft adapter folders that peft, the engine and a resumed trainer load."""

from __future__ import annotations

import time

import pytest
import torch
from strategy_helpers import make_tiny_model, strategy_config, summed_nll, token_batch
from sync_helpers import trainer_service

from zerobubble.common.clients.trainer import TrainerClient
from zerobubble.common.config import load_config
from zerobubble.common.lora_adapter import ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, LORA_SCALING
from zerobubble.common.weight_sync import Manifest
from zerobubble.rollout.engine import WeightLoadError
from zerobubble.rollout.engine_transformers import TransformersEngine
from zerobubble.rollout.weight_receiver import WeightReceiver
from zerobubble.trainer.checkpoints import Checkpoints, TrainerState
from zerobubble.trainer.config import TrainerServiceConfig
from zerobubble.trainer.lora import adapter_weights
from zerobubble.trainer.lora_config import LoraConfig
from zerobubble.trainer.strategies import make_strategy

peft = pytest.importorskip("peft", reason="LoRA training needs peft (pip install peft)")

LORA = LoraConfig(rank=4, alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture
def strategy(model_dir):
    strategy = make_strategy(strategy_config(lr=3e-2), model_dir, LORA)
    yield strategy
    strategy.close()


def train(strategy, steps: int) -> None:
    for step in range(steps):
        nll, count = summed_nll(strategy.model, token_batch(seed=step))
        strategy.backward(nll / count)
        strategy.step()


def logits(model, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=tokens, attention_mask=torch.ones_like(tokens)).logits.float()


def config(model_dir, **settings) -> TrainerServiceConfig:
    return load_config(TrainerServiceConfig, None, {"model": str(model_dir), **settings})


@pytest.mark.parametrize(("settings", "named"), [
    ({"lora.rank": 0}, "lora.rank"),
    ({"lora.target_modules": ["q_proj", "qkv_proj"]}, "lora.target_modules: 'qkv_proj'"),
    ({"lora.target_modules": []}, "lora.target_modules"),
    ({"lora.rank": 8, "strategy.name": "colossalai"}, "lora: needs strategy.name fsdp"),
])
def test_the_config_refuses_a_lora_that_cannot_work_by_its_field(model_dir, settings, named):
    with pytest.raises(Exception, match=named.replace(".", r"\.")):
        config(model_dir, **settings)


def test_lora_trains_the_adapters_alone_at_the_scaled_rate(model_dir, strategy):
    chosen = config(model_dir, **{"lora.rank": 8, "strategy.optim.lr": 1e-4})
    assert chosen.training_strategy().optim.lr == pytest.approx(1e-4 * chosen.lora.lr_scale)
    assert config(model_dir).training_strategy().optim.lr == pytest.approx(1e-6)  # full fine-tuning: as given

    trainable = [name for name, p in strategy.model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in name or ".lora_B." in name for name in trainable)
    in_optimizer = {id(p) for group in strategy.optimizer.param_groups for p in group["params"]}
    assert in_optimizer == {id(p) for p in strategy.model.parameters() if p.requires_grad}

    frozen = {name: p.detach().clone() for name, p in strategy.model.named_parameters() if not p.requires_grad}
    before = logits(strategy.model, token_batch(seed=99))
    train(strategy, 3)
    assert not torch.allclose(before, logits(strategy.model, token_batch(seed=99)))
    for name, p in strategy.model.named_parameters():
        if name in frozen:
            assert torch.equal(p, frozen[name]), f"the frozen {name} changed"


def test_the_sync_carries_only_the_adapters(model_dir, strategy):
    adapter = list(adapter_weights(strategy.model))
    # 2 layers x 3 targets, each A, B and its scaling, under the base model's names.
    assert len(adapter) == 2 * 3 * 3
    assert ("model.layers.1.mlp.down_proj.lora_A", (4, 64)) in [(n, tuple(t.shape)) for n, t in adapter]
    assert all(float(t) == 2.0 for n, t in adapter if n.endswith(LORA_SCALING))
    full = Manifest.plan(((n, t) for n, t in strategy.model.named_parameters() if "lora_" not in n), 1 << 20)
    assert Manifest.plan(adapter, 1 << 20).total_bytes < 0.2 * full.total_bytes


def receive(address: str, engine: TransformersEngine, version: int) -> None:
    with TrainerClient(address) as client:
        receiver = WeightReceiver(client, "w1", first_backoff_s=0.05).start()
        try:
            assert receiver.wait_for(version, timeout=60), "no version received"
            deadline = time.monotonic() + 10
            while not receiver.apply_to(engine):
                assert time.monotonic() < deadline, "the received adapter was never applied"
                time.sleep(0.01)
        finally:
            receiver.close()


def test_the_synced_adapter_merged_by_the_engine_gives_the_trainers_logits(model_dir, strategy):
    engine = TransformersEngine(model_dir, dtype="fp32")
    batch = token_batch(seed=7)
    for version, steps in ((1, 2), (2, 2)):
        train(strategy, steps)
        with trainer_service(bucket_mb=0.01) as trainer:
            trainer.broadcaster.publish(adapter_weights(strategy.model), version)
            receive(trainer.address, engine, version)
        assert engine.policy_version == version
        # Version 2 replaces version 1's adapter: merged onto the kept base, not onto the version-1 weights.
        torch.testing.assert_close(logits(engine.model, batch), logits(strategy.model, batch), rtol=0, atol=1e-5)


def test_an_adapter_that_drops_a_layer_gives_that_layer_its_base_back(model_dir, strategy):
    engine = TransformersEngine(model_dir, dtype="fp32")
    base = {name: p.detach().clone() for name, p in engine.model.named_parameters()}
    train(strategy, 2)
    adapter = list(adapter_weights(strategy.model))
    engine.load_weights(adapter, version=1)
    down = "model.layers.0.mlp.down_proj.weight"
    assert not torch.equal(engine.model.get_parameter(down), base[down])
    engine.load_weights([(n, t) for n, t in adapter if ".down_proj." not in n], version=2)
    assert torch.equal(engine.model.get_parameter(down), base[down])
    # Full weights are the new base: an adapter after them merges onto them.
    engine.load_weights(base.items(), version=3)
    engine.load_weights(adapter, version=4)
    torch.testing.assert_close(logits(engine.model, token_batch(seed=3)), logits(strategy.model, token_batch(seed=3)),
                               rtol=0, atol=1e-5)


@pytest.mark.parametrize(("spoil", "named"), [
    (lambda adapter: [(n, t) for n, t in adapter if not n.endswith("0.self_attn.q_proj.lora_B")],
     "model.layers.0.self_attn.q_proj.lora_B"),
    (lambda adapter: [(n.replace("q_proj", "nope_proj"), t) for n, t in adapter], "nope_proj"),
    (lambda adapter: [(n, t[:, :2] if n.endswith("lora_A") else t) for n, t in adapter], "lora_A"),
    (lambda adapter: adapter + [("model.layers.0.self_attn.q_proj.lora_C", torch.zeros(1))], "lora_C"),
])
def test_a_malformed_adapter_is_refused_by_name_and_changes_nothing(model_dir, strategy, spoil, named):
    engine = TransformersEngine(model_dir, dtype="fp32")
    before = {name: p.detach().clone() for name, p in engine.model.named_parameters()}
    train(strategy, 1)
    with pytest.raises(WeightLoadError, match=named):
        engine.load_weights(spoil(list(adapter_weights(strategy.model))), version=1)
    assert engine.policy_version == 0
    for name, p in engine.model.named_parameters():
        assert torch.equal(p, before[name]), name


def test_a_checkpoint_is_a_peft_adapter_that_peft_the_engine_and_a_resume_load(model_dir, strategy, tmp_path):
    train(strategy, 2)
    checkpoints = Checkpoints(tmp_path / "checkpoints")
    folder = checkpoints.save(strategy, TrainerState(step=2, policy_version=2))
    assert (folder / ADAPTER_WEIGHTS_FILE).is_file() and (folder / ADAPTER_CONFIG_FILE).is_file()
    assert not (folder / "model.safetensors").exists()
    batch = token_batch(seed=5)
    trained = logits(strategy.model, batch)

    from transformers import AutoModelForCausalLM

    loaded = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), folder).eval()
    torch.testing.assert_close(logits(loaded, batch), trained, rtol=0, atol=1e-5)
    # A LoRA checkpoint serves as a model folder (the run's final evaluation reads it so).
    torch.testing.assert_close(logits(TransformersEngine(folder, dtype="fp32").model, batch), trained,
                               rtol=0, atol=1e-5)

    resumed = make_strategy(strategy_config(lr=3e-2), model_dir, LORA)
    try:
        assert checkpoints.load(resumed).step == 2
        torch.testing.assert_close(logits(resumed.model, batch), trained, rtol=0, atol=0)
        assert resumed.steps == strategy.steps
        # Optimizer state came back too: the next update is the one the first run makes.
        train(strategy, 1)
        train(resumed, 1)
        torch.testing.assert_close(logits(resumed.model, batch), logits(strategy.model, batch), rtol=0, atol=1e-6)
    finally:
        resumed.close()
