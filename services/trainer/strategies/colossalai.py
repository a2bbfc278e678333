"""Optional back end for GPU hosts: ColossalAI's Booster with HybridParallelPlugin (tp/zero) and HybridAdam
(torch AdamW on CPU, where HybridAdam's kernel does not load).

ColossalAI 0.5.0 pins torch<=2.5.1; beside a newer torch (installed without its dependencies) only
tp_size=1, pp_size=1, zero_stage=0 trains, which is what runs on CPU. Checkpoints written by this back
end need a filesystem every rank sees (ColossalAI's checkpoint IO reads and writes on several ranks).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from transformers import AutoModelForCausalLM

from zerobubble.trainer.optim import decay_groups, make_optimizer, make_scheduler
from zerobubble.trainer.strategies.base import StepResult, Strategy, StrategyConfig, join_data_parallel

OPTIMIZER_DIR = "optimizer"


def _import_colossalai() -> dict[str, Any]:
    try:
        from colossalai.booster import Booster
        from colossalai.booster.plugin import HybridParallelPlugin
        from colossalai.checkpoint_io.utils import gather_distributed_param
        from colossalai.nn.optimizer import HybridAdam
    except ImportError as error:
        raise ImportError(
            "strategy 'colossalai' needs the optional colossalai extra: \"pip install -e '.[colossalai]'\" and "
            "'pip install --no-deps colossalai==0.5.0' (its own pins would replace torch), "
            f"or `make colossalai-env`: {error}"
        ) from error
    return {"Booster": Booster, "HybridParallelPlugin": HybridParallelPlugin, "HybridAdam": HybridAdam,
            "gather": gather_distributed_param}


class ColossalAIStrategy(Strategy):
    def __init__(self, config: StrategyConfig, model_dir: Path) -> None:
        super().__init__(config, model_dir)
        parallel = config.colossalai
        if parallel.pp_size != 1:
            raise ValueError("strategy.colossalai.pp_size must be 1: pipeline stages run forward and backward "
                             "inside booster.execute_pipeline, which the forward-then-backward API does not fit")
        cai = _import_colossalai()
        self._gather = cai["gather"]
        # ColossalAI needs a process group even for one process.
        self.owns_process_group = join_data_parallel(self.device, always=True)
        optim = config.optim
        plugin = cai["HybridParallelPlugin"](
            tp_size=parallel.tp_size,
            pp_size=1,
            zero_stage=parallel.zero_stage,
            precision="bf16" if self.dtype == torch.bfloat16 else "fp32",
            # inf: no clipping, but the norm is still computed and reported.
            max_norm=optim.max_grad_norm if optim.max_grad_norm is not None else math.inf,
            # Padding the vocabulary (to 64 by default) breaks tied embeddings; only TP needs it divisible.
            make_vocab_size_divisible_by=1 if parallel.tp_size == 1 else 64,
        )
        self.data_parallel_size = self.world_size // parallel.tp_size
        model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32)
        if config.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
        if self.device.type == "cuda":
            optimizer = cai["HybridAdam"](decay_groups(model.parameters(), optim.weight_decay), lr=optim.lr,
                                          betas=optim.betas, eps=optim.eps, adamw_mode=True)
        else:
            # HybridAdam's CPU kernel is built as a CUDA extension and refuses to load without CUDA.
            optimizer = make_optimizer(model.parameters(), optim)
        scheduler = make_scheduler(optimizer, optim)
        self.booster = cai["Booster"](plugin=plugin)
        self.model, self.optimizer, _, _, self.scheduler = self.booster.boost(model, optimizer,
                                                                               lr_scheduler=scheduler)
        self.model.train()

    def _module(self) -> torch.nn.Module:
        return self.model.unwrap()

    def backward(self, loss: Tensor) -> None:
        # ColossalAI averages gradients over data-parallel ranks; the strategy contract is a sum.
        self.booster.backward(loss * self.data_parallel_size, self.optimizer)

    def step(self) -> StepResult:
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad()
        norm = self.optimizer.get_grad_norm()
        grad_norm = float(norm) if norm is not None else math.nan
        return StepResult(grad_norm=grad_norm, lr=lr, step=self.steps, skipped=False)

    def full_state_dict(self) -> Iterator[tuple[str, Tensor]]:
        module = self._module()
        seen: set[int] = set()
        parameter_ids = {name: id(p) for name, p in module.named_parameters(remove_duplicate=False)}
        for name, value in module.state_dict(keep_vars=True).items():
            key = parameter_ids.get(name, id(value))
            if key in seen:
                continue
            seen.add(key)
            yield name, self._gather(value).detach()

    def save_weights_and_optimizer(self, directory: Path) -> None:
        weights = dict(self.full_state_dict())
        if self.rank == 0:
            self._module().save_pretrained(directory, state_dict={k: v.cpu() for k, v in weights.items()})
        self.barrier()
        self.booster.save_optimizer(self.optimizer, str(directory / OPTIMIZER_DIR), shard=True)

    def load_weights_and_optimizer(self, directory: Path) -> None:
        index = directory / "model.safetensors.index.json"
        weights = index if index.is_file() else directory / "model.safetensors"
        # Not strict: a tied weight is saved once, under its first name.
        self.booster.load_model(self.model, str(weights), strict=False)
        self.booster.load_optimizer(self.optimizer, str(directory / OPTIMIZER_DIR))
