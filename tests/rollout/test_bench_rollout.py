"""`zerobubble bench rollout` at a tiny budget: the bare engine and a real worker (real reward service, real
buffer) generate the same tokens, and every figure is there and positive."""

from __future__ import annotations

import argparse

from zerobubble.rollout.engine_factory import vllm_available
from zerobubble.tooling.bench.rollout import register_bench

PROMPTS = 4


def test_bench_rollout_measures_engine_and_worker_on_the_same_tokens():
    parser = argparse.ArgumentParser()
    register_bench(parser.add_subparsers(dest="what"))
    args = parser.parse_args(["rollout", "--prompts", str(PROMPTS), "--samples", "2", "--max-new-tokens", "4",
                              "--batch-prompts", "2", "--threads", "1", "--rounds", "1"])
    figures = args.measure(args)

    engine, worker = figures["engine"], figures["worker"]
    assert figures["model"] == "tiny-2m" and figures["torch_threads"] == 1
    assert engine["tokens"] > 0 and engine["tokens_per_s"] > 0
    assert len(engine["tokens_per_s_runs"]) == 2 and min(engine["tokens_per_s_runs"]) > 0
    # Same prompts, batches and seeds: the worker generated exactly what the engine did, and pushed it all.
    assert figures["same_tokens"] is True and worker["tokens"] == engine["tokens"]
    assert worker["groups_pushed"] == PROMPTS and worker["groups_in_buffer"] == PROMPTS
    assert worker["tokens_per_s"] > 0 and worker["reward_wait_seconds"] > 0
    assert figures["worker_vs_engine_ratio"] > 0
    if vllm_available():
        assert isinstance(figures["vllm"], (dict, str))
    else:
        assert figures["vllm"] == "not installed" and "transformers_vs_vllm_ratio" not in figures
