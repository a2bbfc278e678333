"""Builds what `docker compose up` of deploy/ needs on this machine, and drives the stack: images (with stand-in
bases where no registry answers), a compose project of its own, and reads of its containers and volumes."""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
HERE = Path(__file__).resolve().parent
IMAGE = "zerobubble:cpu"
PROMETHEUS_IMAGE = "zerobubble-standin/prometheus"
STANDIN_PYTHON = "zerobubble-standin/python:3.11-slim"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# The wheel server's URL is part of the build's cache key: one fixed port keeps the torch layer cached between runs.
WHEEL_PORT = 38917


def run(command: list[str], *, timeout: float, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kwargs)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(command[:6])} ... exited {result.returncode}:\n{result.stdout[-3000:]}"
                             f"\n{result.stderr[-3000:]}")
    return result


def compose_command() -> list[str]:
    """Compose v2 (`docker compose`) where the plugin is there, else Debian's docker-compose."""
    if run(["docker", "compose", "version"], timeout=30, check=False).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    raise AssertionError("neither `docker compose` nor docker-compose is installed")


def buildkit_build(args: list[str], *, timeout: float) -> None:
    """`docker build` with BuildKit (cache and secret mounts, the per-Dockerfile ignore file): buildx where the
    client has it, else the engine's own BuildKit behind DOCKER_BUILDKIT=1."""
    if run(["docker", "buildx", "version"], timeout=30, check=False).returncode == 0:
        command = ["docker", "buildx", "build", "--load"]
    else:
        command = ["docker", "build"]
    run([*command, *args], timeout=timeout, env={"DOCKER_BUILDKIT": "1", "PATH": "/usr/bin:/bin:/usr/sbin:/sbin"})


def pullable(image: str) -> bool:
    if run(["docker", "image", "inspect", image], timeout=30, check=False).returncode == 0:
        return True
    return run(["docker", "pull", image], timeout=60, check=False).returncode == 0


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 (the base class's name)
        pass


@contextmanager
def wheel_server(folder: Path) -> Iterator[str]:
    """Serves the host's wheel folder on loopback, for a build that runs with the host's network."""
    handler = functools.partial(QuietHandler, directory=str(folder))
    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", WHEEL_PORT), handler)
    except OSError:  # taken: a build without the cached torch layer
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def torch_wheel_folder() -> Path | None:
    """The host's folder of torch wheels (ZB_TORCH_WHEELS, default /opt/wheels) where it holds one."""
    folder = Path(os.environ.get("ZB_TORCH_WHEELS", "/opt/wheels"))
    return folder if any(folder.glob("torch-*.whl")) else None


def build_images(torch_wheels: Path | None) -> dict[str, float]:
    """The project's CPU image and Prometheus, from the real bases where they can be pulled, else from stand-ins
    made of Debian's packages. Returns seconds spent on each."""
    seconds: dict[str, float] = {}
    started = time.monotonic()
    args = ["--network", "host", "-f", "deploy/Dockerfile", "--build-arg", "BASE=cpu", "--build-arg", "VLLM=0",
            "-t", IMAGE]
    if CA_BUNDLE.is_file():
        args += ["--secret", f"id=pip-ca,src={CA_BUNDLE}"]
    if not pullable("python:3.11-slim"):
        run([str(HERE / "standin-base.sh"), STANDIN_PYTHON], timeout=1200)
        args += ["--build-arg", f"PYTHON_IMAGE={STANDIN_PYTHON}"]
    seconds["base"] = time.monotonic() - started
    started = time.monotonic()
    if torch_wheels is None:
        buildkit_build([*args, "."], timeout=2400)
    else:
        with wheel_server(torch_wheels) as url:
            # PyPI for torch's dependencies; the +cpu wheel beside it wins as the higher version of the same pin.
            buildkit_build([*args, "--build-arg", "TORCH_INDEX=https://pypi.org/simple",
                            "--build-arg", f"TORCH_FIND_LINKS={url}", "."], timeout=2400)
    seconds["image"] = time.monotonic() - started
    started = time.monotonic()
    base = STANDIN_PYTHON if run(["docker", "image", "inspect", STANDIN_PYTHON], timeout=30,
                                 check=False).returncode == 0 else "debian:bookworm-slim"
    buildkit_build(["--network", "host", "-f", str(HERE / "prometheus.Dockerfile"), "--build-arg", f"BASE={base}",
                    "-t", PROMETHEUS_IMAGE, str(HERE)], timeout=1200)
    seconds["prometheus"] = time.monotonic() - started
    return seconds


@contextmanager
def sandbox_cgroups(project: str) -> Iterator[dict[str, str]]:
    """The code sandbox's memory cgroups of this project alone, for the reward and the environment service (each
    container is pid 1 and names its cgroups by pid): the variables docker-compose.yml reads, and their removal."""
    v1 = Path("/sys/fs/cgroup/memory").is_dir()
    root = Path("/sys/fs/cgroup/memory" if v1 else "/sys/fs/cgroup")
    cgroups = {"ZB_SANDBOX_CGROUP": root / f"zerobubble-sandbox-{project}",
               "ZB_ENVIRONMENT_SANDBOX_CGROUP": root / f"zerobubble-environment-sandbox-{project}"}
    try:
        yield {"ZB_SANDBOX_CGROUP_MOUNT": str(root), **{key: str(path) for key, path in cgroups.items()}}
    finally:
        for cgroup in cgroups.values():
            for folder in sorted((p for p in cgroup.glob("**/") if p.is_dir()), key=lambda p: -len(p.parts)):
                with contextlib.suppress(OSError):
                    folder.rmdir()  # a cgroup goes with rmdir once it has no processes and no child


class Stack:
    """One compose project over `files`, whose relative paths are relative to the first one's folder."""

    def __init__(self, project: str, files: list[Path], env: dict[str, str]):
        self.folder = files[0].parent
        self.base = [*compose_command(), "-p", project, "--project-directory", str(self.folder),
                     *(arg for file in files for arg in ("-f", str(file)))]
        self.project = project
        self.env = env

    def __call__(self, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
        return run([*self.base, *args], timeout=timeout, check=check, env=self.env, cwd=self.folder)

    def exec(self, service: str, *command: str, timeout: float = 60) -> str:
        return self("exec", "-T", service, *command, timeout=timeout).stdout

    def container(self, service: str) -> str:
        return self("ps", "-q", service).stdout.strip()

    def state(self, service: str) -> tuple[str, int]:
        """(status, exit code) of the service's container."""
        out = run(["docker", "inspect", "-f", "{{.State.Status}} {{.State.ExitCode}}", self.container(service)],
                  timeout=30).stdout.split()
        return out[0], int(out[1])

    def read_run_file(self, path: str) -> str:
        """A file of the `runs` volume, read by a one-off container of the image."""
        return self("run", "--rm", "--no-deps", "--entrypoint", "cat", "trainer", path, timeout=120).stdout

    def metrics_rows(self) -> list[dict]:
        text = self("run", "--rm", "--no-deps", "--entrypoint", "sh", "trainer", "-c",
                    "cat /runs/trainer/metrics.jsonl 2>/dev/null || true", timeout=120).stdout
        return [json.loads(line) for line in text.splitlines() if line.startswith("{")]

    def logs(self, service: str) -> str:
        return self("logs", "--no-color", service, timeout=120).stdout

    def wait_for(self, condition, timeout: float, what: str):
        """condition()'s first true value, polled; on timeout, fails with the end of every service's log."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = condition()
            if value:
                return value
            time.sleep(2)
        logs = self("logs", "--no-color", "--tail", "30", timeout=60, check=False).stdout
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{logs[-6000:]}")

    def leftover(self) -> list[str]:
        """Containers, networks and volumes of the project still there."""
        label = f"label=com.docker.compose.project={self.project}"
        found = []
        for kind in (["ps", "-a"], ["network", "ls"], ["volume", "ls"]):
            found += run(["docker", *kind, "-q", "--filter", label], timeout=30).stdout.split()
        return found


if __name__ == "__main__":
    # `make test` builds the images while its other suites run (alongside.sh); the test then finds them cached.
    print("build seconds:", {k: round(v) for k, v in build_images(torch_wheel_folder()).items()}, flush=True)
