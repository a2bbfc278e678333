"""`zerobubble bench openai`: what the OpenAI endpoint's calls cost when agents call at once. Each session is an
agent loop (a call, a tool result appended, the next call on the whole conversation), `--sessions` of them at
once, through the two paths a rollout worker's `complete()` can take (rollout/worker.py), in the same run on the
same engine:

- locked: one generate call per completion under the engine lock, the calls queueing for it (the path of an
  engine without a continuous batcher, and the endpoint's only path before it had one);
- batched: the transformers engine's continuous batcher, the calls decoding side by side, each session's next call
  reusing the cache its last one left (kept under the session's key).

Printed: calls/s and completion tokens/s of each, their ratio, and what the batcher did (its widest batch, the
context tokens its kept caches spared the prefill of)."""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from zerobubble.rollout.engine import Sample, SamplingSettings
from zerobubble.rollout.engine_transformers import TransformersEngine
from zerobubble.tooling.tiny.model import SIZES, make_tiny_model

# What the agent's tool answers between two calls, rendered as the template would frame it.
TOOL_RESULT = "<|im_end|>\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"


def _sessions(complete: Callable[[list[int], str], Sample], first: list[int], tool: list[int], sessions: int,
              calls: int) -> dict:
    """`sessions` agent loops at once, each `calls` calls long; calls/s and completion tokens/s over all."""
    tokens = [0] * sessions

    def agent(index: int) -> None:
        conversation = list(first)
        for _ in range(calls):
            sample = complete(conversation, f"session-{index}")
            tokens[index] += len(sample.token_ids)
            conversation += [int(t) for t in sample.token_ids] + tool

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(sessions)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    return {"seconds": round(seconds, 3), "calls_per_s": round(sessions * calls / seconds, 2),
            "completion_tokens_per_s": round(sum(tokens) / seconds, 1)}


def bench_openai(*, sessions: int = 8, calls: int = 4, max_tokens: int = 32, model_size: str = "1m") -> dict:
    with tempfile.TemporaryDirectory(prefix="zb-openai-bench-") as scratch:
        engine = TransformersEngine(make_tiny_model(Path(scratch) / "model", size=model_size))
        try:
            tokenizer = engine.tokenizer
            first = tokenizer.encode(tokenizer.apply_chat_template(
                [{"role": "user", "content": "What is 6 times 7? Call the calculator, then answer."}],
                tokenize=False, add_generation_prompt=True), add_special_tokens=False)
            tool = tokenizer.encode(TOOL_RESULT, add_special_tokens=False)
            sampling = SamplingSettings(n=1, temperature=1.0, max_new_tokens=max_tokens)
            lock = threading.Lock()

            def locked(ids: list[int], _key: str) -> Sample:
                with lock:
                    return engine.generate([ids], sampling)[0][0]

            batcher = engine.continuous()

            def batched(ids: list[int], key: str) -> Sample:
                return batcher.submit(ids, sampling, key=key).result()

            # Each path once before it is timed: the first forwards of a process are slower.
            locked(first, "warm-up")
            batched(first, "warm-up")
            figures = {"locked": _sessions(locked, first, tool, sessions, calls),
                       "batched": _sessions(batched, first, tool, sessions, calls)}
            stats = batcher.stats
            figures["batcher"] = {"peak_running": stats.peak_running, "reused_tokens": stats.reused_tokens,
                                  "prefilled_tokens": stats.prefilled_tokens}
        finally:
            engine.close()
    figures["ratio_calls_per_s"] = round(figures["batched"]["calls_per_s"] / figures["locked"]["calls_per_s"], 2)
    return {"benchmark": "openai", "sessions": sessions, "calls": calls, "max_tokens": max_tokens,
            "model": model_size, **figures}


def _measure(args) -> dict:
    return bench_openai(sessions=args.sessions, calls=args.calls, max_tokens=args.max_tokens, model_size=args.size)


def register_bench(benches) -> None:
    parser = benches.add_parser("openai", help="agent sessions calling at once: the endpoint's calls batched "
                                "continuously vs one at a time under the engine lock")
    parser.add_argument("--sessions", type=int, default=8, help="agent loops calling at once")
    parser.add_argument("--calls", type=int, default=4, help="calls of each session (each on the whole "
                        "conversation so far)")
    parser.add_argument("--max-tokens", type=int, default=32, help="max_tokens of each call")
    parser.add_argument("--size", choices=SIZES, default="1m", help="the tiny model's preset")
    parser.set_defaults(measure=_measure)
