"""The learning-rate schedule at hand-computed steps, configuration checks and gradient clipping."""

from __future__ import annotations

import math

import pytest
import torch

from zerobubble.common.config import ConfigError, load_config
from zerobubble.trainer.optim import OptimConfig, clip_gradients, lr_factor, make_optimizer, make_scheduler


def lrs_used(config: OptimConfig, steps: int) -> list[float]:
    """The learning rate each of the first `steps` updates of a real optimizer used."""
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = make_optimizer([parameter], config)
    scheduler = make_scheduler(optimizer, config)
    used = []
    for _ in range(steps):
        used.append(optimizer.param_groups[0]["lr"])
        parameter.grad = torch.ones(1)
        optimizer.step()
        scheduler.step()
    return used


def test_warmup_then_constant():
    config = OptimConfig(lr=2.0, warmup_steps=4, schedule="constant")
    assert lrs_used(config, 7) == pytest.approx([0.5, 1.0, 1.5, 2.0, 2.0, 2.0, 2.0])


def test_no_warmup_starts_at_full_rate():
    assert lrs_used(OptimConfig(lr=0.1), 2) == pytest.approx([0.1, 0.1])


def test_cosine_decays_once_to_the_floor_and_stays():
    config = OptimConfig(lr=1.0, warmup_steps=2, schedule="cosine", total_steps=10, min_lr_ratio=0.1)
    factor = lr_factor(config)
    expected = {
        0: 0.5,
        1: 1.0,
        2: 1.0,  # end of warm-up: the top of the cosine
        4: 0.1 + 0.45 * (1 + math.cos(math.pi / 4)),  # a quarter of the way: 0.868198
        6: 0.55,  # half way
        10: 0.1,
        15: 0.1,  # past total_steps: held at the floor, never rising again (no periodic restart)
    }
    for step, value in expected.items():
        assert factor(step) == pytest.approx(value), step
    used = lrs_used(config, 16)
    assert used[4] == pytest.approx(0.868198, abs=1e-6)
    assert all(later <= earlier + 1e-12 for earlier, later in zip(used[2:], used[3:], strict=False))


def test_cosine_needs_total_steps_beyond_warmup():
    with pytest.raises(ValueError, match="total_steps"):
        OptimConfig(schedule="cosine")
    with pytest.raises(ValueError, match="must exceed warmup_steps"):
        OptimConfig(schedule="cosine", warmup_steps=10, total_steps=10)


def test_unknown_field_is_refused():
    with pytest.raises(ConfigError, match="learning_rate"):
        load_config(OptimConfig, None, {"learning_rate": 1.0})


def test_clipping_bounds_the_norm_and_reports_the_norm_before():
    parameters = [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(4))]
    parameters[0].grad = torch.tensor([3.0, 0.0, 0.0])
    parameters[1].grad = torch.tensor([0.0, 4.0, 0.0, 0.0])
    assert clip_gradients(parameters, max_norm=1.0) == pytest.approx(5.0)
    after = torch.cat([p.grad for p in parameters]).norm().item()
    assert after == pytest.approx(1.0, rel=1e-4)
    assert parameters[0].grad[0].item() == pytest.approx(0.6, rel=1e-4)


def test_no_max_norm_measures_without_clipping():
    parameter = torch.nn.Parameter(torch.zeros(2))
    parameter.grad = torch.tensor([30.0, 40.0])
    assert clip_gradients([parameter], max_norm=None) == pytest.approx(50.0)
    assert parameter.grad.tolist() == [30.0, 40.0]


def test_small_gradients_are_left_alone():
    parameter = torch.nn.Parameter(torch.zeros(2))
    parameter.grad = torch.tensor([0.3, 0.4])
    assert clip_gradients([parameter], max_norm=1.0) == pytest.approx(0.5)
    assert parameter.grad.tolist() == pytest.approx([0.3, 0.4])


def test_weight_decay_shrinks_weight_matrices_but_not_biases_or_norm_weights():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))
    model.model.norm.weight.data.fill_(1.5)  # a norm gain away from 0, where decay would show
    frozen = model.model.layers[0].mlp.down_proj.weight
    frozen.requires_grad_(False)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer = make_optimizer(model.parameters(), OptimConfig(lr=0.5, weight_decay=0.2))
    for p in model.parameters():
        p.grad = torch.zeros_like(p) if p.requires_grad else None
    # With zero gradients AdamW's step is the decay alone: p * (1 - lr * weight_decay) = p * 0.9.
    optimizer.step()
    decayed, kept = set(), set()
    for name, p in model.named_parameters():
        if torch.equal(p, before[name]):
            kept.add(name)
        else:
            torch.testing.assert_close(p.detach(), before[name] * 0.9, msg=name)
            decayed.add(name)
    assert "model.layers.0.self_attn.q_proj.bias" in kept and "model.norm.weight" in kept
    assert "model.layers.0.input_layernorm.weight" in kept and "model.layers.0.mlp.down_proj.weight" in kept
    assert "model.layers.0.self_attn.q_proj.weight" in decayed and "model.embed_tokens.weight" in decayed
    assert all(p.ndim < 2 for name, p in model.named_parameters() if name in kept and p.requires_grad)
    assert all(p is not frozen for group in optimizer.param_groups for p in group["params"])
