"""`zerobubble bench transport` at a tiny scale: every case runs end to end and reports its figures, each beside
its baseline measured in the same run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zerobubble.tooling.bench.transport import CASES, RAY_PYTHON, bench_transport

REPO = Path(__file__).resolve().parents[2]


def test_bench_transport_reports_every_case(tmp_path):
    missing = tmp_path / "no-ray" / "python"
    result = bench_transport(scale=0.001, workdir=tmp_path, commit_every=4, ray_python=missing)
    json.dumps(result)
    assert [case["case"] for case in result["cases"]] == [name for name, *_ in CASES]
    for case in result["cases"]:
        assert case["groups"] == 10 and case["commits"] == 3
        assert case["groups_per_s"] > 0 and case["socket_mb_per_s"] > 0 and 0 < case["ratio_to_socket"] < 10
        # The limits beside it: the disk's fsynced rate at the group's size, into a new file and a reused one.
        disk, ratio = case["disk_fsync_groups_per_s"], case["ratio_to_disk_fsync"]
        assert set(disk) == set(ratio) == {"new_file", "reused_file"} and min(disk.values()) > 0
        assert ratio["new_file"] == pytest.approx(case["groups_per_s"] / disk["new_file"], rel=0.01)
        assert case["socket_groups_per_s"] == pytest.approx(case["socket_mb_per_s"] * 1e6 / case["group_bytes"],
                                                           rel=0.01)
        assert set(case["cpu_ms_per_group"]) == {"buffer", "pusher", "puller"}
        assert case["cpu_ms_per_group"]["buffer"] > 0
        (only,) = case["rounds"]
        assert only["groups_per_s"] == case["groups_per_s"] and only["load_average"] >= 0
    large = result["cases"][-1]
    assert large["group_bytes"] > 3.5 * 1024 * 1024
    # Without the Ray environment the baseline says why, and no ratio is made up.
    assert str(missing) in large["ray_queue"]["skipped"] and "make ray-env" in large["ray_queue"]["skipped"]
    assert "ratio_to_ray_queue" not in large
    assert not [path for path in tmp_path.iterdir() if path.name != "no-ray"], "the scratch folder is removed"


def test_bench_transport_measures_the_ray_queue_live_in_every_round(tmp_path):
    python = REPO / RAY_PYTHON
    if not python.exists():
        pytest.skip(f"no Ray environment at {python}: `make ray-env` builds it")
    result = bench_transport(scale=0.001, workdir=tmp_path, commit_every=4, ray_python=python, rounds=2)
    large = result["cases"][-1]
    assert len(large["rounds"]) == 2
    for figures in large["rounds"]:
        ray = figures["ray_queue"]
        assert ray["items"] == large["groups"] and ray["seconds"] > 0 and ray["ray_version"]
        # The same bytes on both sides, give or take the protobuf framing.
        assert abs(ray["item_bytes"] - large["group_bytes"]) < 1024
        assert figures["ratio_to_ray_queue"] == round(figures["groups_per_s"] / ray["items_per_s"], 2)
    ratios = [figures["ratio_to_ray_queue"] for figures in large["rounds"]]
    assert large["ratio_to_ray_queue"] == pytest.approx(sum(ratios) / 2), "the median of two is their mean"


def test_bench_transport_measures_only_the_cases_asked_for(tmp_path):
    result = bench_transport(scale=0.001, workdir=tmp_path, commit_every=4, ray_python=tmp_path / "no-ray",
                             cases=["8x512 tokens"])
    assert [case["case"] for case in result["cases"]] == ["8x512 tokens"]
