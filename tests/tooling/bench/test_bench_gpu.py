"""The GPU benches at a small shape on whatever device there is (the CPU in CI): each runs the real
trainer step, engine and sync paths to the end and reports figures beside the device's measured limits;
the sync paths deliver the trainer's exact weights."""

from __future__ import annotations

import pytest
import torch

from zerobubble.common.cuda_ipc import export_handles
from zerobubble.tooling.bench.gpu import bench_gpu_generate, bench_gpu_sync, bench_gpu_train


def test_gpu_train_bench_runs_the_real_update_and_relates_it_to_the_peak():
    figures = bench_gpu_train(shape="small", groups=2, group_size=4, prompt_tokens=8, response_tokens=8,
                              micro_batch_samples=4, steps=1)
    assert figures["samples"] == 8 and figures["tokens_per_step"] == 8 * 16
    assert figures["step_seconds"] > 0 and figures["bf16_matmul_tflops"] > 0
    assert figures["tokens_per_s"] == pytest.approx(figures["tokens_per_step"] / figures["step_seconds"], rel=0.01)


def test_gpu_generate_bench_counts_every_generated_token():
    figures = bench_gpu_generate(shape="small", prompts=2, samples=2, max_new_tokens=4, prompt_tokens=4, repeats=1)
    assert 4 <= figures["generated_tokens"] <= 2 * 2 * 4
    assert 0 < figures["fraction_of_weight_read_bound"]


def test_gpu_sync_bench_delivers_the_trainers_weights():
    figures = bench_gpu_sync(shape="small", bucket_mb=0.25, repeats=1)
    paths = ["gloo_host", "cuda_ipc"] if torch.cuda.is_available() else ["gloo_host"]
    for path in paths:
        assert figures[path]["weights_match"] and figures[path]["gb_per_s"] > 0


def test_cuda_ipc_refuses_host_buffers_by_index():
    with pytest.raises(ValueError, match=r"buffers\[0\]"):
        export_handles([torch.zeros(4)])
