"""`zerobubble bench refusals` at a small scale, through the command: each case refused naming its field, timed
beside the bare interpreter's start under the load the bench makes (its figures: docs/benchmarks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from zerobubble.tooling.bench.refusals import CASES


def test_bench_refusals_times_each_refusal_against_the_interpreters_start():
    result = subprocess.run([sys.executable, "-m", "zerobubble", "bench", "refusals", "--load", "1", "--repeats", "1"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["load_processes"] == 1 and figures["baseline"]["command"] == "python -c pass"
    assert figures["baseline"]["cpu_median_s"] > 0
    assert set(figures["cases"]) == set(CASES)
    for name, case in figures["cases"].items():
        assert case["refused_naming_the_field"], (name, case["message"])
        # A refusal's own CPU, not the spinner's (which spins through the whole bench).
        assert 0 < case["cpu_median_s"] < case["median_s"] * (os.cpu_count() or 1) + 1
        assert case["vs_baseline"] == round(case["median_s"] / figures["baseline"]["median_s"], 1)
    assert figures["all_under_1s"] == (figures["slowest_s"] < 1.0)
