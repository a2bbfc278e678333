"""The default back end: torch FSDP2 (`fully_shard` per decoder layer, then the root) across the data-parallel
group, or the plain module in one process. Runs on CPU with gloo and on GPUs with NCCL."""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM

from zerobubble.trainer import checkpoints, lora
from zerobubble.trainer.optim import clip_gradients, make_optimizer, make_scheduler
from zerobubble.trainer.strategies.base import StepResult, Strategy, StrategyConfig, join_data_parallel

_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


class FSDPStrategy(Strategy):
    def __init__(self, config: StrategyConfig, model_dir: Path, lora_config: lora.LoraConfig | None = None) -> None:
        super().__init__(config, model_dir)
        self.lora = lora_config
        self.owns_process_group = join_data_parallel(self.device)
        # Master weights stay fp32; a bf16 dtype is the compute dtype (FSDP's mixed precision, or autocast).
        model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32).to(self.device)
        if config.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
        if lora_config is not None:
            model = lora.wrap(model, lora_config)
        self._autocast_exit: contextlib.ExitStack | None = None
        if self.world_size > 1:
            self._shard(model)
        elif self.dtype != torch.float32:
            self._autocast_forward(model)
        self.model = model
        self.model.train()
        self.optimizer = make_optimizer(self.model.parameters(), config.optim)
        self.scheduler = make_scheduler(self.optimizer, config.optim)

    def _shard(self, model: nn.Module) -> None:
        mesh = init_device_mesh(self.device.type, (self.world_size,))
        policy = MixedPrecisionPolicy(param_dtype=self.dtype, reduce_dtype=torch.float32)
        layer_classes = set(getattr(model, "_no_split_modules", None) or [])
        for module in list(model.modules()):
            if type(module).__name__ in layer_classes:
                fully_shard(module, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        # Sum, not average: losses are normalised by global denominators (see base). A plain SUM reduction
        # also keeps gloo working, which lacks the PREMUL_SUM a custom divide factor would otherwise use.
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_gradient_divide_factor(1.0)
                module.set_force_sum_reduction_for_comms(True)

    def _autocast_forward(self, model: nn.Module) -> None:
        """One process in bf16: fp32 weights, forward under autocast (left even when forward raises)."""

        def enter(module: nn.Module, args: Any) -> None:
            stack = contextlib.ExitStack()
            stack.enter_context(torch.autocast(self.device.type, dtype=self.dtype))
            self._autocast_exit = stack

        def leave(module: nn.Module, args: Any, output: Any) -> None:
            if self._autocast_exit is not None:
                self._autocast_exit.close()
                self._autocast_exit = None

        model.register_forward_pre_hook(enter)
        model.register_forward_hook(leave, always_call=True)

    def backward(self, loss: Tensor) -> None:
        loss.backward()

    def step(self) -> StepResult:
        grad_norm = clip_gradients(self.model.parameters(), self.config.optim.max_grad_norm)
        lr = self.optimizer.param_groups[0]["lr"]
        skipped = not math.isfinite(grad_norm)
        if not skipped:
            self.optimizer.step()
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return StepResult(grad_norm=grad_norm, lr=lr, step=self.steps, skipped=skipped)

    def full_state_dict(self) -> Iterator[tuple[str, Tensor]]:
        seen: set[int] = set()
        parameter_ids = {name: id(p) for name, p in self.model.named_parameters(remove_duplicate=False)}
        for name, value in self.model.state_dict(keep_vars=True).items():
            key = parameter_ids.get(name, id(value))
            if key in seen:
                continue
            seen.add(key)
            tensor = value.full_tensor() if isinstance(value, DTensor) else value
            yield name, tensor.detach()

    def _tied_aliases(self) -> dict[str, str]:
        """Each weight name that shares its parameter with an earlier name -> that earlier name."""
        first: dict[int, str] = {}
        aliases = {}
        for name, parameter in self.model.named_parameters(remove_duplicate=False):
            if id(parameter) in first:
                aliases[name] = first[id(parameter)]
            else:
                first[id(parameter)] = name
        return aliases

    def save_weights_and_optimizer(self, directory: Path) -> None:
        weights = get_model_state_dict(self.model, options=_FULL)
        optimizer = get_optimizer_state_dict(self.model, self.optimizer, options=_FULL)
        if self.rank == 0:
            aliases = self._tied_aliases()
            unique = {name: tensor for name, tensor in weights.items() if name not in aliases}
            self.model.save_pretrained(directory, state_dict=unique)
            torch.save(optimizer, directory / checkpoints.OPTIMIZER_FILE)

    def load_weights_and_optimizer(self, directory: Path) -> None:
        weights: dict[str, Tensor] = {}
        optimizer: dict[str, Any] = {}
        if self.rank == 0:
            weights = self._read_weights(directory)
            optimizer = torch.load(directory / checkpoints.OPTIMIZER_FILE, weights_only=False)
        distributed = self.world_size > 1
        # An adapter checkpoint holds the adapters only: the frozen base stays as loaded.
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=distributed, strict=self.lora is None)
        set_model_state_dict(self.model, weights, options=options)
        set_optimizer_state_dict(self.model, self.optimizer, optimizer, options=options)

    def _read_weights(self, directory: Path) -> dict[str, Tensor]:
        if self.lora is not None:
            return lora.read_checkpoint_adapter(directory)
        weights = read_hf_weights(directory)
        for alias, name in self._tied_aliases().items():
            weights.setdefault(alias, weights[name])
        return weights


def read_hf_weights(directory: Path) -> dict[str, Tensor]:
    """Every tensor of an HF safetensors checkpoint, single file or sharded with an index."""
    index = directory / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else [
        "model.safetensors"
    ]
    weights: dict[str, Tensor] = {}
    for name in files:
        weights.update(load_file(directory / name))
    return weights
