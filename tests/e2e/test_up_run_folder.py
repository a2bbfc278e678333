"""A run folder holds one run, through `zerobubble up` and its real services: a second run there is refused, naming
--resume; --overwrite starts clean (only the new run's steps, checkpoints and evaluations); resuming a run that has
trained its max_steps says so and starts nothing; a start that failed shows the service's error and leaves the
folder free. Output goes to a file, so each step is printed as a line."""

from __future__ import annotations

import json
import subprocess
import sys

from e2e_helpers import metrics_rows, service_env
from e2e_up import REPO, SMALL_RUN

from zerobubble.tooling.configs import DEMO as DEMO_CONFIG


def up(run_dir, *flags: str, **settings) -> subprocess.CompletedProcess:
    merged = {"run_dir": run_dir, **SMALL_RUN, **settings}
    command = [sys.executable, "-m", "zerobubble", "up", "--config", str(DEMO_CONFIG), *flags,
               *(f"--set={key}={value}" for key, value in merged.items())]
    return subprocess.run(command, cwd=REPO, env=service_env(), capture_output=True, text=True, timeout=600)


def evaluations(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "eval" / "summary.jsonl").read_text().splitlines()]


def test_a_run_folder_holds_one_run(tmp_path):
    run_dir = tmp_path / "run"
    first = up(run_dir, **{"trainer.max_steps": 2, "trainer.checkpoint.interval_steps": 1})
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "] step 2 " in first.stdout, first.stdout[-3000:]  # the last step, though output is not a terminal
    assert [row["step"] for row in metrics_rows(run_dir)] == [1, 2]

    again = up(run_dir, **{"trainer.max_steps": 1})
    assert again.returncode == 2
    assert f"--resume {run_dir}" in again.stderr and "--overwrite" in again.stderr
    assert [row["step"] for row in metrics_rows(run_dir)] == [1, 2], "a refused run touched the folder"

    done = subprocess.run([sys.executable, "-m", "zerobubble", "up", "--resume", str(run_dir)], cwd=REPO,
                          env=service_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "nothing left to do" in done.stdout, done.stdout + done.stderr

    fresh = up(run_dir, "--overwrite", **{"trainer.max_steps": 1})
    assert fresh.returncode == 0, fresh.stdout[-3000:] + fresh.stderr[-3000:]
    assert [row["step"] for row in metrics_rows(run_dir)] == [1]
    checkpoints = sorted(p.name for p in (run_dir / "trainer" / "checkpoints").glob("step-*"))
    assert checkpoints == ["step-000001"]
    assert [e["version"] for e in evaluations(run_dir)] == [0]
    result = json.loads(fresh.stdout.strip().splitlines()[-1])
    # final_eval is off and no evaluation came after training: no "after" of the starting weights.
    assert result["version_before"] == 0 and "eval_after" not in result and "version_after" not in result

    # The run's checkpoint, evaluated as the run's own evaluations are.
    held_out = next((tmp_path / ".assets").glob("arithmetic-*/eval.jsonl"))
    scored = subprocess.run([sys.executable, "-m", "zerobubble", "eval", str(run_dir / "trainer" / "checkpoints" /
                             "step-000001"), "--data", str(held_out), "--run", str(run_dir), "--samples", "2",
                             "--out", str(tmp_path / "scored")], cwd=REPO, env=service_env(), capture_output=True,
                            text=True, timeout=300)
    assert scored.returncode == 0, scored.stdout[-3000:] + scored.stderr[-3000:]
    summary = json.loads(scored.stdout.strip().splitlines()[-1])
    assert summary["n"] == 2 and summary["prompts"] == SMALL_RUN["task.eval_size"]


def test_a_failed_start_shows_the_services_error_and_leaves_the_folder_free(tmp_path):
    envs = tmp_path / "envs"
    envs.mkdir()
    (envs / "my_envs.py").write_text("class Other:\n    pass\n")
    run_dir = tmp_path / "run"
    entry = {"name": "broken", "environment": "my_envs:NoSuchClass", "path": str(envs)}
    failed = up(run_dir, **{"environment.environments": json.dumps([entry])})
    assert failed.returncode == 1, failed.stdout[-3000:] + failed.stderr[-3000:]
    # The console shows what the environment service's log says, not only where the log is.
    assert "environment exited with code" in failed.stdout and "NoSuchClass" in failed.stdout, failed.stdout[-3000:]
    assert "free for the next try" in failed.stdout
    assert (run_dir / "logs" / "environment.log").exists() and not (run_dir / "configs").exists()
    # Trying again needs no --overwrite.
    again = up(run_dir, "--dry-run")
    assert again.returncode == 0 and "holds a run" not in again.stderr, again.stderr[-3000:]
