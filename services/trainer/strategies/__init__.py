"""Training back ends behind one `Strategy` API: `fsdp` (default, torch FSDP2) and `colossalai` (optional)."""

from __future__ import annotations

from pathlib import Path

from zerobubble.trainer.strategies.base import ColossalAIConfig, StepResult, Strategy, StrategyConfig

__all__ = ["ColossalAIConfig", "StepResult", "Strategy", "StrategyConfig", "make_strategy"]


def make_strategy(config: StrategyConfig, model_dir: Path) -> Strategy:
    """The configured back end with the HF model in `model_dir` loaded, its optimizer and schedule made."""
    if config.name == "colossalai":
        from zerobubble.trainer.strategies.colossalai import ColossalAIStrategy

        return ColossalAIStrategy(config, model_dir)
    from zerobubble.trainer.strategies.fsdp import FSDPStrategy

    return FSDPStrategy(config, model_dir)
