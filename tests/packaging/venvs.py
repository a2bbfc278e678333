"""The project as a user installs it: its wheel in a fresh virtual environment (no system site-packages), with pip's
cache and the machine's local wheels, as `pip install zerobubble` would."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Exact versions of the test suite (constraints.txt) and the lowest pyproject.toml admits (constraints-lowest.txt).
CONSTRAINTS = ROOT / "constraints.txt"
LOWEST = ROOT / "constraints-lowest.txt"
INSTALL_SECONDS = 600


def build_wheel(out: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "-w", str(out), str(ROOT)], check=True, timeout=300)
    (wheel,) = out.glob("zerobubble-*.whl")
    return wheel


def make_venv(path: Path, requirement: str, constraints: Path) -> Path:
    """A fresh environment with `requirement` installed under `constraints`; returns its bin folder."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    # The running pip installs into the new environment, which then holds no pip or setuptools of its own.
    subprocess.run([sys.executable, "-m", "pip", "--python", str(path / "bin" / "python"), "install", "--quiet",
                    "-c", str(constraints), requirement], check=True, timeout=INSTALL_SECONDS)
    return path / "bin"


def installed_version(bin_dir: Path, distribution: str) -> str:
    code = f"import importlib.metadata as m; print(m.version({distribution!r}))"
    return subprocess.run([str(bin_dir / "python"), "-c", code], capture_output=True, text=True, check=True,
                          timeout=60).stdout.strip()


def clean_env() -> dict[str, str]:
    """The environment of a command run as a user would: nothing pointing back at this checkout's environment."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    return {**env, "PYTHONUNBUFFERED": "1"}


@contextmanager
def serve_reward(bin_dir: Path, http_port: int, cwd: Path) -> Iterator[str]:
    """`zerobubble serve reward` of that environment with HTTP on `http_port`; yields the gRPC address."""
    command = [str(bin_dir / "zerobubble"), "serve", "reward", "--listen", "127.0.0.1:0",
               "--set", f"http.listen=127.0.0.1:{http_port}", "--set", "math.workers=1", "--set", "sandbox.slots=1"]
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=log, text=True, env=clean_env())
    try:
        line = proc.stdout.readline()
        if not line:
            proc.wait(60)
            log.seek(0)
            raise AssertionError(f"serve reward did not start: {log.read()}")
        yield json.loads(line)["address"]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
