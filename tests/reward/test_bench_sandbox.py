"""`zerobubble bench reward --sandbox-only` scaled down: sandboxed programs/s, warm and cold, beside bare spawns of the
same program, all measured in the run, and the stages of one sandboxed run."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from zerobubble.tooling.bench.reward import bench_sandbox

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("bwrap") is None,
                                reason="the sandbox needs root and bubblewrap (make sandbox-tool)")


def test_bench_sandbox_measures_warm_cold_and_bare_in_the_run():
    result = bench_sandbox(programs=4, rounds=2)
    json.dumps(result)
    assert result["programs_each"] == 2 * max(result["cores"], 4 // 2)  # two rounds, each at least a program a slot
    warm, cold, bare = (result[key] for key in ("code_programs_per_s", "cold_code_programs_per_s",
                                                "bare_program_spawns_per_s"))
    assert warm > 0 and cold > 0 and bare > 0
    assert result["code_vs_bare_spawn_ratio"] == pytest.approx(warm / bare, rel=0.05)
    assert result["cold_vs_bare_spawn_ratio"] == pytest.approx(cold / bare, rel=0.05)
    assert result["warm_vs_cold_ratio"] == pytest.approx(warm / cold, rel=0.05)
    assert os.path.isabs(result["python"])
    stages = result["sandbox_stages_ms"]
    assert set(stages) == {"bare_program", "bubblewrap_alone", "launcher_interpreter", "sandboxed_run_cold",
                           "sandboxed_run_warm"}
    assert all(value > 0 for value in stages.values())
