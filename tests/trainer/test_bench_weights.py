"""`zerobubble bench weights` at a tiny size: the broadcast modes, and the train-step comparison with and without
a background sync (alternating rounds, medians with their spread, and proof that the syncs overlapped the steps
they are charged to and none of the baseline's)."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from zerobubble.tooling.bench.weights import _Step, register_bench

ROUNDS, STEPS = 2, 2
FANOUT = (1, 2)


@pytest.fixture(scope="module")
def result():
    threads_before = torch.get_num_threads()
    parser = argparse.ArgumentParser()
    register_bench(parser.add_subparsers(dest="what"))
    args = parser.parse_args(["weights", "--sizes", "tiny", "--repeats", "1", "--bucket-mb", "0.05",
                              "--rounds", str(ROUNDS), "--steps", str(STEPS), "--seq-len", "16", "--threads", "1",
                              "--fanout-receivers", ",".join(map(str, FANOUT))])
    measured = args.measure(args)
    assert torch.get_num_threads() == threads_before, "the bench gives the process its thread count back"
    return json.loads(json.dumps(measured))


def test_broadcast_modes_are_measured(result):
    assert result["torch_threads"] == 1
    (size,) = result["broadcast"]
    assert size["size"] == "tiny" and size["buckets"] > 1 and size["bytes"] == 2 * size["parameters"]
    for key in ("bucketed_seconds", "per_tensor_seconds", "flat_seconds", "bucketed_gb_per_s", "per_tensor_gb_per_s",
                "flat_gb_per_s", "load_seconds", "bucketed_speedup_over_per_tensor"):
        assert size[key] > 0, key


def test_step_slowdown_is_the_ratio_of_medians_over_alternating_rounds(result):
    step = result["train_step"]
    assert (step["rounds"], step["steps"], step["threads"]) == (ROUNDS, STEPS, 1)
    assert step["step_slowdown"] == pytest.approx(step["step_seconds_with_sync"] / step["step_seconds"])
    assert step["ratio"] == step["step_slowdown"]
    assert len(step["round_slowdowns"]) == ROUNDS and all(r > 0 for r in step["round_slowdowns"])
    for key, median_key in (("step_seconds_spread", "step_seconds"),
                            ("step_seconds_with_sync_spread", "step_seconds_with_sync")):
        spread = step[key]
        assert spread["min"] <= spread["q1"] <= spread["median"] <= spread["q3"] <= spread["max"], key
        assert spread["median"] == step[median_key]
    assert step["cpu_slowdown"] == pytest.approx(step["step_cpu_seconds_with_sync"] / step["step_cpu_seconds"])
    for key in ("compute_slowdown", "cpu_slowdown", "publish_seconds", "copy_seconds", "sync_seconds",
                "end_to_end_sync_seconds"):
        assert step[key] > 0, key


def test_syncs_overlap_the_steps_with_sync_and_none_of_the_baseline(result):
    step = result["train_step"]
    assert step["steps_with_sync"] == ROUNDS * STEPS
    # Each phase with sync publishes before its first step and after every step; publishes coalesce.
    assert ROUNDS <= step["versions_synced_while_training"] <= ROUNDS * (STEPS + 1)
    assert 1 <= step["steps_overlapped"] <= step["steps_with_sync"]
    assert 0 < step["overlap_fraction"] <= 1
    assert step["baseline_steps_overlapped"] == 0


def test_the_fanout_measures_each_count_against_a_flat_broadcast_of_the_same_bytes(result):
    fanout = result["fanout"]
    assert fanout["size"] == "tiny" and [c["receivers"] for c in fanout["counts"]] == list(FANOUT)
    (size,) = result["broadcast"]
    for count in fanout["counts"]:
        assert count["bytes"] == size["bytes"]
        for key in ("flat_seconds", "sync_seconds", "end_to_end_sync_seconds"):
            assert count[key] > 0, key
        # The broadcaster's own span of a version lies inside the publish-to-acknowledged time.
        assert count["sync_seconds"] <= count["end_to_end_sync_seconds"]
        assert count["limit_ratio"] == pytest.approx(count["flat_seconds"] / count["sync_seconds"])
        assert count["end_to_end_limit_ratio"] == pytest.approx(count["flat_seconds"]
                                                                / count["end_to_end_sync_seconds"])
        # The sync's critical path, part by part, from the trainer's and the workers' clocks (one host): a part
        # below zero would mean the times were taken out of order.
        parts = count["sync_parts"]
        assert set(parts) == {"before_announce", "announce", "prepare", "transfer", "acknowledge", "notice", "sent"}
        assert all(seconds >= 0 for seconds in parts.values()), parts
        assert 0 < parts["transfer"] <= count["sync_seconds"]
        assert count["copy_seconds"] > 0
        for mode in ("flat_cpu", "sync_cpu"):
            cpu = count[mode]
            assert cpu["trainer_cpu_seconds"] > 0 and cpu["receiver_cpu_seconds"] >= 0
            assert cpu["total_cpu_seconds"] >= cpu["trainer_cpu_seconds"] and cpu["cores_busy"] > 0
    first, second = fanout["counts"]
    assert first["flat_growth"] == first["sync_growth"] == 1.0
    assert second["flat_growth"] == pytest.approx(second["flat_seconds"] / first["flat_seconds"])
    assert fanout["worst_limit_ratio"] == min(first["limit_ratio"], second["limit_ratio"])


def test_step_overlap_adds_the_shared_time_of_every_sync():
    step = _Step(started=1.0, ended=3.0, publish_seconds=0.1, cpu_seconds=1.5)
    assert step.seconds == 2.0
    assert step.overlap([(0.0, 1.5), (2.5, 4.0), (5.0, 6.0)]) == pytest.approx(1.0)
    assert step.overlap([(0.0, 1.0), (3.0, 4.0)]) == 0.0
    assert step.overlap([(0.0, 9.0)]) == pytest.approx(2.0)


def test_an_adapter_sync_moves_under_five_percent_of_the_bytes_of_a_full_sync_of_the_demo_model(result):
    lora = result["lora"]
    assert (lora["tiny_size"], lora["rank"]) == ("1m", 8)
    # fp32 weights as the trainer publishes them; each adapter tensor aligned in its bucket.
    assert lora["full_bytes"] >= 4 * lora["parameters"]
    assert 4 * lora["adapter_parameters"] <= lora["adapter_bytes"] < lora["full_bytes"]
    assert lora["bytes_ratio"] == pytest.approx(lora["adapter_bytes"] / lora["full_bytes"])
    assert lora["bytes_ratio"] < 0.05
    assert lora["sync_seconds_ratio"] == pytest.approx(lora["adapter_sync_seconds"] / lora["full_sync_seconds"])
    for key in ("full_sync_seconds", "adapter_sync_seconds", "full_load_seconds", "adapter_load_seconds"):
        assert lora[key] > 0, key
