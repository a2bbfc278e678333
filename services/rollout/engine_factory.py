"""Make a generation engine by name, so configuration can choose one without importing either."""

from __future__ import annotations

from pathlib import Path

import torch

from zerobubble.rollout.engine import Engine

ENGINE_KINDS = ("transformers", "vllm")


def vllm_available() -> bool:
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True


def make_engine(kind: str, model_dir: str | Path, *, device: str = "cpu", dtype: str | torch.dtype = "auto",
                seed: int = 0, **options) -> Engine:
    """An engine of `kind` over the HF-format model in `model_dir`; `options` go to that engine's constructor
    (both: prefix_on_new_weights; TransformersEngine: max_batch_size; VllmEngine: any `vllm.LLM` argument)."""
    if kind == "transformers":
        from zerobubble.rollout.engine_transformers import TransformersEngine

        return TransformersEngine(model_dir, device=device, dtype=dtype, seed=seed, **options)
    if kind == "vllm":
        if not vllm_available():
            raise RuntimeError("engine 'vllm' needs the vllm package: build its environment with `make vllm-env` "
                               "and run from .venv-vllm, or choose engine 'transformers'")
        from zerobubble.rollout.engine_vllm import VllmEngine

        return VllmEngine(model_dir, device=device, dtype=dtype, seed=seed, **options)
    raise ValueError(f"unknown engine {kind!r}; choose one of {', '.join(ENGINE_KINDS)}")
