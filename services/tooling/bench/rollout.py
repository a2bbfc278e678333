"""`zerobubble bench rollout`: generation tokens/s of the bare engine next to a rollout worker's end-to-end
tokens/s (lease, generate, score through a real reward service, push to a real buffer, until the data
ends), on the tiny model and the same arithmetic prompts in one run; and the vLLM engine's where installed.

Both sides generate the same prompts in the same batches with the same per-batch seeds (the buffer hands
prompts out in file order here), so they produce the same tokens and the ratio isolates what the service
around the engine costs.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

from zerobubble.buffer.app import build as build_buffer
from zerobubble.buffer.config import BufferServiceConfig
from zerobubble.common.config import load_config
from zerobubble.reward.app import build as build_reward
from zerobubble.reward.config import RewardServiceConfig
from zerobubble.rollout.app import build as build_rollout
from zerobubble.rollout.config import RolloutServiceConfig
from zerobubble.rollout.engine import Engine, SamplingSettings
from zerobubble.rollout.engine_factory import make_engine, vllm_available
from zerobubble.rollout.prompting import PromptBuilder, system_prompt
from zerobubble.tooling.tiny.model import SIZES, make_tiny_model
from zerobubble.tooling.tiny.task import make_arithmetic_task

QUIET_SERVER = {"server.listen": "127.0.0.1:0", "server.metrics_port": None, "server.grace_seconds": 0.5}
WORKER_SEED = 0


def prompt_batches(model: Path, train: Path, batch_prompts: int) -> list[list[list[int]]]:
    """The task's prompts as the worker builds them (chat template, the `boxed` system prompt), in file
    order, cut into the worker's lease batches."""
    builder = PromptBuilder(AutoTokenizer.from_pretrained(model), system_prompt("boxed", None), max_prompt_tokens=512)
    rows = [json.loads(line) for line in train.read_text().splitlines() if line.strip()]
    prompts = [builder.build(json.dumps(row["messages"])) for row in rows]
    return [prompts[i:i + batch_prompts] for i in range(0, len(prompts), batch_prompts)]


def sampling(samples: int, max_new_tokens: int, batch: int) -> SamplingSettings:
    """What the worker asks of its engine for its `batch`-th lease (seed: generation.seed + batch)."""
    return SamplingSettings(n=samples, temperature=1.0, max_new_tokens=max_new_tokens, seed=WORKER_SEED + batch)


def engine_rate(engine: Engine, batches: list[list[list[int]]], samples: int, max_new_tokens: int) -> dict[str, Any]:
    """Tokens/s of `engine.generate` alone over the batches, after one warm-up batch."""
    engine.generate(batches[0], sampling(samples, max_new_tokens, 0))
    tokens, started = 0, time.perf_counter()
    for index, batch in enumerate(batches):
        groups = engine.generate(batch, sampling(samples, max_new_tokens, index))
        tokens += sum(len(s.token_ids) for group in groups for s in group)
    seconds = time.perf_counter() - started
    return {"tokens": tokens, "seconds": round(seconds, 3), "tokens_per_s": round(tokens / seconds, 1)}


def worker_rate(model: Path, train: Path, folder: Path, *, samples: int, max_new_tokens: int, batch_prompts: int,
                threads: int, warm_up: list[list[int]]) -> dict[str, Any]:
    """Tokens/s of a rollout worker (trainer: null) from its start until the buffer reports the end of the data,
    with a real reward service and a real buffer in this process."""
    reward = build_reward(load_config(RewardServiceConfig, None, {**QUIET_SERVER, "math.workers": 1})).start()
    buffer = build_buffer(load_config(BufferServiceConfig, None, {
        **QUIET_SERVER, "prompts.path": str(train), "prompts.shuffle": False, "wal.directory": str(folder / "wal"),
        "wal.fsync": "never", "run_spec.num_generations": samples,
        "run_spec.max_new_tokens": max_new_tokens,
        # The bare engine's baseline samples at one temperature throughout.
        "run_spec.sampling.temperature_annealing": False,
    })).start()
    host = None
    try:
        config = load_config(RolloutServiceConfig, None, {
            **QUIET_SERVER, "worker_id": "bench-worker", "model.path": str(model), "model.device": "cpu",
            "trainer": None, "torch_threads": threads, "buffer.address": buffer.address,
            "reward_service.address": reward.address, "generation.prompts_per_batch": batch_prompts,
            "generation.seed": WORKER_SEED, "lease_wait_seconds": 0.02,
        })
        host = build_rollout(config)
        # The same warm-up batch the bare engine had, outside the measurement.
        host.engine.generate(warm_up, sampling(samples, max_new_tokens, 0))
        tokens_before = _counter(host, "zerobubble_rollout_tokens_total")
        started = time.perf_counter()
        host.start()
        finished = threading.Event()
        threading.Thread(target=lambda: (host.worker.drained.wait(), finished.set()), daemon=True).start()
        while not finished.wait(0.2):
            if host.worker.finished.is_set():
                raise RuntimeError(f"the rollout worker stopped before the end of the data: {host.worker.error!r}")
        seconds = time.perf_counter() - started
        tokens = _counter(host, "zerobubble_rollout_tokens_total") - tokens_before
        return {
            "tokens": int(tokens), "seconds": round(seconds, 3), "tokens_per_s": round(tokens / seconds, 1),
            "groups_pushed": host.worker.groups_pushed, "groups_in_buffer": buffer.core.stats()["groups_in"],
            "reward_wait_seconds": round(_counter(host, "zerobubble_rollout_reward_wait_seconds_total"), 3),
            "buffer_wait_seconds": round(_counter(host, "zerobubble_rollout_buffer_wait_seconds_total"), 3),
        }
    finally:
        if host is not None:
            host.stop(0.5)
        buffer.stop(0.5)
        reward.stop(0.5)


def _median(values) -> float:
    return round(statistics.median(values), 1)


def _counter(host, name: str) -> float:
    return host.registry.get_sample_value(name) or 0.0


def vllm_rate(model: Path, batches: list[list[list[int]]], samples: int, max_new_tokens: int) -> dict[str, Any] | str:
    if not vllm_available():
        return "not installed"
    engine = None
    try:
        engine = make_engine("vllm", model, seed=WORKER_SEED)
        return engine_rate(engine, batches, samples, max_new_tokens)
    except Exception as exc:
        # vLLM's CPU kernels take only some head sizes (not the 2m preset's 40): report it, keep the rest.
        return f"failed: {str(exc).strip().splitlines()[-1][:300]}"
    finally:
        if engine is not None:
            engine.close()


def bench_rollout(*, prompts: int = 32, samples: int = 8, max_new_tokens: int = 32, batch_prompts: int = 8,
                  threads: int = 1, model_size: str = "2m", rounds: int = 2) -> dict[str, Any]:
    """Measure the bare transformers engine, the worker end to end and (where installed) vLLM on the same
    prompts; the figures as a JSON-able dict."""
    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory(prefix="zerobubble-bench-rollout-") as scratch:
        folder = Path(scratch)
        model = make_tiny_model(folder / "model", size=model_size, seed=0)
        train, _ = make_arithmetic_task(folder / "task", train_size=prompts, eval_size=1, seed=0)
        batches = prompt_batches(model, train, batch_prompts)
        engine = make_engine("transformers", model, device="cpu", seed=WORKER_SEED)
        try:
            # Engine and worker runs alternate, an engine run first and last, and each side reports its
            # median: load from other processes that drifts during the bench then weighs on both alike.
            engine_runs, worker_runs = [engine_rate(engine, batches, samples, max_new_tokens)], []
            for index in range(rounds):
                worker_runs.append(worker_rate(
                    model, train, folder / f"round-{index}", samples=samples, max_new_tokens=max_new_tokens,
                    batch_prompts=batch_prompts, threads=threads, warm_up=batches[0]))
                engine_runs.append(engine_rate(engine, batches, samples, max_new_tokens))
        finally:
            engine.close()
        vllm = vllm_rate(model, batches, samples, max_new_tokens)
    bare = {"tokens": engine_runs[0]["tokens"], "tokens_per_s": _median(r["tokens_per_s"] for r in engine_runs),
            "tokens_per_s_runs": [r["tokens_per_s"] for r in engine_runs]}
    worker = {**worker_runs[-1], "tokens_per_s": _median(r["tokens_per_s"] for r in worker_runs),
              "tokens_per_s_runs": [r["tokens_per_s"] for r in worker_runs]}
    worker.pop("seconds")
    figures: dict[str, Any] = {
        "benchmark": "rollout", "model": f"tiny-{model_size}", "prompts": prompts, "samples_per_prompt": samples,
        "max_new_tokens": max_new_tokens, "prompts_per_batch": batch_prompts, "torch_threads": threads,
        "rounds": rounds,
        "engine": bare, "worker": worker,
        "worker_vs_engine_ratio": round(worker["tokens_per_s"] / bare["tokens_per_s"], 3),
        "same_tokens": all(r["tokens"] == bare["tokens"] for r in [*engine_runs, *worker_runs]),
        "vllm": vllm,
    }
    if isinstance(vllm, dict):
        figures["transformers_vs_vllm_ratio"] = round(bare["tokens_per_s"] / vllm["tokens_per_s"], 3)
    return figures


def register_bench(benches) -> None:
    parser = benches.add_parser("rollout", help="engine tokens/s vs a rollout worker's end to end (score + push), "
                                "and vLLM's where installed")
    parser.add_argument("--prompts", type=int, default=32, help="arithmetic prompts generated for")
    parser.add_argument("--samples", type=int, default=8, help="responses per prompt (num_generations)")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="response limit")
    parser.add_argument("--batch-prompts", type=int, default=8, help="prompts per generate call (prompts_per_batch)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (torch.set_num_threads)")
    parser.add_argument("--model-size", default="2m", choices=sorted(SIZES),
                        help="tiny model preset; vLLM's CPU attention takes the head size of 1m and 5m (32), "
                        "not of 2m (40) or 20m (56)")
    parser.add_argument("--rounds", type=int, default=2, help="worker runs, each between two engine runs")
    parser.set_defaults(measure=lambda args: bench_rollout(
        prompts=args.prompts, samples=args.samples, max_new_tokens=args.max_new_tokens,
        batch_prompts=args.batch_prompts, threads=args.threads, model_size=args.model_size,
        rounds=args.rounds))
