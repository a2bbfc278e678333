"""The tinker-cookbook's loops run from the project's side: a Tinker front in a process of its own (this
environment's interpreter, which has the project's torch), and a loop in the cookbook's environment
(.venv-cookbook, `make cookbook-env`) pointed at it by base URL, API key and model name only. The front serves
the model under its folder's path as the model name, so the cookbook's get_tokenizer loads that folder and no
download is tried."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from zerobubble.tooling.bench import stop_service
from zerobubble.tooling.ports import free_port

LOOPS = Path(__file__).resolve().parent / "cookbook" / "loops.py"
FRONT_START_SECONDS = 120


@dataclass(frozen=True)
class Front:
    url: str
    token: str
    model_name: str
    process: subprocess.Popen


@contextmanager
def running_front(model_dir: Path, folder: Path, token: str, **settings: Any):
    """A front serving `model_dir` (named by its path) until the block ends; `settings` are TinkerServerConfig's."""
    folder.mkdir(parents=True, exist_ok=True)
    listen = f"127.0.0.1:{free_port()}"
    config = folder / "tinker.yaml"
    model_name = str(Path(model_dir).resolve())
    config.write_text(yaml.safe_dump({"listen": listen, "model_name": model_name, "model_dir": model_name,
                                      "auth": {"auth_token_env": "ZB_TINKER_TOKEN"}, **settings}))
    with open(folder / "front.log", "w") as log:
        process = subprocess.Popen([sys.executable, "-m", "zerobubble", "tinker", "--config", str(config)],
                                   env={**os.environ, "ZB_TINKER_TOKEN": token}, stdout=log,
                                   stderr=subprocess.STDOUT)
        front = Front(f"http://{listen}", token, model_name, process)
        try:
            _wait_healthy(front)
            yield front
        finally:
            stop_service(process, grace=10)


def _wait_healthy(front: Front) -> None:
    import httpx

    end = time.monotonic() + FRONT_START_SECONDS
    while time.monotonic() < end:
        if front.process.poll() is not None:
            raise RuntimeError(f"the Tinker front exited with {front.process.returncode}")
        try:
            if httpx.get(f"{front.url}/api/v1/healthz", headers={"X-API-Key": front.token},
                         timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the Tinker front did not answer within {FRONT_START_SECONDS} s")


@dataclass(frozen=True)
class LoopRun:
    result: dict[str, Any]        # what loops.py wrote: the module that ran, its wall seconds
    metrics: list[dict[str, Any]]  # the cookbook's metrics.jsonl, one record a step (evaluations included)
    checkpoints: list[dict[str, Any]]  # its checkpoints.jsonl: names and tinker:// paths

    @property
    def final(self) -> dict[str, Any]:
        return next(record for record in reversed(self.checkpoints) if record["name"] == "final")


def run_loop(python: Path, front: Front, loop: str, config: dict[str, Any], dataset: dict[str, Any],
             folder: Path, timeout: float | None = None) -> LoopRun:
    """One cookbook loop (loops.py: "sl" or "rl") against `front`, in `folder` (the cookbook's log_path is
    folder/log). `config` is the loop's own Config but base_url, model_name and log_path, which this sets."""
    folder.mkdir(parents=True, exist_ok=True)
    log_path = folder / "log"
    settings = {"loop": loop, "dataset": dataset,
                "config": {**config, "base_url": front.url, "model_name": front.model_name, "log_path": str(log_path)}}
    (folder / "settings.json").write_text(json.dumps(settings, indent=1))
    result_path = folder / "result.json"
    # The cookbook records the working folder's git diff beside its logs: the run's own folder has none. Offline,
    # a tokenizer or data set that is not local fails at once instead of being fetched.
    command = [str(Path(python).absolute()), str(LOOPS), str(folder / "settings.json"), str(result_path)]
    with open(folder / "loop.log", "w") as log:
        done = subprocess.run(command,
                              cwd=folder, stdout=log, stderr=subprocess.STDOUT, timeout=timeout, check=False,
                              env={**_without_project_paths(os.environ), "TINKER_API_KEY": front.token,
                                   "HF_HUB_OFFLINE": "1"})
    if done.returncode != 0 or not result_path.exists():
        raise RuntimeError(f"the cookbook's {loop} loop exited {done.returncode}; see {folder / 'loop.log'}")
    return LoopRun(json.loads(result_path.read_text()), _jsonl(log_path / "metrics.jsonl"),
                   _jsonl(log_path / "checkpoints.jsonl"))


def _without_project_paths(environ: dict[str, str]) -> dict[str, str]:
    # The cookbook's interpreter must not find this environment's packages through an inherited PYTHONPATH.
    return {key: value for key, value in environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
