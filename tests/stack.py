"""Real services on loopback for the pipeline tests: reward, buffer, a tiny model and the arithmetic task."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zerobubble.buffer.app import build as build_buffer
from zerobubble.buffer.config import BufferServiceConfig
from zerobubble.common.config import load_config
from zerobubble.reward.app import build as build_reward
from zerobubble.reward.config import RewardServiceConfig
from zerobubble.tooling.tiny.model import make_tiny_model
from zerobubble.tooling.tiny.task import make_arithmetic_task

QUIET_SERVER = {"server.listen": "127.0.0.1:0", "server.metrics_port": None, "server.grace_seconds": 0.5}


def tiny_assets(directory: Path, *, train_size: int = 24, eval_size: int = 8) -> tuple[Path, Path, Path]:
    """(model dir, train.jsonl, eval.jsonl) made here: the 1m tiny model and a small arithmetic task."""
    model = make_tiny_model(directory / "model", size="1m", seed=0)
    train, held_out = make_arithmetic_task(directory / "task", train_size=train_size, eval_size=eval_size, seed=0)
    return model, train, held_out


def start_reward(**overrides: Any):
    settings = {**QUIET_SERVER, "math.workers": 1, "math.timeout_seconds": 5.0, **overrides}
    return build_reward(load_config(RewardServiceConfig, None, settings)).start()


def buffer_config(prompts: Path, wal: Path, **overrides: Any) -> BufferServiceConfig:
    settings = {**QUIET_SERVER, "prompts.path": str(prompts), "wal.directory": str(wal), "wal.fsync": "never",
                **overrides}
    return load_config(BufferServiceConfig, None, settings)


def start_buffer(prompts: Path, wal: Path, **overrides: Any):
    return build_buffer(buffer_config(prompts, wal, **overrides)).start()
