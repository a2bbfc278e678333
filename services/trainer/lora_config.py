"""The LoRA settings of the trainer, apart from lora.py so that reading a config imports no torch."""

from __future__ import annotations

from pydantic import Field

from zerobubble.common.config import Schema


class LoraConfig(Schema):
    rank: int = Field(8, gt=0, description="rank r of each adapter")
    alpha: float = Field(16.0, gt=0, description="the adapters' output is scaled by alpha / rank")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapters' input while training")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], min_length=1,
        description="names (or name endings) of the linear layers that get an adapter")
    lr_scale: float = Field(
        2.0, gt=0, description="the adapters learn at strategy.optim.lr times this. On the demo's small model "
        "adapters learned fastest at about 4e-4 (2 x 2e-4, 4 x the demo's 1e-4; 2e-3 and more made the policy "
        "collapse within 20 steps): its weights are small beside the update B @ A; models with a wide hidden size "
        "often want 10 or more")
