"""A real Tinker front in its own process on a real socket, over the 1m tiny model, shared by this folder's tests;
and the official `tinker` client pointed at it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from tinker_data import MODEL, TOKEN

from zerobubble.tooling.bench import stop_service
from zerobubble.tooling.ports import free_port
from zerobubble.tooling.tiny.model import make_tiny_model


@dataclass(frozen=True)
class Server:
    url: str
    model_dir: Path
    process: subprocess.Popen


@pytest.fixture(scope="session")
def tinker_server(tmp_path_factory) -> Server:
    folder = tmp_path_factory.mktemp("tinker")
    model_dir = make_tiny_model(folder / "model", size="1m", seed=0)
    listen = f"127.0.0.1:{free_port()}"
    config = folder / "tinker.yaml"
    config.write_text(yaml.safe_dump({"listen": listen, "model_name": MODEL, "model_dir": str(model_dir),
                                      "auth": {"auth_token_env": "ZB_TINKER_TOKEN"}, "poll_wait_s": 5.0,
                                      "max_pending_per_session": 16, "max_models": 24,
                                      "max_models_per_session": 16}))
    log = (folder / "server.log").open("w")
    process = subprocess.Popen([sys.executable, "-m", "zerobubble", "tinker", "--config", str(config)],
                               env={**os.environ, "ZB_TINKER_TOKEN": TOKEN}, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://{listen}"
    try:
        _wait_healthy(url, process)
        yield Server(url, model_dir, process)
    finally:
        stop_service(process, grace=10)
        log.close()


def _wait_healthy(url: str, process: subprocess.Popen) -> None:
    end = time.monotonic() + 90
    while time.monotonic() < end:
        if process.poll() is not None:
            raise RuntimeError(f"the Tinker front exited with {process.returncode}")
        try:
            if httpx.get(f"{url}/api/v1/healthz", headers={"X-API-Key": TOKEN}, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the Tinker front did not answer within 90 s")


@pytest.fixture(scope="session")
def service_client(tinker_server):
    """The official client as a user makes one: base URL and API key, nothing else (its telemetry included, which
    the front accepts and drops)."""
    import tinker

    return tinker.ServiceClient(base_url=tinker_server.url, api_key=TOKEN)
