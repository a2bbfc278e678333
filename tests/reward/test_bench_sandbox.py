"""`zerobubble bench reward --sandbox-only` scaled down: sandboxed programs/s beside bare spawns of the same program,
both measured in the run, and the stages of one sandboxed run."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from zerobubble.tooling.bench.reward import bench_sandbox

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("bwrap") is None,
                                reason="the sandbox needs root and bubblewrap (make sandbox-tool)")


def test_bench_sandbox_measures_both_sides_in_the_run():
    result = bench_sandbox(programs=4)
    json.dumps(result)
    assert result["code_programs_per_s"] > 0 and result["bare_program_spawns_per_s"] > 0
    ratio = result["code_programs_per_s"] / result["bare_program_spawns_per_s"]
    assert result["code_vs_bare_spawn_ratio"] == pytest.approx(ratio, rel=0.05)
    assert os.path.isabs(result["python"])
    stages = result["sandbox_stages_ms"]
    assert set(stages) == {"bare_program", "bubblewrap_alone", "launcher_interpreter", "sandboxed_run"}
    assert all(value > 0 for value in stages.values())
