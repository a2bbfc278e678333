"""`zerobubble.run(config)`: `zerobubble up` from Python, through the real services; bad input is a ConfigError
naming the field before anything starts, and a finished run returns its summary (also RUN_DIR/summary.json)."""

from __future__ import annotations

import json
import subprocess
import sys

from e2e_helpers import metrics_rows, service_env
from e2e_up import REPO, SMALL_RUN

SCRIPT = """
import json, sys
import zerobubble
from zerobubble.common.config import ConfigError

overrides = json.loads(sys.argv[1])
try:
    zerobubble.run(overrides={**overrides, "run.verifier": "nope"})
except ConfigError as exc:
    print("refused:", exc)
result = zerobubble.run(overrides=overrides)
print(json.dumps({"ok": result.ok, "run_dir": str(result.run_dir), "summary": result.summary}))
"""


def test_run_from_python_checks_first_and_returns_the_summary(tmp_path):
    run_dir = tmp_path / "run"
    overrides = {"run_dir": str(run_dir), **SMALL_RUN, "trainer.max_steps": 1}
    out = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(overrides)], cwd=REPO, env=service_env(),
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert any(line.startswith("refused: run.verifier: unknown verifier 'nope'") for line in lines), out.stdout
    result = json.loads(lines[-1])
    assert result["ok"] and result["run_dir"] == str(run_dir)
    assert result["summary"] == json.loads((run_dir / "summary.json").read_text())
    assert result["summary"]["version_before"] == 0 and "eval_before" in result["summary"]
    assert [row["step"] for row in metrics_rows(run_dir)] == [1]
