"""LoRA training: low-rank adapters (peft) on a frozen base, the adapter as the weight sync sends it, and the
adapter of a checkpoint read back.

peft is imported only when `lora` is configured.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from transformers import AutoConfig, AutoModelForCausalLM

from zerobubble.common.lora_adapter import (
    ADAPTER_WEIGHTS_FILE,
    LORA_A,
    LORA_B,
    LORA_SCALING,
    PEFT_PREFIX,
    adapter_tensor_name,
)
from zerobubble.trainer.lora_config import LoraConfig

ADAPTER_NAME = "default"


def check_target_modules(config: LoraConfig, model_dir: Path) -> None:
    """Each target must name at least one linear layer of the model; the model is built on the meta device, so this
    costs no memory. Raises ValueError naming the field."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    linear = [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    for target in config.target_modules:
        if not any(name == target or name.endswith("." + target) for name in linear):
            endings = sorted({name.rsplit(".", 1)[-1] for name in linear})
            raise ValueError(f"lora.target_modules: {target!r} is no linear layer of {model_dir} "
                             f"(its linear layers end in: {', '.join(endings)})")


def peft_config(config: LoraConfig):
    """peft's LoraConfig for `config` (also for adding a named adapter beside others, as the Tinker front does)."""
    from peft import LoraConfig as PeftLoraConfig

    return PeftLoraConfig(r=config.rank, lora_alpha=config.alpha, lora_dropout=config.dropout,
                          target_modules=list(config.target_modules), bias="none", task_type="CAUSAL_LM")


def wrap(model: nn.Module, config: LoraConfig, adapter_name: str = ADAPTER_NAME) -> nn.Module:
    """The model with adapters on its target layers; only the adapters train."""
    from peft import get_peft_model

    # The adapter's config names its base; an absolute path lets it load from anywhere.
    if Path(model.name_or_path).is_dir():
        model.name_or_path = str(Path(model.name_or_path).resolve())
    return get_peft_model(model, peft_config(config), adapter_name=adapter_name)


def adapter_weights(model: nn.Module, adapter_name: str = ADAPTER_NAME) -> Iterator[tuple[str, torch.Tensor]]:
    """The adapter as the weight sync sends it (see zerobubble.common.lora_adapter): A, B and the scaling of each
    adapted layer, under the base model's module names. Sharded adapters are gathered, so every rank must consume
    the whole iterator."""
    from peft.tuners.lora import LoraLayer

    for name, module in model.named_modules():
        if not isinstance(module, LoraLayer) or adapter_name not in module.lora_A:
            continue
        base_name = name.removeprefix(PEFT_PREFIX)
        for part, layer in ((LORA_A, module.lora_A[adapter_name]), (LORA_B, module.lora_B[adapter_name])):
            weight = layer.weight
            full = weight.full_tensor() if isinstance(weight, DTensor) else weight
            yield adapter_tensor_name(base_name, part), full.detach()
        scaling = torch.tensor(module.scaling[adapter_name], dtype=torch.float32)
        yield adapter_tensor_name(base_name, LORA_SCALING), scaling


def read_checkpoint_adapter(directory: Path) -> dict[str, torch.Tensor]:
    """A checkpoint's adapter under the names the wrapped model's state dict uses (peft's file leaves out the
    adapter's name: `...q_proj.lora_A.weight` is `...q_proj.lora_A.default.weight` in the model)."""
    from safetensors.torch import load_file

    weights = {}
    for key, tensor in load_file(Path(directory) / ADAPTER_WEIGHTS_FILE).items():
        stem, _, leaf = key.rpartition(".")
        weights[f"{stem}.{ADAPTER_NAME}.{leaf}"] = tensor
    return weights
