"""`zerobubble bench train`: one training step of the real trainer at a real vocabulary, today's path (full logits
of padded rows, micro-batches by sample count) against the new one (log-probs from hidden states in chunks, packed
sequences, micro-batches by a token budget), both in the same run.

The model is Qwen2.5-0.5B's shape with its full 151,936-token vocabulary and tied embeddings but fewer layers (2
by default), randomly initialised; the batch is groups of responses whose lengths spread as real answers do: most
short, a few at the longest. Each path runs in a fresh process (the FSDP strategy, one process, fp32 on CPU, bf16
autocast on a GPU), makes a warm-up step on one short group (it allocates the optimizer's state), then one
measured step on the batch:

- tokens/s: the batch's prompt + response tokens over the measured step's seconds (the same tokens for both);
- peak memory: on CPU the process's peak resident set during the measured step (Linux's VmHWM, reset before
  it: tracemalloc does not see torch's allocations), and how much of it the step added to what was resident
  before (model, optimizer state); on a GPU torch's peak allocated bytes.
"""

from __future__ import annotations

import multiprocessing as mp
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from zerobubble.common.codec import encode_array
from zerobubble.tooling.bench.gpu import SHAPES, make_model_dir
from zerobubble.trainer.algorithms.presets import algorithm_config
from zerobubble.trainer.collate import collate
from zerobubble.trainer.strategies.base import StrategyConfig
from zerobubble.trainer.strategies.fsdp import FSDPStrategy
from zerobubble.trainer.update import PolicyUpdate, UpdateSettings
from zerobubble.v1 import common_pb2

GIB = 2**30


def spread_lengths(samples: int, shortest: int, longest: int, long_fraction: float, seed: int = 0) -> list[int]:
    """Response lengths as RL answers come: a `long_fraction` of them at `longest` (truncated), the others
    exponentially spread with a mean of a tenth of the longest, at least `shortest`."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(shortest + rng.exponential(longest / 10, samples), shortest, longest).astype(int)
    long = rng.choice(samples, max(1, round(samples * long_fraction)), replace=False)
    lengths[long] = longest
    return [int(n) for n in lengths]


def spread_groups(lengths: list[int], group_size: int, prompt_tokens: int, vocab: int,
                  seed: int = 0) -> list[common_pb2.ExperienceGroup]:
    rng = np.random.default_rng(seed)
    groups = []
    for start in range(0, len(lengths), group_size):
        group = common_pb2.ExperienceGroup(
            prompt=common_pb2.Prompt(prompt_id=f"p{start}"),
            prompt_ids=encode_array(rng.integers(0, vocab, prompt_tokens, dtype=np.int32)))
        for i, length in enumerate(lengths[start : start + group_size]):
            group.trajectories.add(
                response_ids=encode_array(rng.integers(0, vocab, length, dtype=np.int32)),
                behaviour_logprobs=encode_array((-rng.random(length) - np.log(vocab)).astype(np.float32)),
                finish_reason=common_pb2.FINISH_REASON_STOP, reward=float((start + i) % 2), temperature=1.0)
        groups.append(group)
    return groups


def _resident_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak_resident() -> None:
    # Linux: writing 5 to clear_refs resets the peak resident set size (VmHWM) to the current one.
    Path("/proc/self/clear_refs").write_text("5")


def _run_path(conn, model_dir: str, settings: dict[str, Any], groups: list[bytes], warm_up: bytes,
              threads: int | None) -> None:
    """In a fresh process: a warm-up step on one short group (it allocates the optimizer's state) and a measured
    step of one path on the batch; sends its figures."""
    if threads:
        torch.set_num_threads(threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    batch = collate([common_pb2.ExperienceGroup.FromString(g) for g in groups], pad_id=0)
    config = StrategyConfig(device=device, dtype="bf16" if device == "cuda" else "fp32")
    with FSDPStrategy(config, Path(model_dir)) as strategy:
        update = PolicyUpdate(strategy, algorithm_config("GRPO", beta=0.0), UpdateSettings(**settings))
        update(collate([common_pb2.ExperienceGroup.FromString(warm_up)], pad_id=0), policy_version=0)
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        else:
            _reset_peak_resident()
        resident = _resident_bytes("VmRSS")
        began = time.perf_counter()
        figures = update(batch, policy_version=0)
        if device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - began
    tokens = int(batch.sequence_lengths.sum())
    out: dict[str, Any] = {"step_seconds": round(seconds, 2), "tokens_per_s": round(tokens / seconds, 1),
                           "loss": figures["loss"]}
    if device == "cuda":
        out["peak_gpu_memory_gib"] = round(torch.cuda.max_memory_allocated() / GIB, 3)
    else:
        peak = _resident_bytes("VmHWM")
        out.update({"peak_rss_gib": round(peak / GIB, 3), "resident_before_step_gib": round(resident / GIB, 3),
                    "step_added_gib": round((peak - resident) / GIB, 3),
                    "lifetime_peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB,
                                                   3)})
    conn.send(out)


def _measure(model_dir: Path, settings: dict[str, Any], groups: list[common_pb2.ExperienceGroup],
             warm_up: common_pb2.ExperienceGroup, threads: int | None) -> dict[str, Any]:
    context = mp.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_run_path, args=(send, str(model_dir), settings,
                                                    [g.SerializeToString() for g in groups],
                                                    warm_up.SerializeToString(), threads))
    child.start()
    send.close()
    try:
        figures = receive.recv()
    except EOFError:
        child.join()
        killed = " (killed by signal 9: out of memory)" if child.exitcode == -9 else ""
        return {"failed": f"the process exited with {child.exitcode}{killed}"}
    child.join()
    return figures


def bench_train(*, shape: str = "0.5b", layers: int = 2, samples: int = 16, group_size: int = 8,
                prompt_tokens: int = 32, longest: int = 512, shortest: int = 16, long_fraction: float = 1 / 16,
                micro_batch_samples: int = 4, max_tokens_per_micro_batch: int = 4096, logprob_chunk_tokens: int = 512,
                threads: int | None = None) -> dict[str, Any]:
    lengths = spread_lengths(samples, shortest, longest, long_fraction)
    vocab = SHAPES[shape]["vocab_size"]
    groups = spread_groups(lengths, group_size, prompt_tokens, vocab)
    warm_up = spread_groups([shortest] * group_size, group_size, prompt_tokens, vocab, seed=1)[0]
    common = {"mini_batches": 1, "micro_batch_samples": micro_batch_samples, "max_new_tokens": longest}
    paths = {
        "today": common | {"logprob_chunk_tokens": None, "packing": False},
        "new": common | {"logprob_chunk_tokens": logprob_chunk_tokens, "packing": True,
                         "max_tokens_per_micro_batch": max_tokens_per_micro_batch},
    }
    figures: dict[str, Any] = {
        "benchmark": "train", "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "model": f"{shape} shape, vocabulary {vocab}, tied embeddings, {layers} layers",
        "samples": samples, "prompt_tokens": prompt_tokens,
        "response_tokens": {"total": sum(lengths), "longest": max(lengths), "median": int(np.median(lengths)),
                            "at_longest": lengths.count(longest)},
        "padded_positions": samples * (prompt_tokens + max(lengths)), "settings": paths,
    }
    with tempfile.TemporaryDirectory(prefix="zerobubble-bench-train-") as scratch:
        model_dir = make_model_dir(Path(scratch) / "model", shape, torch.device("cpu"), layers=layers)
        for name, settings in paths.items():
            figures[name] = _measure(model_dir, settings, groups, warm_up, threads)
    today, new = figures["today"], figures["new"]
    if "failed" not in today and "failed" not in new:
        memory = "peak_gpu_memory_gib" if "peak_gpu_memory_gib" in new else "peak_rss_gib"
        figures["peak_memory_ratio"] = round(new[memory] / today[memory], 3)
        if "step_added_gib" in new:
            figures["step_added_memory_ratio"] = round(new["step_added_gib"] / max(today["step_added_gib"], 1e-9), 3)
        figures["tokens_per_s_ratio"] = round(new["tokens_per_s"] / today["tokens_per_s"], 2)
        figures["same_loss"] = abs(new["loss"] - today["loss"]) <= 1e-3 * max(1.0, abs(today["loss"]))
    return figures


def register_bench(benches) -> None:
    train = benches.add_parser("train", help="trainer step at a real vocabulary: full logits of padded rows vs "
                               "chunked log-probs, packing and token-budget micro-batches")
    train.add_argument("--shape", choices=sorted(SHAPES), default="0.5b", help="0.5b: Qwen2.5-0.5B's (vocabulary "
                       "151,936); small: for trying the bench out")
    train.add_argument("--layers", type=int, default=2, help="decoder layers (fewer than the shape's, to run here)")
    # The shape is 64 samples up to 1,024 tokens; today's path takes about an hour for that on 2 busy cores.
    train.add_argument("--samples", type=int, default=16)
    train.add_argument("--group-size", type=int, default=8)
    train.add_argument("--prompt-tokens", type=int, default=32)
    train.add_argument("--longest", type=int, default=512, help="the longest responses' tokens")
    train.add_argument("--shortest", type=int, default=16)
    train.add_argument("--long-fraction", type=float, default=1 / 16, help="share of responses at --longest")
    train.add_argument("--micro-batch-samples", type=int, default=4, help="today's path: samples per micro-batch")
    train.add_argument("--max-tokens-per-micro-batch", type=int, default=4096, help="the new path's token budget")
    train.add_argument("--logprob-chunk-tokens", type=int, default=512)
    train.add_argument("--threads", type=int, default=None, help="torch threads per path (default: torch's)")
    train.set_defaults(measure=lambda a: bench_train(
        shape=a.shape, layers=a.layers, samples=a.samples, group_size=a.group_size, prompt_tokens=a.prompt_tokens,
        longest=a.longest, shortest=a.shortest, long_fraction=a.long_fraction,
        micro_batch_samples=a.micro_batch_samples, max_tokens_per_micro_batch=a.max_tokens_per_micro_batch,
        logprob_chunk_tokens=a.logprob_chunk_tokens, threads=a.threads))
