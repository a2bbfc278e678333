"""Training back ends behind one `Strategy` API: `fsdp` (default, torch FSDP2) and `colossalai` (optional)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from zerobubble.trainer.strategies.base import StepResult, Strategy
from zerobubble.trainer.strategy_config import ColossalAIConfig, StrategyConfig

if TYPE_CHECKING:
    from zerobubble.trainer.lora_config import LoraConfig

__all__ = ["ColossalAIConfig", "StepResult", "Strategy", "StrategyConfig", "make_strategy"]


def make_strategy(config: StrategyConfig, model_dir: Path, lora: LoraConfig | None = None) -> Strategy:
    """The configured back end with the HF model in `model_dir` loaded (with LoRA adapters when `lora` is given:
    fsdp only), its optimizer and schedule made."""
    if config.name == "colossalai":
        if lora is not None:
            raise ValueError("lora needs strategy.name fsdp")
        from zerobubble.trainer.strategies.colossalai import ColossalAIStrategy

        return ColossalAIStrategy(config, model_dir)
    from zerobubble.trainer.strategies.fsdp import FSDPStrategy

    return FSDPStrategy(config, model_dir, lora)
