"""Bad input to `up` and `serve` is refused before torch loads: the config, the model folder and the data are
checked first (`zerobubble bench refusals` measures how fast)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# Each case: the command line, and what the refusal names.
CASES = {
    "up: a mistyped key": (["up", "--set", "trainer.max_stpes=3"], "max_stpes"),
    "up: an unknown preset": (["up", "--set", "run.algorithm=GRPPO"], "run.algorithm"),
    "up: a missing model": (["up", "-m", "{tmp}/no-model", "--set", "run_dir={tmp}/run"], "no such folder"),
    "up: missing data": (["up", "-d", "{tmp}/no.jsonl", "--set", "run_dir={tmp}/run"], "train_data"),
    "up: a warm-up longer than the run": (["up", "-d", "{tmp}/rows.jsonl", "--set", "trainer.max_steps=1", "--set",
                                           "run_dir={tmp}/run"], "trainer.max_steps"),
    "serve trainer: a missing model": (["serve", "trainer", "--set", "model={tmp}/no-model"], "model: no such folder"),
    "serve rollout: a mistyped key": (["serve", "rollout", "--set", "model.path={tmp}", "--set", "generation.tmp=1"],
                                      "generation.tmp"),
    "serve buffer: missing data": (["serve", "buffer", "--set", "prompts.path={tmp}/no.jsonl"], "prompts.path"),
}

# Runs the command in this interpreter, then reports the heavy modules it imported.
PROBE = """
import json, sys
from zerobubble.tooling.cli import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "loaded": [m for m in ("torch", "transformers", "grpc") if m in sys.modules]}))
"""


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_refused_before_torch_or_grpc_loads(case, tmp_path):
    argv, named = CASES[case]
    argv = [arg.format(tmp=tmp_path) for arg in argv]
    (tmp_path / "rows.jsonl").write_text((json.dumps({"prompt": "1+1?", "gt_answer": "2"}) + "\n") * 400)
    out = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=120)
    report = json.loads(out.stdout.splitlines()[-1])
    assert report["code"] == 2 and named in out.stderr, out.stderr
    assert report["loaded"] == [], f"{case} imported {report['loaded']} before refusing"
