"""A LoRA adapter as the weight sync sends it and as a checkpoint stores it, and merging it into base weights.

A trainer with `lora` set publishes, in place of the full weights, three tensors per adapted linear layer, named
after the layer's module M in the model's own (HF) names: `M.lora_A` (rank x in), `M.lora_B` (out x rank) and
`M.lora_scaling` (one float32: alpha / rank). An engine computes `M.weight` = base + scaling * B @ A from a base
it keeps apart (`AdapterMerger`), so each version replaces the previous adapter instead of adding to it.

Checkpoints hold the adapter in peft's own format (`adapter_model.safetensors`, `adapter_config.json`); reading one
needs no peft, so a rollout environment without it can serve a checkpoint (`read_peft_adapter`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

LORA_A = "lora_A"
LORA_B = "lora_B"
LORA_SCALING = "lora_scaling"
PARTS = (LORA_A, LORA_B, LORA_SCALING)
ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
# peft's names are the wrapped model's: this prefix, then the base model's module names.
PEFT_PREFIX = "base_model.model."

Named = tuple[str, torch.Tensor]


def adapter_tensor_name(module: str, part: str) -> str:
    return f"{module}.{part}"


def is_adapter(names: Iterable[str]) -> bool:
    """Whether named weights are an adapter (any LoRA part among them) rather than full weights."""
    return any(name.rsplit(".", 1)[-1] in PARTS for name in names)


@dataclass(frozen=True)
class LayerAdapter:
    a: torch.Tensor        # rank x in
    b: torch.Tensor        # out x rank
    scaling: float

    def delta(self) -> torch.Tensor:
        return self.scaling * (self.b.float() @ self.a.float())


def layer_adapters(weights: Iterable[Named]) -> dict[str, LayerAdapter]:
    """The adapter of each layer, keyed by the name of the weight it changes (`M.weight`). Raises ValueError
    naming the tensor when a part is missing, unknown, or of a shape that does not fit the others."""
    parts: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in weights:
        module, _, part = name.rpartition(".")
        if part not in PARTS or not module:
            raise ValueError(f"{name!r} is not a LoRA adapter tensor (expected a name ending in "
                             f"{', '.join('.' + p for p in PARTS)})")
        parts.setdefault(module, {})[part] = tensor
    layers = {}
    for module, found in parts.items():
        missing = [adapter_tensor_name(module, p) for p in PARTS if p not in found]
        if missing:
            raise ValueError(f"the adapter of {module!r} lacks {', '.join(missing)}")
        a, b, scaling = found[LORA_A], found[LORA_B], found[LORA_SCALING]
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1]:
            raise ValueError(f"{adapter_tensor_name(module, LORA_A)} {tuple(a.shape)} and "
                             f"{adapter_tensor_name(module, LORA_B)} {tuple(b.shape)} are not a rank-r pair")
        if scaling.numel() != 1 or not math.isfinite(float(scaling)):
            raise ValueError(f"{adapter_tensor_name(module, LORA_SCALING)} must be one finite number")
        layers[f"{module}.weight"] = LayerAdapter(a, b, float(scaling))
    return layers


class AdapterMerger:
    """Merged weights for each adapter version from a base kept apart: `base_of(name)` gives a layer's base weight
    the first time an adapter touches it (an engine reads its current weight or its model folder), and that copy
    is kept. A layer an earlier adapter changed and the new one does not goes back to its base."""

    def __init__(self, base_of: Callable[[str], torch.Tensor]):
        self._base_of = base_of
        self.bases: dict[str, torch.Tensor] = {}

    def merged(self, weights: Iterable[Named]) -> list[Named]:
        """(weight name, base + scaling * B @ A) for every adapted layer, in the base's dtype, and (name, base)
        for each layer only an earlier adapter touched. Nothing the engine holds is changed here."""
        layers = layer_adapters(weights)
        bases = {name: self.bases[name] if name in self.bases else self._base_of(name).detach().clone()
                 for name in layers}
        out = []
        for name, layer in layers.items():
            base = bases[name]
            if base.shape != (layer.b.shape[0], layer.a.shape[1]):
                module = name.removesuffix(".weight")
                raise ValueError(f"{module}.{LORA_B} {tuple(layer.b.shape)} @ {module}.{LORA_A} {tuple(layer.a.shape)} "
                                 f"does not fit the weight {name!r} {tuple(base.shape)}")
            out.append((name, (base.float() + layer.delta().to(base.device)).to(base.dtype)))
        out += [(name, base) for name, base in self.bases.items() if name not in layers]
        self.bases.update(bases)
        return out

    def forget(self) -> None:
        """Full weights were loaded: they are the base from now on."""
        self.bases = {}


def scaling_of(config: dict) -> float:
    """peft's scaling of a uniform adapter: alpha / rank (alpha / sqrt(rank) with rsLoRA)."""
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        raise ValueError("adapters with per-layer ranks or alphas (rank_pattern, alpha_pattern) are not supported")
    rank = config["r"]
    return config["lora_alpha"] / (math.sqrt(rank) if config.get("use_rslora") else rank)


def is_peft_adapter(directory: Path) -> bool:
    return (Path(directory) / ADAPTER_CONFIG_FILE).is_file()


def read_peft_adapter(directory: Path) -> tuple[Path, list[Named]]:
    """The base model's folder that a peft adapter folder names, and the adapter in the weight sync's names."""
    directory = Path(directory)
    config = json.loads((directory / ADAPTER_CONFIG_FILE).read_text())
    scaling = torch.tensor(scaling_of(config), dtype=torch.float32)
    named: list[Named] = []
    modules = []
    for key, tensor in load_file(directory / ADAPTER_WEIGHTS_FILE).items():
        # base_model.model.<module>.lora_A.weight
        stem = key.removeprefix(PEFT_PREFIX).removesuffix(".weight")
        module, _, part = stem.rpartition(".")
        if part not in (LORA_A, LORA_B):
            raise ValueError(f"{directory / ADAPTER_WEIGHTS_FILE}: {key!r} is not a LoRA weight")
        named.append((adapter_tensor_name(module, part), tensor))
        if part == LORA_A:
            modules.append(module)
    named += [(adapter_tensor_name(module, LORA_SCALING), scaling) for module in modules]
    return Path(config["base_model_name_or_path"]), named
