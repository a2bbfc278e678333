"""`zerobubble bench transport` at a tiny scale: every case runs end to end and reports its figures."""

from __future__ import annotations

import json

from zerobubble.bench.transport import CASES, bench_transport


def test_bench_transport_reports_every_case(tmp_path):
    result = bench_transport(scale=0.001, workdir=tmp_path, commit_every=4)
    json.dumps(result)
    assert [case["case"] for case in result["cases"]] == [name for name, *_ in CASES]
    for case in result["cases"]:
        assert case["groups"] == 10 and case["commits"] == 3
        assert case["groups_per_s"] > 0 and 0 < case["ratio_to_socket"] < 10
    assert result["cases"][-1]["group_bytes"] > 3.5 * 1024 * 1024 and result["cases"][-1]["put_then_get_per_s"] > 0
    assert not list(tmp_path.iterdir()), "the scratch folder is removed"
