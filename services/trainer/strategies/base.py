"""What the trainer loop needs from a training back end, and the parts every back end shares.

Gradients are SUMMED across data-parallel ranks (not averaged): a rank normalises its loss by the global
denominator (e.g. `all_reduce_sum` of its token count), so N ranks give the same update as one process
on the union of their data.
"""

from __future__ import annotations

import json
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor, nn

from zerobubble.trainer import checkpoints
from zerobubble.trainer.strategy_config import StrategyConfig

T = TypeVar("T")


@dataclass(frozen=True)
class StepResult:
    grad_norm: float  # before clipping
    lr: float  # the rate this update used
    step: int  # optimizer updates made so far, this one included
    skipped: bool  # the gradient norm was not finite: no update, gradients dropped


def select_device(choice: str) -> torch.device:
    if choice == "cpu" or (choice == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("strategy.device is 'cuda' but CUDA is not available")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(device)
    return device


def compute_dtype(choice: str, device: torch.device) -> torch.dtype:
    if choice == "bf16":
        return torch.bfloat16
    if choice == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def join_data_parallel(device: torch.device, always: bool = False) -> bool:
    """Joins torch.distributed's default group from the launcher's env:// variables when WORLD_SIZE > 1
    (with `always`, a one-process group otherwise). Returns whether this call created it.

    Only the default group is touched: the weight broadcaster builds its own groups from its own TCPStore.
    """
    if dist.is_initialized():
        return False
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
    if world_size > 1:
        dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
        return True
    if always:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        return True
    return False


class Strategy(ABC):
    """A model, its optimizer and schedule on this process's share of the data-parallel group.

    Call `model(input_ids=..., attention_mask=...).logits`, then `backward(loss)` (as often as there are
    micro-batches), then `step()`. `save`, `load` and `full_state_dict` are collective: every rank calls them.
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR

    def __init__(self, config: StrategyConfig, model_dir: Path) -> None:
        self.config = config
        self.model_dir = Path(model_dir)
        self.device = select_device(config.device)
        self.dtype = compute_dtype(config.dtype, self.device)
        self.owns_process_group = False

    @property
    def rank(self) -> int:
        return dist.get_rank() if dist.is_initialized() else 0

    @property
    def world_size(self) -> int:
        return dist.get_world_size() if dist.is_initialized() else 1

    @property
    def steps(self) -> int:
        """Optimizer updates made so far (restored by `load`)."""
        return self.scheduler.last_epoch

    @abstractmethod
    def backward(self, loss: Tensor) -> None: ...

    @abstractmethod
    def step(self) -> StepResult:
        """Clips the gradients to optim.max_grad_norm, updates the weights, advances the schedule and drops the
        gradients. The norm reported is the one before clipping, the same on every rank."""

    @abstractmethod
    def full_state_dict(self) -> Iterator[tuple[str, Tensor]]:
        """Full (unsharded) weights under their HF names, on this device, one tied weight once. Where nothing
        is sharded these are views of the live weights: copy them to keep a snapshot across a step.
        Collective: every rank must consume the whole iterator."""

    @abstractmethod
    def save_weights_and_optimizer(self, directory: Path) -> None:
        """Collective: HF-format weights and the optimizer state into `directory` (written by rank 0 at least)."""

    @abstractmethod
    def load_weights_and_optimizer(self, directory: Path) -> None:
        """Collective: restores what `save_weights_and_optimizer` wrote on every rank."""

    def all_reduce_sum(self, value: Tensor) -> Tensor:
        """The sum over data-parallel ranks (a new tensor; `value` is left as it was)."""
        if self.world_size == 1:
            return value.clone()
        total = value.detach().clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return total

    def all_reduce_max(self, value: Tensor) -> Tensor:
        """The largest value over data-parallel ranks (a new tensor)."""
        total = value.detach().clone()
        if self.world_size > 1:
            dist.all_reduce(total, op=dist.ReduceOp.MAX)
        return total

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()

    def save(self, directory: Path, extra: dict[str, Any]) -> None:
        """HF-format weights (with config and tokenizer files), optimizer, scheduler, every rank's RNG and
        `extra` (JSON) into `directory`. Collective; rank 0 writes."""
        directory = Path(directory)
        if self.rank == 0:
            directory.mkdir(parents=True, exist_ok=True)
        self.barrier()
        self.save_weights_and_optimizer(directory)
        rng_states = self.gather_objects(checkpoints.capture_rng())
        if self.rank == 0:
            checkpoints.copy_model_files(self.model_dir, directory)
            torch.save(self.scheduler.state_dict(), directory / checkpoints.SCHEDULER_FILE)
            torch.save(rng_states, directory / checkpoints.RNG_FILE)
            (directory / checkpoints.STATE_FILE).write_text(json.dumps(extra, indent=1, sort_keys=True))
        self.barrier()

    def load(self, directory: Path) -> dict[str, Any]:
        """Restores what `save` wrote (read on rank 0, sent to the others); returns its `extra`."""
        directory = Path(directory)
        self.load_weights_and_optimizer(directory)
        scheduler_state = self.from_rank0(lambda: torch.load(directory / checkpoints.SCHEDULER_FILE))
        self.scheduler.load_state_dict(scheduler_state)
        rng_states = self.from_rank0(lambda: torch.load(directory / checkpoints.RNG_FILE, weights_only=False))
        # A run resumed on more ranks than it saved gives the new ranks a saved rank's state.
        checkpoints.restore_rng(rng_states[self.rank % len(rng_states)])
        return self.from_rank0(lambda: json.loads((directory / checkpoints.STATE_FILE).read_text()))

    def from_rank0(self, read: Callable[[], T]) -> T:
        """`read()` on rank 0, its result on every rank (so only rank 0 needs the files)."""
        box: list[Any] = [read() if self.rank == 0 else None]
        if self.world_size > 1:
            dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather_objects(self, value: Any) -> list[Any]:
        """Every rank's `value`, in rank order (on every rank)."""
        if self.world_size == 1:
            return [value]
        values: list[Any] = [None] * self.world_size
        dist.all_gather_object(values, value)
        return values

    def close(self) -> None:
        """Ends the default process group if this strategy created it; one made by the caller stays."""
        self.barrier()
        if self.owns_process_group and dist.is_initialized():
            dist.destroy_process_group()
            self.owns_process_group = False

    def __enter__(self) -> Strategy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
