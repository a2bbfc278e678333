"""What the end-to-end tests share: the small run's service configs, service processes (on loopback or inside
a network namespace), and the figures a finished run leaves behind."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from zerobubble.buffer.config import BufferServiceConfig
from zerobubble.reward.config import RewardServiceConfig
from zerobubble.rollout.config import RolloutServiceConfig
from zerobubble.tooling.launcher.config import validated, write_yaml
from zerobubble.tooling.launcher.processes import ServiceProcess
from zerobubble.tooling.launcher.ready import READY_FILE
from zerobubble.trainer.config import TrainerServiceConfig

GENERATIONS = 4
GROUPS_PER_STEP = 4
MAX_NEW_TOKENS = 8
STARTUP_SECONDS = 120.0
SCHEMAS = {"reward": RewardServiceConfig, "buffer": BufferServiceConfig, "trainer": TrainerServiceConfig,
           "rollout": RolloutServiceConfig}
# A proxy from the environment would take the gRPC channels to non-loopback addresses away from the test network.
PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "grpc_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")


# A user's environment: feedback after the first answer, the end after the second; a reward that varies with the
# answer so that groups have something to compare.
FEEDBACK = "Check it once more."
FEEDBACK_ENVIRONMENT = f'''
class Feedback:
    def __init__(self):
        self.turns = 0

    def reset(self, row):
        return None

    def step(self, assistant_text):
        self.turns += 1
        if self.turns == 1:
            return {{"observation": "{FEEDBACK}", "reward": 0.0, "done": False, "info": {{}}}}
        return {{"observation": None, "reward": float(len(assistant_text) % 2), "done": True, "info": {{}}}}
'''


def user_environments(tmp_path: Path, module: str, source: str) -> Path:
    """A user's folder of environments, as `environment.environments[].path` takes it, holding `module`.py."""
    folder = tmp_path / "my_envs"
    folder.mkdir()
    (folder / f"{module}.py").write_text(textwrap.dedent(source))
    return folder


def service_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in PROXY_VARIABLES}
    return {**env, "PYTHONUNBUFFERED": "1"}


def _server(listen: str) -> dict:
    return {"listen": listen, "metrics_port": None, "grace_seconds": 1.0}


def reward_tree(listen: str) -> dict:
    return {"server": _server(listen), "math": {"workers": 1, "timeout_seconds": 10.0}}


def buffer_tree(listen: str, prompts: Path, wal: Path, **sections) -> dict:
    return {"server": _server(listen), "prompts": {"path": prompts}, "wal": {"directory": wal},
            "run_spec": {"num_generations": GENERATIONS, "max_new_tokens": MAX_NEW_TOKENS}, **sections}


def trainer_tree(listen: str, model: Path, run_dir: Path, buffer: str, store_host: str) -> dict:
    return {
        "server": _server(listen), "model": model, "run_dir": run_dir, "torch_threads": 1,
        "algorithm": {"preset": "GRPO", "beta": 0.0},
        "batch": {"groups_per_step": GROUPS_PER_STEP, "micro_batch_samples": 16, "max_new_tokens": MAX_NEW_TOKENS,
                  "pull_wait_seconds": 1.0},
        "checkpoint": {"interval_steps": 1000},
        "weight_sync": {"store_host": store_host, "member_timeout_s": 20.0},
        "buffer": {"address": buffer, "retry_seconds": 120.0},
    }


def rollout_tree(listen: str, worker_id: str, model: Path, *, buffer: str, reward: str, trainer: str,
                 seed: int) -> dict:
    return {
        "server": _server(listen), "worker_id": worker_id, "torch_threads": 1,
        "model": {"path": model, "device": "cpu", "dtype": "fp32"},
        "generation": {"num_generations": GENERATIONS, "max_new_tokens": MAX_NEW_TOKENS, "prompts_per_batch": 4,
                       "seed": seed},
        "buffer": {"address": buffer}, "reward_service": {"address": reward}, "trainer": {"address": trainer},
        "backoff_max_seconds": 1.0, "lease_wait_seconds": 0.2,
    }


def write_config(run_dir: Path, name: str, service: str, tree: dict) -> Path:
    """The config a service reads, checked against its schema first (a typo fails here, not in a child)."""
    validated(SCHEMAS[service], tree, name)
    return write_yaml(run_dir / "configs" / f"{name}.yaml", tree)


class NamespacedService(ServiceProcess):
    """`ip netns exec NETNS python -m zerobubble serve ...`: a service alone in its network namespace."""

    def __init__(self, name: str, service: str, config_path: Path, log_dir: Path, netns: str):
        super().__init__(name, service, config_path, log_dir)
        self.netns = netns

    def start(self, timeout: float) -> NamespacedService:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.ready_path.unlink(missing_ok=True)
        command = ["ip", "netns", "exec", self.netns, sys.executable, "-m", "zerobubble", "serve",
                   self.service, "--config", str(self.config_path)]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                            env={**service_env(), READY_FILE: str(self.ready_path)})
        ready = self._wait_ready(timeout)
        self.address, self.metrics_port = ready["address"], ready.get("metrics_port")
        self.wait_healthy(timeout)
        return self


def start_all(processes: list[ServiceProcess], timeout: float = STARTUP_SECONDS) -> None:
    """Start services side by side (each waits for its peers by retrying, so order does not matter)."""
    errors: list[BaseException] = []

    def start(process: ServiceProcess) -> None:
        try:
            process.start(timeout)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(p,)) for p in processes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def stop_all(processes: list[ServiceProcess]) -> None:
    for process in reversed(processes):
        process.stop(timeout=15.0)


def wait_for(condition, timeout: float, what: str, processes: list[ServiceProcess] = ()) -> None:
    """Poll `condition`; fail naming `what`, or naming a service that died meanwhile and its log's tail."""
    deadline = time.monotonic() + timeout
    while not condition():
        for process in processes:
            if process.exit_code is not None:
                raise AssertionError(f"{process.name} exited with {process.exit_code} while waiting for {what}:\n"
                                     f"{log_tail(process)}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


def log_tail(process: ServiceProcess, lines: int = 30) -> str:
    try:
        return "\n".join(process.log_path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def run_up(argv: list[str], *, cwd: Path | None = None, env: dict | None = None, timeout: float = 600) -> str:
    """`zerobubble up ARGV` to its end in a session of its own (killed whole if it overruns); its output, after
    asserting it exited 0."""
    process = subprocess.Popen([sys.executable, "-m", "zerobubble", "up", *argv], cwd=cwd, env=env or service_env(),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 0, output[-4000:]
    return output


def metrics_rows(run_dir: Path) -> list[dict]:
    path = run_dir / "trainer" / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def leftover_groups(trainer_log: Path) -> int:
    """Groups the trainer pulled at the end but did not train on (fewer than a step), from its log."""
    found = re.findall(r"end of the data: (\d+) groups left over", trainer_log.read_text(errors="replace"))
    return int(found[-1]) if found else 0


def loaded_versions(rollout_log: Path) -> list[int]:
    return [int(v) for v in re.findall(r"loaded weights of policy version (\d+)",
                                       rollout_log.read_text(errors="replace"))]


@dataclass(frozen=True)
class RunFigures:
    """What a finished run says about its data: every prompt trained once, filtered, stale, or left over."""

    steps: list[int]
    trained_groups: int
    leftover: int

    @classmethod
    def read(cls, run_dir: Path, trainer_log: Path) -> RunFigures:
        rows = metrics_rows(run_dir)
        samples = sum(int(row["samples"]) for row in rows)
        assert samples % GENERATIONS == 0, f"{samples} samples is not a whole number of groups"
        return cls([row["step"] for row in rows], samples // GENERATIONS, leftover_groups(trainer_log))
