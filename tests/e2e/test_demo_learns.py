"""A shorter `zerobubble up` of the demo: interrupted with Ctrl-C part way, continued with --resume, and better
on the held-out questions at the end than before by more than sampling noise can explain."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from e2e_helpers import metrics_rows, service_env

from zerobubble.tooling.configs import DEMO as DEMO_CONFIG

REPO = Path(__file__).resolve().parents[2]
STEPS = 60
INTERRUPT_AFTER = 20
EVAL_SAMPLES = 16
# A one-sided z of 3 is a chance of about 1 in 700 that noise alone gives the improvement.
Z_NOISE = 3.0


def up(run_dir: Path, *extra: str) -> subprocess.Popen:
    settings = {
        "run_dir": run_dir, "trainer.max_steps": STEPS, "trainer.checkpoint.interval_steps": 10,
        "rollout.eval.interval": 1000, "rollout.eval.samples_per_prompt": EVAL_SAMPLES,
        # The first STEPS of the demo's own schedule, not a whole cosine squeezed into them (derived from
        # max_steps): 950 x 2 // 8 steps, as `make demo` runs it.
        "trainer.strategy.optim.total_steps": 237,
    }
    command = [sys.executable, "-m", "zerobubble", "up", "--config", str(DEMO_CONFIG),
               *(f"--set={key}={value}" for key, value in settings.items()), *extra]
    return launch(command)


def resume(run_dir: Path) -> subprocess.Popen:
    return launch([sys.executable, "-m", "zerobubble", "up", "--resume", str(run_dir)])


def launch(command: list[str]) -> subprocess.Popen:
    # Its own session, so a failed test takes the services down with the launcher.
    return subprocess.Popen(command, cwd=REPO, env=service_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def finish(process: subprocess.Popen, timeout: float) -> str:
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        raise AssertionError(f"zerobubble up did not finish in {timeout:.0f} s:\n{output[-4000:]}") from None
    return output


def improvement_beyond_noise(before: float, after: float, n: int) -> float:
    """z of after - before for two pass@1 estimates over n samples each."""
    noise = math.sqrt((before * (1 - before) + after * (1 - after)) / n)
    return (after - before) / max(noise, 1e-9)


def test_the_demo_learns_across_an_interrupt_and_a_resume(tmp_path):
    run_dir = tmp_path / "run"
    launched = [up(run_dir)]
    try:
        summary, stopped_at = run_with_a_resume(run_dir, launched)
    finally:
        for process in launched:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)

    steps = [row["step"] for row in metrics_rows(run_dir)]
    # The second part continued from the checkpoint the interrupt left, not from the start.
    assert steps[stopped_at] > 1 and steps[-1] == STEPS, steps
    eval_rows = [json.loads(line) for line in (run_dir / "eval" / "summary.jsonl").read_text().splitlines()]
    assert [row["version"] for row in eval_rows] == [0, STEPS], eval_rows
    n = eval_rows[0]["prompts"] * EVAL_SAMPLES
    z = improvement_beyond_noise(summary["eval_before"], summary["eval_after"], n)
    assert z > Z_NOISE, f"held-out pass@1 {summary['eval_before']} -> {summary['eval_after']} (z {z:.1f}): {summary}"
    assert Path(summary["plot"]).is_file()


def run_with_a_resume(run_dir: Path, launched: list[subprocess.Popen]) -> tuple[dict, int]:
    """Ctrl-C after INTERRUPT_AFTER steps, then --resume to the end; the summary and the steps before the stop."""
    first = launched[0]
    deadline = time.monotonic() + 900
    while len(metrics_rows(run_dir)) < INTERRUPT_AFTER:
        assert first.poll() is None, f"the run ended before step {INTERRUPT_AFTER}:\n{finish(first, 10)[-4000:]}"
        assert time.monotonic() < deadline, "no training steps within 15 minutes"
        time.sleep(1)
    first.send_signal(signal.SIGINT)
    output = finish(first, 180)
    assert first.returncode == 130, output[-4000:]
    stopped_at = len(metrics_rows(run_dir))

    launched.append(resume(run_dir))
    output = finish(launched[-1], 900)
    assert launched[-1].returncode == 0, output[-4000:]
    return json.loads(output.strip().splitlines()[-1]), stopped_at
