"""`zerobubble bench scale` scaled down: the fan-in moves every group exactly once, both it and its one-to-one
baseline are measured in the run, and the restart recovers the whole log beside its read-back baseline."""

from __future__ import annotations

import json

from zerobubble.tooling.bench.scale import bench_scale


def test_bench_scale_loses_nothing_and_measures_its_baselines(tmp_path):
    result = bench_scale(producers=6, pullers=2, groups_per_producer=3, tokens=64, step=2, wal_gb=(0.02,),
                         workdir=tmp_path)
    json.dumps(result)
    for name, producers, pullers in (("one_to_one", 1, 1), ("fan_in", 6, 2)):
        case = result[name]
        assert (case["producers"], case["pullers"], case["groups"]) == (producers, pullers, 18)
        assert case["acknowledged_stored"] == case["pulled"] == 18
        assert case["pulled_twice"] == case["lost"] == 0 and not case["push_failures"]
        assert case["groups_per_s"] > 0 and 0 < case["ack_p50_ms"] <= case["ack_p99_ms"] <= case["ack_max_ms"]
    fan_in = result["fan_in"]
    assert fan_in["ratio_to_one_to_one"] == round(fan_in["groups_per_s"] / result["one_to_one"]["groups_per_s"], 3)
    assert result["empty_log_start_seconds"] > 0
    (recovery,) = result["recovery"]
    assert recovery["groups_logged"] == recovery["groups_recovered"] == 5  # 0.02 GB of 3.5 MiB groups
    assert recovery["log_gb"] >= 0.018 and recovery["recovery_seconds"] > 0 and recovery["read_log_seconds"] > 0
    assert not list(tmp_path.iterdir()), "the scratch folder is removed"
