"""Generation with vLLM's offline engine (`vllm.LLM`), where vLLM is installed.

vLLM is imported when an engine is made, so this module imports without it. The engine runs in this
process (VLLM_ENABLE_V1_MULTIPROCESSING=0): that is what lets `load_weights` hand vLLM a Python iterator
of tensors for its in-place `reload_weights`, with no copy through another process.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import AutoTokenizer

from zerobubble.common.lora_adapter import AdapterMerger, is_adapter
from zerobubble.rollout.engine import (
    FINISH_LENGTH,
    FINISH_STOP,
    Sample,
    SamplingSettings,
    WeightLoadError,
    WeightSpec,
    resolve_dtype,
)

CPU_KV_CACHE_BYTES = 1 << 30


def checkpoint_weight_spec(model_dir: Path) -> WeightSpec:
    """Names and shapes of the safetensors checkpoint in model_dir (headers only), with the tied lm_head alias."""
    shapes: dict[str, tuple[int, ...]] = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(path, framework="pt") as checkpoint:
            for name in checkpoint.keys():
                shapes[name] = tuple(checkpoint.get_slice(name).get_shape())
    if not shapes:
        raise FileNotFoundError(f"no *.safetensors checkpoint in {model_dir}")
    config = json.loads((model_dir / "config.json").read_text())
    aliases = {}
    embed = next((name for name in shapes if name.endswith("embed_tokens.weight")), None)
    if config.get("tie_word_embeddings") and "lm_head.weight" not in shapes and embed is not None:
        aliases["lm_head.weight"] = embed
    return WeightSpec(shapes=shapes, aliases=aliases)


def request_seeds(seed: int | None, count: int) -> list[int | None]:
    """One seed per prompt of a call. vLLM seeds the i-th of a request's n samples with seed + i: one seed for every
    prompt would give all prompts the same n noise streams (and the next call, seed + 1, all but one of them again),
    so their samples move together: a batch holds the draws of a few streams, and a rare token such as
    end-of-sequence can be missing from all of it (0 stops in 256 samples on the tiny model, against about 30 with
    transformers). Seeds spread by a SeedSequence keep the streams apart."""
    if seed is None:
        return [None] * count
    return [int(s) for s in np.random.SeedSequence(seed).generate_state(count, dtype=np.uint32)]


class VllmEngine:
    name = "vllm"

    def __init__(self, model_dir: str | Path, *, device: str = "cpu", dtype: str | torch.dtype = "auto",
                 seed: int = 0, **llm_options):
        """`llm_options` go to `vllm.LLM` as they are (max_model_len, gpu_memory_utilization, ...). vLLM runs on
        the device of its platform build; `device` chooses CPU defaults (eager mode, a 1 GiB KV cache, no chunked
        prefill)."""
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        from vllm import LLM

        model_dir = Path(model_dir)
        on_cpu = torch.device(device).type == "cpu"
        options = {
            "model": str(model_dir),
            "dtype": str(resolve_dtype(dtype, device)).removeprefix("torch."),
            "seed": seed,
            "logprobs_mode": "processed_logprobs",
        }
        if on_cpu:
            # Chunked prefill stays off: when it splits a seeded request's prompt, vLLM rewinds that request's
            # generator offset, which CPU generators cannot do (the engine dies with "CPU Generator does not use
            # offset").
            options |= {"enforce_eager": True, "kv_cache_memory_bytes": CPU_KV_CACHE_BYTES,
                        "enable_chunked_prefill": False}
        options |= llm_options
        self.policy_version = 0
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.llm = LLM(**options)
        self._spec = checkpoint_weight_spec(model_dir)
        self._model_dir = model_dir
        # LoRA adapters merge into the model folder's weights, read when the first adapter comes.
        self._base: dict[str, torch.Tensor] | None = None
        self._adapters = AdapterMerger(lambda name: self._base_weights()[name])

    def _base_weights(self) -> dict[str, torch.Tensor]:
        if self._base is None:
            self._base = {}
            for path in sorted(self._model_dir.glob("*.safetensors")):
                self._base.update(load_file(path))
        return self._base

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingSettings) -> list[list[Sample]]:
        from vllm import SamplingParams, TokensPrompt

        if any(len(prompt) == 0 for prompt in prompts):
            raise ValueError("every prompt needs at least one token")
        params = [SamplingParams(
            n=sampling.n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=max(sampling.top_k, 0),
            max_tokens=sampling.max_new_tokens,
            stop=list(sampling.stop) or None,
            include_stop_str_in_output=True,
            seed=seed,
            logprobs=0,
            skip_special_tokens=True,
        ) for seed in request_seeds(sampling.seed, len(prompts))]
        requests = [TokensPrompt(prompt_token_ids=[int(t) for t in prompt]) for prompt in prompts]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        return [[self._sample(completion) for completion in sorted(out.outputs, key=lambda c: c.index)]
                for out in outputs]

    @staticmethod
    def _sample(completion) -> Sample:
        if completion.finish_reason not in (FINISH_STOP, FINISH_LENGTH):
            raise RuntimeError(f"vLLM ended a response with {completion.finish_reason!r}")
        ids = list(completion.token_ids)
        logprobs = [step[token].logprob for step, token in zip(completion.logprobs, ids, strict=True)]
        return Sample(token_ids=np.asarray(ids, dtype=np.int32), logprobs=np.asarray(logprobs, dtype=np.float32),
                      finish_reason=completion.finish_reason, text=completion.text)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Reload in place through vLLM; every weight is checked against the checkpoint's names and shapes first,
        so a refused load changes nothing. A LoRA adapter is merged here, on the rollout side, and loaded as
        full weights through the same path."""
        weights = list(weights)
        if is_adapter(name for name, _ in weights):
            weights = self._merged(weights)
        checked = [(name, tensor) for name, _, tensor in self._spec.check_all(weights)]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(checked)})
        # Cached prefix blocks hold keys and values computed by the old weights.
        self.llm.reset_prefix_cache()
        self.policy_version = version

    def _merged(self, adapter: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
        """Every weight of the model folder, with the adapted layers merged: vLLM fuses layers (q, k and v into one),
        and a reload that gave one part of a fused layer would leave the rest unloaded. The base is the model
        folder's, also after a full load (keeping a copy of every loaded weight would double host memory)."""
        try:
            merged = dict(self._adapters.merged(adapter))
        except (KeyError, ValueError) as exc:
            raise WeightLoadError(f"the adapter does not fit the model: {exc}") from None
        return [(name, merged.get(name, base)) for name, base in self._base_weights().items()]

    def close(self) -> None:
        if self.llm is not None:
            self.llm.llm_engine.engine_core.shutdown()
            self.llm = None
