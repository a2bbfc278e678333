"""`zerobubble bench gpu-train | gpu-generate | gpu-sync`: the CUDA paths on a Qwen2-0.5B-shaped model
(random weights, a config made locally, the project's byte-level tokenizer), each beside the GPU's own
limit measured in the same run.

- gpu-train: one training step of the real trainer (FSDP strategy in bf16 autocast over fp32 master
  weights, the GRPO update with its log-prob recompute) on a synthetic batch: tokens/s, step time, peak
  memory and the fraction of the GPU's measured bf16 matrix-product rate it reaches (model FLOPs: 6 per
  parameter and token for forward and backward, 2 more for the recompute forward; attention left out).
- gpu-generate: the transformers engine sampling prompts x samples x tokens: tokens/s, against the rate
  at which reading the weights once per decode step would bound it at the GPU's copy bandwidth.
- gpu-sync: the model's bf16 weights from a trainer process to a rollout process on the same GPU, by each
  path: gloo through host memory (what a cpu-device broadcaster does), CUDA IPC (buckets shared once,
  one device-to-device copy on each side per sync), against one device-to-device copy of the same bytes.
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.distributed import TCPStore
from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

from zerobubble.common.codec import encode_array
from zerobubble.common.cuda_ipc import export_handles, open_handles
from zerobubble.common.weight_sync import Manifest, form_group, start_broadcast, wait_broadcast
from zerobubble.rollout.engine import SamplingSettings
from zerobubble.rollout.engine_transformers import TransformersEngine
from zerobubble.tooling.tiny.model import PAD_TOKEN, make_tokenizer
from zerobubble.trainer.algorithms.presets import algorithm_config
from zerobubble.trainer.collate import collate
from zerobubble.trainer.strategies.base import StrategyConfig
from zerobubble.trainer.strategies.fsdp import FSDPStrategy
from zerobubble.trainer.update import PolicyUpdate, UpdateSettings
from zerobubble.v1 import common_pb2

# Qwen2.5-0.5B's shape (494M parameters with tied embeddings); "small" is for trying the benches on a CPU.
SHAPES: dict[str, dict[str, int]] = {
    "0.5b": dict(vocab_size=151_936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2),
    "small": dict(vocab_size=4096, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2),
}
BYTE_TOKENS = 256  # prompt ids are drawn from the tokenizer's byte tokens, so prompts decode


def make_model_dir(out: Path, shape: str, device: torch.device, seed: int = 0, layers: int | None = None) -> Path:
    """A randomly initialised Qwen2 model of `shape` (with `layers` decoder layers, else the shape's) with the
    project's tokenizer, saved as HF files."""
    tokenizer = make_tokenizer()
    dims = SHAPES[shape] | ({} if layers is None else {"num_hidden_layers": layers})
    config = Qwen2Config(**dims, tie_word_embeddings=True, max_position_embeddings=4096,
                         bos_token_id=tokenizer.convert_tokens_to_ids(PAD_TOKEN), eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, dtype="float32")
    torch.manual_seed(seed)
    with device:  # initialising 0.5B parameters on the GPU takes a second, on the CPU much longer
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def cuda_time(fn: Callable[[], Any], *, repeats: int, warmup: int = 2) -> list[float]:
    """Seconds per call of `fn`, each timed with CUDA events (or the host clock on a CPU)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if torch.cuda.is_available():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1000)
        else:
            began = time.perf_counter()
            fn()
            times.append(time.perf_counter() - began)
    return times


def significant(value: float) -> float:
    """`value` to three significant digits: a CPU's TFLOP/s (thousandths, less under load) must not round to 0."""
    return float(f"{value:.3g}")


def gpu_limits(device: torch.device) -> dict[str, float]:
    """The two ceilings, measured: a large bf16 matrix product (FLOP/s) and a large device-to-device copy
    (bytes read plus written per second), on fresh random data."""
    n = 8192 if device.type == "cuda" else 512
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    matmul = statistics.median(cuda_time(lambda: a @ b, repeats=10))
    source = torch.randn(256 * 2**20, device=device)  # 1 GiB of float32
    target = torch.empty_like(source)
    copy = statistics.median(cuda_time(lambda: target.copy_(source), repeats=10))
    return {"bf16_matmul_tflops": significant(2 * n**3 / matmul / 1e12),
            "copy_gb_per_s": round(2 * source.numel() * 4 / copy / 1e9, 1)}


def synthetic_groups(groups: int, group_size: int, prompt_tokens: int, response_tokens: int,
                     vocab: int, seed: int = 0) -> list[common_pb2.ExperienceGroup]:
    """Full-length responses with random tokens and rewards: what the trainer receives from the buffer."""
    rng = np.random.default_rng(seed)
    out = []
    for g in range(groups):
        trajectories = [
            common_pb2.Trajectory(
                response_ids=encode_array(rng.integers(0, vocab, response_tokens, dtype=np.int32)),
                behaviour_logprobs=encode_array(-rng.random(response_tokens, dtype=np.float32)),
                finish_reason=common_pb2.FINISH_REASON_STOP, reward=float(rng.integers(0, 2)),
                temperature=1.0)
            for _ in range(group_size)
        ]
        prompt_ids = encode_array(rng.integers(0, vocab, prompt_tokens, dtype=np.int32))
        out.append(common_pb2.ExperienceGroup(prompt=common_pb2.Prompt(prompt_id=f"p{g}"), prompt_ids=prompt_ids,
                                              trajectories=trajectories))
    return out


def bench_gpu_train(*, shape: str = "0.5b", groups: int = 8, group_size: int = 8, prompt_tokens: int = 128,
                    response_tokens: int = 256, micro_batch_samples: int = 16, steps: int = 5,
                    logprob_chunk_tokens: int | None = 512, packing: bool = True,
                    max_tokens_per_micro_batch: int | None = None) -> dict[str, Any]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    figures: dict[str, Any] = {"benchmark": "gpu-train", "device": _device_name(device), **gpu_limits(device)}
    with tempfile.TemporaryDirectory(prefix="zerobubble-bench-gpu-") as scratch:
        model_dir = make_model_dir(Path(scratch) / "model", shape, device)
        config = StrategyConfig(device="cuda" if device.type == "cuda" else "cpu", dtype="bf16")
        with FSDPStrategy(config, model_dir) as strategy:
            params = sum(p.numel() for p in strategy.model.parameters())
            update = PolicyUpdate(strategy, algorithm_config("GRPO", beta=0.0),
                                  UpdateSettings(mini_batches=1, micro_batch_samples=micro_batch_samples,
                                                 max_new_tokens=response_tokens,
                                                 max_tokens_per_micro_batch=max_tokens_per_micro_batch,
                                                 logprob_chunk_tokens=logprob_chunk_tokens, packing=packing))
            batch = collate(synthetic_groups(groups, group_size, prompt_tokens, response_tokens,
                                             SHAPES[shape]["vocab_size"]), pad_id=0)
            torch.cuda.reset_peak_memory_stats() if device.type == "cuda" else None
            # Samples one version behind, as asynchronous training gets them: the recompute forward runs.
            times = cuda_time(lambda: update(batch, policy_version=1), repeats=steps)
            peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else 0
    tokens = batch.size * (prompt_tokens + response_tokens)
    step = statistics.median(times)
    flops = 8 * params * tokens  # forward + backward (6) and the log-prob recompute forward (2) per token
    figures.update({
        "shape": shape, "parameters": params, "samples": batch.size, "tokens_per_step": tokens,
        "micro_batch_samples": micro_batch_samples, "max_tokens_per_micro_batch": max_tokens_per_micro_batch,
        "logprob_chunk_tokens": logprob_chunk_tokens, "packing": packing, "step_seconds": round(step, 4),
        "step_seconds_spread": [round(min(times), 4), round(max(times), 4)],
        "tokens_per_s": round(tokens / step), "peak_memory_gib": round(peak / 2**30, 2),
        "model_tflops": significant(flops / step / 1e12),
    })
    figures["fraction_of_bf16_peak"] = round(figures["model_tflops"] / figures["bf16_matmul_tflops"], 3)
    return figures


def bench_gpu_generate(*, shape: str = "0.5b", prompts: int = 64, samples: int = 8, max_new_tokens: int = 256,
                       prompt_tokens: int = 64, repeats: int = 2) -> dict[str, Any]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    figures: dict[str, Any] = {"benchmark": "gpu-generate", "device": _device_name(device), **gpu_limits(device)}
    rng = np.random.default_rng(0)
    batch = [rng.integers(0, BYTE_TOKENS, prompt_tokens).tolist() for _ in range(prompts)]
    sampling = SamplingSettings(n=samples, temperature=1.0, max_new_tokens=max_new_tokens)
    with tempfile.TemporaryDirectory(prefix="zerobubble-bench-gpu-") as scratch:
        model_dir = make_model_dir(Path(scratch) / "model", shape, device)
        engine = TransformersEngine(model_dir, device=str(device), dtype="bf16" if device.type == "cuda" else "fp32")
        weight_bytes = sum(p.numel() * p.element_size() for p in engine.model.parameters())
        engine.generate(batch[:2], SamplingSettings(n=2, temperature=1.0, max_new_tokens=8))  # warm-up
        runs = []
        for _ in range(repeats):
            _sync(device)
            began = time.perf_counter()
            out = engine.generate(batch, sampling)
            _sync(device)
            runs.append((time.perf_counter() - began, sum(len(s.token_ids) for group in out for s in group)))
        engine.close()
    seconds, tokens = min(runs)
    rows = prompts * samples
    figures.update({
        "shape": shape, "prompts": prompts, "samples_per_prompt": samples, "max_new_tokens": max_new_tokens,
        "generated_tokens": tokens, "seconds": round(seconds, 3), "tokens_per_s": round(tokens / seconds),
        "seconds_per_decode_step": round(seconds / max_new_tokens, 5),
        # Each decode step reads every weight once; the KV cache and logits come on top.
        "weight_read_bound_tokens_per_s": round(rows * figures["copy_gb_per_s"] * 1e9 / 2 / weight_bytes),
    })
    figures["fraction_of_weight_read_bound"] = round(
        figures["tokens_per_s"] / figures["weight_read_bound_tokens_per_s"], 4)
    return figures


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _bf16_weights(shape: str, device: torch.device, seed: int) -> list[tuple[str, torch.Tensor]]:
    torch.manual_seed(seed)
    config = Qwen2Config(**SHAPES[shape], tie_word_embeddings=True)
    with device:
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    return [(name, p.data) for name, p in model.named_parameters()]


def _receiver(conn, shape: str, path: str, port: int, bucket_mb: float) -> None:
    """The rollout side: its own copy of the weights on the GPU; loads each sync the way `path` delivers it."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    params = dict(_bf16_weights(shape, device, seed=1))
    manifest = Manifest.plan(params.items(), int(bucket_mb * 2**20))
    if path == "cuda_ipc":
        views = manifest.views(open_handles(conn.recv()))
    else:
        store = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
        group = form_group(store, 0, 1, 2, backend="gloo", timeout_s=60, address="127.0.0.1")
        host = manifest.allocate("cpu")
        views = manifest.views(host)
    conn.send("ready")
    while conn.recv() == "sync":
        if path == "gloo_host":
            wait_broadcast(start_broadcast(group, host))
        with torch.no_grad():
            for name, view in views:
                params[name].copy_(view, non_blocking=True)
        _sync(device)
        conn.send("loaded")
    checksum = float(sum(p.float().sum() for p in params.values()))
    conn.send(checksum)


def _sync_path(path: str, shape: str, weights: list[tuple[str, torch.Tensor]], bucket_mb: float,
               repeats: int) -> dict[str, Any]:
    """Time one sync by `path` from this process (the trainer) to a receiver process, `repeats` times."""
    device = weights[0][1].device
    manifest = Manifest.plan(weights, int(bucket_mb * 2**20))
    context = mp.get_context("spawn")
    conn, child_conn = context.Pipe()
    store = None
    port = 0
    if path == "gloo_host":
        store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
        port = store.port
    child = context.Process(target=_receiver, args=(child_conn, shape, path, port, bucket_mb), daemon=True)
    child.start()
    if path == "cuda_ipc":
        buffers = manifest.allocate(device)
        conn.send(export_handles(buffers))
    else:
        group = form_group(store, 0, 0, 2, backend="gloo", timeout_s=60, address="127.0.0.1")
        buffers = manifest.allocate("cpu")
        if device.type == "cuda":
            buffers = [b.pin_memory() for b in buffers]
    if conn.recv() != "ready":
        raise RuntimeError(f"{path}: the receiver did not start")
    times = []
    for _ in range(repeats + 1):  # the first sync warms up and is not counted
        began = time.perf_counter()
        manifest.pack(weights, buffers)
        _sync(device)
        conn.send("sync")
        if path == "gloo_host":
            wait_broadcast(start_broadcast(group, buffers))
        if conn.recv() != "loaded":
            raise RuntimeError(f"{path}: the receiver failed")
        times.append(time.perf_counter() - began)
    conn.send("stop")
    checksum = conn.recv()
    child.join(timeout=60)
    expected = float(sum(t.float().sum() for _, t in weights))
    seconds = statistics.median(times[1:])
    return {"seconds": round(seconds, 4), "gb_per_s": round(manifest.total_bytes / seconds / 1e9, 2),
            "spread": [round(min(times[1:]), 4), round(max(times[1:]), 4)],
            "weights_match": abs(checksum - expected) <= 1e-3 * max(1.0, abs(expected))}


def bench_gpu_sync(*, shape: str = "0.5b", bucket_mb: float = 256, repeats: int = 5) -> dict[str, Any]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    weights = _bf16_weights(shape, device, seed=0)
    total = sum(t.numel() * t.element_size() for _, t in weights)
    flat = torch.empty(total, dtype=torch.uint8, device=device)
    source = torch.randint(0, 255, (total,), dtype=torch.uint8, device=device)
    copy = statistics.median(cuda_time(lambda: flat.copy_(source), repeats=10))
    figures: dict[str, Any] = {
        "benchmark": "gpu-sync", "device": _device_name(device), "shape": shape, "weight_bytes": total,
        "bucket_mb": bucket_mb,
        "device_copy": {"seconds": round(copy, 5), "gb_per_s": round(total / copy / 1e9, 1)},
    }
    paths = ["gloo_host", "cuda_ipc"] if device.type == "cuda" else ["gloo_host"]
    for path in paths:
        figures[path] = _sync_path(path, shape, weights, bucket_mb, repeats)
        figures[f"{path}_vs_device_copy"] = round(figures[path]["seconds"] / copy, 1)
    return figures


def register_bench(benches) -> None:
    train = benches.add_parser("gpu-train", help="trainer step on a Qwen2-0.5B-shaped model in bf16 vs the GPU's peak")
    train.add_argument("--shape", choices=sorted(SHAPES), default="0.5b")
    train.add_argument("--groups", type=int, default=8)
    train.add_argument("--group-size", type=int, default=8)
    train.add_argument("--prompt-tokens", type=int, default=128)
    train.add_argument("--response-tokens", type=int, default=256)
    train.add_argument("--micro-batch-samples", type=int, default=16)
    train.add_argument("--steps", type=int, default=5, help="timed steps (after two warm-up steps)")
    train.add_argument("--logprob-chunk-tokens", type=int, default=512, help="0: full logits of padded rows (the "
                       "trainer's path before chunked log-probs)")
    train.add_argument("--no-packing", action="store_true", help="padded rows instead of packed sequences")
    train.add_argument("--max-tokens-per-micro-batch", type=int, default=None)
    train.set_defaults(measure=lambda a: bench_gpu_train(
        shape=a.shape, groups=a.groups, group_size=a.group_size, prompt_tokens=a.prompt_tokens,
        response_tokens=a.response_tokens, micro_batch_samples=a.micro_batch_samples, steps=a.steps,
        logprob_chunk_tokens=a.logprob_chunk_tokens or None, packing=bool(a.logprob_chunk_tokens) and not a.no_packing,
        max_tokens_per_micro_batch=a.max_tokens_per_micro_batch))
    generate = benches.add_parser("gpu-generate", help="transformers engine tokens/s on a Qwen2-0.5B-shaped model")
    generate.add_argument("--shape", choices=sorted(SHAPES), default="0.5b")
    generate.add_argument("--prompts", type=int, default=64)
    generate.add_argument("--samples", type=int, default=8)
    generate.add_argument("--max-new-tokens", type=int, default=256)
    generate.set_defaults(measure=lambda a: bench_gpu_generate(
        shape=a.shape, prompts=a.prompts, samples=a.samples, max_new_tokens=a.max_new_tokens))
    sync = benches.add_parser("gpu-sync", help="weight sync trainer -> rollout on one GPU: gloo via host, CUDA IPC, "
                              "vs a device copy")
    sync.add_argument("--shape", choices=sorted(SHAPES), default="0.5b")
    sync.add_argument("--bucket-mb", type=float, default=256)
    sync.add_argument("--repeats", type=int, default=5)
    sync.set_defaults(measure=lambda a: bench_gpu_sync(shape=a.shape, bucket_mb=a.bucket_mb, repeats=a.repeats))
