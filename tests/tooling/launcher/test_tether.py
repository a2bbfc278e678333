"""The run folder's lock and the launcher pipe, with a real service process holding them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from zerobubble.tooling.launcher.config import write_yaml
from zerobubble.tooling.launcher.processes import ServiceProcess
from zerobubble.tooling.launcher.tether import KILL_MARGIN_SECONDS, LAUNCHER_FD, RunFolderBusy, Tether

REPO = Path(__file__).resolve().parents[3]
GRACE_SECONDS = 1.0


def reward_service(run_dir: Path, tether: Tether) -> ServiceProcess:
    config = write_yaml(run_dir / "configs" / "reward.yaml", {
        "server": {"listen": "127.0.0.1:0", "metrics_port": None, "grace_seconds": GRACE_SECONDS},
        "math": {"workers": 1}})
    return ServiceProcess("reward", "reward", config, run_dir / "logs", tether=tether)


def test_a_second_claim_of_a_held_folder_names_the_live_holders(tmp_path):
    tether = Tether.hold(tmp_path)
    try:
        with pytest.raises(RunFolderBusy, match=rf"{re.escape(str(tmp_path))} is in use .*up \(pid {os.getpid()}\)"):
            Tether.hold(tmp_path)
    finally:
        tether.release()
    Tether.hold(tmp_path).release()


def test_up_is_refused_while_a_service_holds_the_folder_and_the_service_goes_with_its_launcher(tmp_path):
    run_dir = tmp_path / "run"
    tether = Tether.hold(run_dir)
    service = reward_service(run_dir, tether)
    try:
        service.start(120)
        up = subprocess.run([sys.executable, "-m", "zerobubble", "up", "--set", f"run_dir={run_dir}"],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
        assert up.returncode == 1, up.stdout + up.stderr
        assert str(run_dir) in up.stdout and f"reward (pid {service.process.pid})" in up.stdout, up.stdout
        assert not (run_dir / "configs" / "up.yaml").exists(), "the refused launcher wrote into the live run"

        # The folder is still held by the service alone until it has gone.
        tether.release()
        service.process.wait(GRACE_SECONDS + KILL_MARGIN_SECONDS + 30)
        assert "the launcher is gone" in service.log_path.read_text()
        Tether.hold(run_dir).release()
    finally:
        service.kill()


def test_a_service_that_outlives_its_grace_is_killed_with_its_process_group(tmp_path):
    """A service deaf to SIGTERM (here: told to ignore it) is killed once its grace and the margin are over."""
    read, write = os.pipe()
    code = ("import signal, sys, time\n"
            "from zerobubble.tooling.launcher.tether import follow_launcher\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            f"follow_launcher({GRACE_SECONDS})\n"
            "print('ready', flush=True)\n"
            "time.sleep(600)\n")
    child = subprocess.Popen([sys.executable, "-c", code], pass_fds=(read,), stdout=subprocess.PIPE,
                             env={**os.environ, LAUNCHER_FD: str(read)}, start_new_session=True)
    os.close(read)
    try:
        assert child.stdout.readline() == b"ready\n"
        time.sleep(1.0)
        assert child.poll() is None
        os.close(write)
        assert child.wait(GRACE_SECONDS + KILL_MARGIN_SECONDS + 30) == -9
    finally:
        if child.poll() is None:
            child.kill()
