"""Training checkpoints: `step-000123/` folders written atomically, a `latest` pointer, retention of the last K.

A checkpoint holds HF-format weights (safetensors, config.json and the model folder's tokenizer files, so
`AutoModelForCausalLM.from_pretrained` loads it), the optimizer and scheduler state, every rank's RNG
state and `trainer_state.json`. It is written into `.step-000123.partial/`, flushed, renamed, and only then
named by `latest` (itself replaced atomically), so a crash at any point leaves the previous checkpoint
usable and named.
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from zerobubble.trainer.strategies.base import Strategy

log = logging.getLogger(__name__)

STATE_FILE = "trainer_state.json"
OPTIMIZER_FILE = "optimizer.pt"
SCHEDULER_FILE = "scheduler.pt"
RNG_FILE = "rng.pt"
LATEST_FILE = "latest"
_NAME = re.compile(r"^step-(\d+)$")
# Weights and the model's own config are written from the trained model, never copied from the start.
_NOT_COPIED = re.compile(r"(\.safetensors|\.bin|\.pt|\.pth|\.index\.json|^config\.json)$")


@dataclass
class TrainerState:
    step: int
    policy_version: int = 0
    buffer_delivery: int = -1  # the last buffer delivery this checkpoint covers; -1: none yet
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TrainerState:
        return cls(**data)


def checkpoint_name(step: int) -> str:
    return f"step-{step:06d}"


def step_of(path: Path) -> int | None:
    match = _NAME.match(path.name)
    return int(match.group(1)) if match else None


def is_complete(path: Path) -> bool:
    return path.is_dir() and step_of(path) is not None and (path / STATE_FILE).is_file()


def latest_checkpoint(directory: Path) -> Path | None:
    """The checkpoint `latest` names; when that is missing or unusable, the complete one of the highest step."""
    directory = Path(directory)
    pointer = directory / LATEST_FILE
    if pointer.is_file():
        named = directory / pointer.read_text().strip()
        if is_complete(named):
            return named
        log.warning("%s names %s, which is not a complete checkpoint; using the newest complete one", pointer, named)
    complete = [path for path in directory.glob("step-*") if is_complete(path)]
    return max(complete, key=lambda path: step_of(path) or 0, default=None)


def capture_rng() -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def copy_model_files(model_dir: Path, directory: Path) -> None:
    """The model folder's tokenizer, chat template and generation files, so the checkpoint is a whole model."""
    for source in Path(model_dir).iterdir():
        target = directory / source.name
        if source.is_file() and not _NOT_COPIED.search(source.name) and not target.exists():
            shutil.copy2(source, target)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(directory: Path) -> None:
    for path in directory.rglob("*"):
        if path.is_file():
            _fsync(path)
    _fsync(directory)


class Checkpoints:
    """The checkpoints of one run in `directory`, keeping the newest `keep`."""

    def __init__(self, directory: Path, keep: int = 3) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.directory = Path(directory)
        self.keep = keep

    def save(self, strategy: Strategy, state: TrainerState) -> Path:
        """Collective: every rank calls it; rank 0 writes. Returns the checkpoint's folder."""
        final = self.directory / checkpoint_name(state.step)
        partial = self.directory / f".{final.name}.partial"
        if strategy.rank == 0:
            self.directory.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(partial, ignore_errors=True)
        strategy.save(partial, state.to_json())
        if strategy.rank == 0:
            _fsync_tree(partial)
            if final.exists():
                shutil.rmtree(final)
            os.replace(partial, final)
            self._point_latest_at(final)
            self.prune()
        strategy.barrier()
        return final

    def latest(self) -> Path | None:
        return latest_checkpoint(self.directory)

    def load(self, strategy: Strategy, path: Path | None = None) -> TrainerState | None:
        """Collective: restores `path` (default: the latest) into `strategy`; None when there is none."""
        path = path if path is not None else strategy.from_rank0(self.latest)
        if path is None:
            return None
        return TrainerState.from_json(strategy.load(path))

    def prune(self) -> None:
        """Deletes complete checkpoints beyond the newest `keep` and partial ones left by a crash."""
        for stale in self.directory.glob(".step-*.partial"):
            shutil.rmtree(stale, ignore_errors=True)
        latest = self.latest()
        complete = sorted((p for p in self.directory.glob("step-*") if is_complete(p)), key=lambda p: step_of(p) or 0)
        for old in complete[: -self.keep]:
            if old != latest:
                shutil.rmtree(old, ignore_errors=True)

    def _point_latest_at(self, checkpoint: Path) -> None:
        staged = self.directory / f".{LATEST_FILE}.tmp"
        with open(staged, "w") as f:
            f.write(checkpoint.name + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(staged, self.directory / LATEST_FILE)
        _fsync(self.directory)
