"""The trainer's back-end settings (strategy, optimizer, schedule), apart from the code that uses them: checking a
config must not import torch (`zerobubble up` refuses a mistake before it loads)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from zerobubble.common.config import Schema


class OptimConfig(Schema):
    lr: float = Field(1e-6, gt=0, description="peak learning rate (reached at the end of warm-up)")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas")
    eps: float = Field(1e-8, gt=0, description="AdamW epsilon")
    weight_decay: float = Field(0.01, ge=0, description="AdamW decoupled weight decay of the weight "
                                "matrices (biases and norm weights never decay)")
    warmup_steps: int = Field(0, ge=0, description="optimizer steps of linear warm-up from 0 to lr")
    schedule: Literal["constant", "cosine"] = Field(
        "constant", description="after warm-up: constant lr, or one cosine decay to min_lr_ratio * lr at total_steps"
    )
    total_steps: int | None = Field(None, gt=0, description="optimizer steps of the whole run (cosine needs it)")
    min_lr_ratio: float = Field(0.0, ge=0, le=1, description="cosine floor as a fraction of lr; held after total_steps")
    max_grad_norm: float | None = Field(1.0, gt=0, description="clip the global gradient norm to this; null: no clip")

    @model_validator(mode="after")
    def _cosine_has_an_end(self) -> OptimConfig:
        if self.schedule == "cosine":
            if self.total_steps is None:
                raise ValueError("schedule 'cosine' needs total_steps")
            if self.total_steps <= self.warmup_steps:
                raise ValueError(f"total_steps ({self.total_steps}) must exceed warmup_steps ({self.warmup_steps})")
        return self



class ColossalAIConfig(Schema):
    tp_size: int = Field(1, ge=1, description="tensor-parallel degree (GPU hosts)")
    pp_size: int = Field(1, ge=1, description="pipeline-parallel degree; only 1 fits the forward/backward API")
    zero_stage: Literal[0, 1, 2] = Field(0, description="ZeRO stage of the data-parallel optimizer (GPU hosts)")


class StrategyConfig(Schema):
    name: Literal["fsdp", "colossalai"] = Field("fsdp", description="training back end")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: cuda:LOCAL_RANK when CUDA is there")
    dtype: Literal["auto", "bf16", "fp32"] = Field(
        "auto", description="compute dtype; weights and optimizer state stay fp32. auto: bf16 on CUDA with bf16"
    )
    optim: OptimConfig = OptimConfig()
    gradient_checkpointing: bool = Field(False, description="recompute activations in backward to save memory")
    colossalai: ColossalAIConfig = ColossalAIConfig()
