"""Generation with vLLM's offline engine (`vllm.LLM`), where vLLM is installed.

vLLM is imported when an engine is made, so this module imports without it. The engine runs in this
process (VLLM_ENABLE_V1_MULTIPROCESSING=0): that is what lets `load_weights` hand vLLM a Python iterator
of tensors for its in-place `reload_weights`, with no copy through another process, and lets `generate` drive
vLLM's engine one step at a time, so that new weights land between two steps (services/rollout/in_flight.py).
"""

from __future__ import annotations

import itertools
import json
import os
import threading
from collections.abc import Callable, Iterable, Sequence
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
    SamplingError,
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


class _Pieces:
    """One request's output as vLLM hands it over step by step (RequestOutputKind.DELTA)."""

    def __init__(self):
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []
        self.text: list[str] = []
        self.finish_reason: str | None = None
        self.finished = False

    def add(self, completion, version: int, finished: bool) -> None:
        ids = list(completion.token_ids)
        self.ids += ids
        self.logprobs += [step[token].logprob for step, token in zip(completion.logprobs or [], ids, strict=True)]
        self.versions += [version] * len(ids)
        self.text.append(completion.text)
        self.finished = finished
        if finished:
            self.finish_reason = completion.finish_reason

    def sample(self) -> Sample:
        if self.finish_reason not in (FINISH_STOP, FINISH_LENGTH):
            raise RuntimeError(f"vLLM ended a response with {self.finish_reason!r}")
        return Sample(token_ids=np.asarray(self.ids, dtype=np.int32),
                      logprobs=np.asarray(self.logprobs, dtype=np.float32), finish_reason=self.finish_reason,
                      text="".join(self.text), versions=np.asarray(self.versions, dtype=np.int64))


class VllmEngine:
    name = "vllm"

    def __init__(self, model_dir: str | Path, *, device: str = "cpu", dtype: str | torch.dtype = "auto",
                 seed: int = 0, prefix_on_new_weights: str = "keep", **llm_options):
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
        # Held by each engine step and by every weight load: new weights land between steps, never inside one.
        self._step_lock = threading.RLock()
        # Called by the generating thread between engine steps (in flight: the weight receiver's apply_to); None:
        # weights change only between generate calls unless another thread loads them.
        self.between_steps: Callable[[], object] | None = None
        # After new weights mid-sequence: "keep" the running requests' KV cache (the old weights' keys and values)
        # or "recompute" it (vLLM preempts them and prefills prompt + output so far with the new weights).
        self.prefix_on_new_weights: str = prefix_on_new_weights
        # Set when a load found requests holding cached blocks, so the prefix cache could not be emptied then.
        self._stale_prefix_cache = False
        self._request_ids = itertools.count()
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self._torch_threads = torch.get_num_threads()
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
        """One request per sample (seed + i for the i-th of a prompt's n, as vLLM's own fan-out seeds them), stepped
        here rather than in `LLM.generate` so that `between_steps` runs at every step boundary and each token is
        stamped with the version of the step that drew it."""
        from vllm import TokensPrompt

        if any(len(prompt) == 0 for prompt in prompts):
            raise ValueError("every prompt needs at least one token")
        if sampling.truncates:
            # This engine does not yet say which tokens top-k / top-p kept (Sample.support), and a trainer taking
            # its log-probs over the whole vocabulary would weight every token by the kept mass: refused, not biased.
            field = "top_k" if sampling.top_k_enabled else "top_p"
            raise SamplingError(field, f"{field} is not supported by the vllm engine: it does not record the "
                                "sampling support the trainer replays (use the transformers engine, or top_p 1 and "
                                "top_k -1)")
        # OpenMP's thread count is per OS thread: in a thread other than the one that made the engine (the worker
        # loop's), vLLM's CPU attention plans a step for one count and runs it with another and dies ("Check
        # failed: input->metadata->thread_num == thread_num"). The calling thread takes the process's count, with
        # torch's own setter: vLLM's CPU worker replaces torch.set_num_threads with a no-op.
        torch._C.set_num_threads(self._torch_threads)
        engine = self.llm.llm_engine
        pieces: dict[str, _Pieces] = {}
        order: list[str] = []
        try:
            with self._step_lock:
                if self._stale_prefix_cache:
                    self._stale_prefix_cache = not engine.reset_prefix_cache()
                for prompt, seed in zip(prompts, request_seeds(sampling.seed, len(prompts)), strict=True):
                    request = TokensPrompt(prompt_token_ids=[int(t) for t in prompt])
                    for i in range(sampling.n):
                        request_id = f"zb-{next(self._request_ids)}"
                        order.append(request_id)
                        pieces[request_id] = _Pieces()
                        engine.add_request(request_id, request, self._params(sampling, seed, i))
            self._run(engine, pieces)
        except BaseException:
            with self._step_lock:
                engine.abort_request([rid for rid in order if not pieces[rid].finished])
            raise
        samples = [pieces[request_id].sample() for request_id in order]
        return [samples[i * sampling.n:(i + 1) * sampling.n] for i in range(len(prompts))]

    @staticmethod
    def _params(sampling: SamplingSettings, seed: int | None, index: int):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(
            n=1,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=max(sampling.top_k, 0),
            max_tokens=sampling.max_new_tokens,
            stop=list(sampling.stop) or None,
            include_stop_str_in_output=True,
            seed=None if seed is None else seed + index,
            logprobs=0,
            skip_special_tokens=True,
            output_kind=RequestOutputKind.DELTA,
        )

    def _run(self, engine, pieces: dict[str, _Pieces]) -> None:
        first = True
        while engine.has_unfinished_requests():
            if not first and self.between_steps is not None:
                self.between_steps()
            first = False
            with self._step_lock:
                version = self.policy_version
                outputs = engine.step()
            for output in outputs:
                pieces[output.request_id].add(output.outputs[0], version, output.finished)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Reload in place through vLLM; every weight is checked against the checkpoint's names and shapes first,
        so a refused load changes nothing. A LoRA adapter is merged here, on the rollout side, and loaded as
        full weights through the same path."""
        weights = list(weights)
        if is_adapter(name for name, _ in weights):
            weights = self._merged(weights)
        checked = [(name, tensor) for name, _, tensor in self._spec.check_all(weights)]
        with self._step_lock:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(checked)})
            self._forget_old_prefixes()
            self.policy_version = version

    def _forget_old_prefixes(self) -> None:
        """Cached prefix blocks hold keys and values the old weights computed: no request may read them after a load.
        With nothing running the cache just empties. Mid-generation, "recompute" preempts the running requests
        (vLLM frees their blocks and later prefills prompt + output so far, its sampler state kept), which lets the
        cache empty; "keep" leaves them their blocks, so the cache cannot empty until they end: the requests that
        have not started yet skip reading it, and the next generate call empties it."""
        engine = self.llm.llm_engine
        if engine.reset_prefix_cache(reset_running_requests=self.prefix_on_new_weights == "recompute"):
            self._stale_prefix_cache = False
            return
        self._stale_prefix_cache = True
        scheduler = engine.engine_core.engine_core.scheduler
        for request in scheduler.requests.values():
            if request.num_computed_tokens == 0:
                request.skip_reading_prefix_cache = True

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
