"""AdamW, the learning-rate schedule (warm-up, then constant or one cosine decay) and gradient clipping."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.optim.lr_scheduler import LambdaLR

from zerobubble.trainer.strategy_config import OptimConfig


def lr_factor(config: OptimConfig) -> Callable[[int], float]:
    """The multiplier of `lr` for the update made after `step` completed steps (LambdaLR's convention).

    Warm-up reaches the full rate on its last step (step warmup_steps - 1), so no update is made at lr 0.
    The cosine then falls once from 1 at the end of warm-up to min_lr_ratio at total_steps and stays there.
    """
    warmup = config.warmup_steps
    floor = config.min_lr_ratio

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if config.schedule == "constant":
            return 1.0
        assert config.total_steps is not None
        progress = min(1.0, (step - warmup) / (config.total_steps - warmup))
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def decay_groups(parameters: Iterable[nn.Parameter], weight_decay: float) -> list[dict]:
    """AdamW parameter groups: matrices decay, vectors (biases, norm weights) do not.

    The transformers Trainer's convention: decaying a norm's gain or a bias pulls it towards 0, which is no
    regularisation of the function but a change of its scale. Frozen parameters (LoRA's base) are left out.
    """
    trainable = [p for p in parameters if p.requires_grad]
    groups = [{"params": [p for p in trainable if p.ndim >= 2], "weight_decay": weight_decay},
              {"params": [p for p in trainable if p.ndim < 2], "weight_decay": 0.0}]
    return [group for group in groups if group["params"]]


def make_optimizer(parameters: Iterable[nn.Parameter], config: OptimConfig) -> torch.optim.AdamW:
    # foreach kernels do not mix DTensors of different meshes; the per-parameter loop works for both.
    return torch.optim.AdamW(
        decay_groups(parameters, config.weight_decay),
        lr=config.lr,
        betas=config.betas,
        eps=config.eps,
        foreach=False,
    )


def make_scheduler(optimizer: torch.optim.Optimizer, config: OptimConfig) -> LambdaLR:
    return LambdaLR(optimizer, lr_factor(config))


def clip_gradients(parameters: Iterable[nn.Parameter], max_norm: float | None) -> float:
    """The global L2 norm of the gradients before clipping (all shards included), clipping when max_norm is set.

    With FSDP2 the gradients are DTensors and the norm is reduced over the mesh, so every rank gets the
    same value and scales its shards by the same factor.
    """
    grads = [p for p in parameters if p.grad is not None]
    if not grads:
        return 0.0
    if max_norm is None:
        norm = torch.nn.utils.get_total_norm([p.grad for p in grads], foreach=False)
    else:
        norm = torch.nn.utils.clip_grad_norm_(grads, max_norm, foreach=False)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    return float(norm)
