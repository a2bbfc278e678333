"""`zerobubble bench train` at a small shape: both paths run the real update in processes of their own, train the
same batch to the same loss, and report memory and tokens/s side by side."""

from __future__ import annotations

from zerobubble.tooling.bench.train import bench_train, spread_lengths


def test_response_lengths_spread_as_real_answers_do():
    lengths = spread_lengths(64, 16, 1024, 1 / 16)
    assert min(lengths) >= 16 and lengths.count(1024) >= 4
    assert sorted(lengths)[32] < 1024 / 4  # most answers are short


def test_train_bench_measures_both_paths_on_the_same_batch():
    figures = bench_train(shape="small", layers=1, samples=8, group_size=4, prompt_tokens=8, longest=48, shortest=2,
                          long_fraction=1 / 8, micro_batch_samples=2, max_tokens_per_micro_batch=64,
                          logprob_chunk_tokens=16, threads=1)
    for path in ("today", "new"):
        assert figures[path]["tokens_per_s"] > 0 and figures[path]["peak_rss_gib"] > 0, figures[path]
    assert figures["same_loss"], (figures["today"]["loss"], figures["new"]["loss"])
    assert figures["settings"]["today"]["logprob_chunk_tokens"] is None and figures["settings"]["new"]["packing"]
    assert figures["padded_positions"] == 8 * (8 + figures["response_tokens"]["longest"])
    assert figures["peak_memory_ratio"] > 0 and figures["tokens_per_s_ratio"] > 0
