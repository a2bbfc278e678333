"""deploy/docker-compose.yml and its override files (GPUs, one GPU, CPU, the tool demo, distillation): valid for
docker-compose, with every service, health checks and volumes; the bearer token as a docker secret, ports published on
this host's loopback only, no anonymous Grafana, reward and environment services that are not privileged, the
environment service bounded and waited for by the workers, and the teacher optional, bounded and called by the
trainer only with compose.distill.yml.

Debian's `docker-compose` validates the files without a Docker engine (CI installs it with `apt-get install -y
--no-install-recommends docker-compose`); tests/compose runs the CPU stack on one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from zerobubble.common.config import ServerConfig
from zerobubble.common.server import ServiceHost

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "deploy" / "docker-compose.yml"
OVERRIDES = {name: COMPOSE_FILE.parent / f"compose.{name}.yml" for name in ("gpus", "gpu", "cpu")}
TOOL_DEMO = COMPOSE_FILE.parent / "compose.tool-demo.yml"  # after compose.cpu.yml
DISTILL = COMPOSE_FILE.parent / "compose.distill.yml"  # after any override, with the profile `distill`
SERVICES = {"reward", "environment", "teacher", "buffer", "trainer", "rollout-1", "rollout-2", "prometheus",
            "grafana"}
GPU_SERVICES = {"trainer", "rollout-1", "rollout-2", "teacher"}
GRPC_PORTS = {"reward": 50052, "environment": 50056, "buffer": 50053, "rollout-1": 50054, "rollout-2": 50054,
              "trainer": 50055, "teacher": 50058}
SANDBOXED = ("reward", "environment")  # the code sandbox: the code verifier, the python tool

needs_docker_compose = pytest.mark.skipif(
    shutil.which("docker-compose") is None,
    reason="docker-compose is not installed (apt-get install -y --no-install-recommends docker-compose)",
)


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


@pytest.fixture(scope="module")
def overrides() -> dict[str, dict]:
    return {name: yaml.safe_load(path.read_text()) for name, path in OVERRIDES.items()}


def docker_compose_config(path: Path, env: dict[str, str] | None = None, *more: Path) -> subprocess.CompletedProcess:
    """Validates the files (quietly), or with `env` prints them as docker-compose resolves them in that environment."""
    quiet = ["-q"] if env is None else []
    files = [arg for p in (path, *more) for arg in ("-f", str(p))]
    # From deploy/, as a user runs it: docker-compose 1.x reads the seccomp profile relative to its working folder.
    return subprocess.run(["docker-compose", *files, "config", *quiet], cwd=COMPOSE_FILE.parent, capture_output=True,
                          text=True, timeout=60, env=env)


@needs_docker_compose
def test_docker_compose_accepts_the_file():
    result = docker_compose_config(COMPOSE_FILE)
    assert result.returncode == 0, result.stderr


@needs_docker_compose
@pytest.mark.parametrize("node", sorted(OVERRIDES))
def test_docker_compose_accepts_the_file_with_each_override(node):
    result = docker_compose_config(COMPOSE_FILE, None, OVERRIDES[node])
    assert result.returncode == 0, result.stderr


@needs_docker_compose
def test_docker_compose_accepts_the_tool_demo_after_the_cpu_override():
    result = docker_compose_config(COMPOSE_FILE, None, OVERRIDES["cpu"], TOOL_DEMO)
    assert result.returncode == 0, result.stderr


@needs_docker_compose
@pytest.mark.parametrize("node", sorted(OVERRIDES))
def test_docker_compose_accepts_distillation_after_each_override(node):
    result = docker_compose_config(COMPOSE_FILE, None, OVERRIDES[node], DISTILL)
    assert result.returncode == 0, result.stderr


@needs_docker_compose
def test_docker_compose_refuses_a_broken_copy(tmp_path):
    """The validation above means something: an unknown service key is an error."""
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(COMPOSE_FILE.read_text().replace("    hostname: trainer\n",
                                                       "    hostname: trainer\n    gpu_count: 1\n"))
    result = docker_compose_config(broken)
    assert result.returncode != 0
    assert "gpu_count" in result.stderr


def test_every_service_is_there(compose):
    assert set(compose["services"]) == SERVICES


def test_one_image_for_every_zerobubble_service(compose):
    services = compose["services"]
    images = {services[name]["image"] for name in GRPC_PORTS}
    assert len(images) == 1
    for name in GRPC_PORTS:
        assert services[name]["build"]["dockerfile"] == "deploy/Dockerfile"
        command = services[name]["command"]
        assert command[:2] == ["serve", name.split("-")[0]]
        config = command[command.index("--config") + 1]
        mounts = {m.split(":")[1]: m.split(":")[0] for m in services[name]["volumes"]}
        source = mounts[config]
        assert (COMPOSE_FILE.parent / source).is_file(), f"{name}: {source} does not exist"


def gpu_devices(service: dict) -> list[dict]:
    return service.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])


def test_the_shared_file_holds_no_gpu_and_the_cpu_override_adds_none(compose, overrides):
    """GPUs come only from an override: compose merges reservations and cannot take one away."""
    for name, service in [*compose["services"].items(), *overrides["cpu"]["services"].items()]:
        assert not gpu_devices(service), name


def test_gpu_reservations_for_trainer_rollout_and_teacher(overrides):
    for node in ("gpus", "gpu"):
        for name in GPU_SERVICES:
            (device,) = gpu_devices(overrides[node]["services"][name])
            assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"], (node, name)
    gpus = [gpu_devices(overrides["gpus"]["services"][name])[0]["device_ids"][0] for name in sorted(GPU_SERVICES)]
    assert len(set(gpus)) == len(gpus), "each GPU service gets its own GPU by default"
    assert all(re.fullmatch(r"\$\{[A-Z0-9_]+_GPU:-\d\}", gpu) for gpu in gpus), "GPU ids come from the environment"


def test_one_gpu_shares_gpu_0_and_syncs_weights_through_host_memory(overrides):
    services = overrides["gpu"]["services"]
    ids = {gpu_devices(services[name])[0]["device_ids"][0] for name in ("trainer", "rollout-1", "teacher")}
    assert ids == {"${ZB_GPU:-0}"}
    assert services["rollout-2"]["profiles"], "the second worker is opt-in on one GPU"
    command = services["trainer"]["command"]
    assert command[command.index("--set") + 1] == "weight_sync.device=cpu", "NCCL refuses two members on one GPU"


def test_cpu_override_makes_its_assets_first_and_mounts_existing_cpu_configs(overrides):
    services = overrides["cpu"]["services"]
    for name in GRPC_PORTS:
        assert services[name]["image"] == "${ZB_IMAGE:-zerobubble:cpu}"
        for mount in services[name].get("volumes", []):
            source = mount.split(":")[0]
            if source.startswith("./"):
                assert (COMPOSE_FILE.parent / source).is_file(), f"{name}: {source} does not exist"
                assert "/cpu/" in source, f"{name} reads a GPU config on CPU"
    for name in ("buffer", "trainer", "teacher"):
        assert services[name]["depends_on"]["assets"]["condition"] == "service_completed_successfully"


def test_sandboxed_services_are_not_privileged_and_have_only_what_bubblewrap_needs(compose):
    cgroups = set()
    for name in SANDBOXED:
        service = compose["services"][name]
        assert "privileged" not in service, name
        assert service["cap_add"] == ["SYS_ADMIN", "NET_ADMIN"], name
        # A seccomp profile of its own (docker's default refuses pivot_root) rather than none, and it exists.
        (seccomp,) = [opt.split("=", 1)[1] for opt in service["security_opt"] if opt.startswith("seccomp=")]
        profile = json.loads((COMPOSE_FILE.parent / seccomp).read_text())
        assert profile["defaultAction"] == "SCMP_ACT_ALLOW" and profile["syscalls"], name
        # Only a memory cgroup of the sandbox's own is writable, never the host's whole hierarchy.
        (cgroup,) = [m for m in service["volumes"] if m.endswith(":rw")]
        assert re.fullmatch(r"\$\{ZB_[A-Z_]*SANDBOX_CGROUP:-/sys/fs/cgroup/memory/zerobubble-[a-z-]*sandbox\}:.*",
                            cgroup), cgroup
        cgroups.add(cgroup.split(":-")[1].split("}")[0])
    # Each its own: both services are pid 1 in their containers, and the sandbox names its cgroups by pid.
    assert len(cgroups) == len(SANDBOXED), cgroups
    for name, service in compose["services"].items():
        assert not service.get("privileged"), name
        assert name in SANDBOXED or "cap_add" not in service, name


def test_the_environment_service_is_bounded_and_unpublished(compose):
    environment = compose["services"]["environment"]
    assert re.fullmatch(r"\$\{ZB_ENVIRONMENT_MEMORY:-\d+g\}", environment["mem_limit"])
    assert isinstance(environment["pids_limit"], int) and environment["pids_limit"] > 0
    assert "ports" not in environment, "only the rollout workers call it, on the compose network"


def test_the_teacher_is_optional_bounded_unpublished_and_called_by_the_trainer_with_distill(compose):
    from zerobubble.common.config import load_config
    from zerobubble.teacher.config import TeacherServiceConfig
    from zerobubble.trainer.config import TrainerServiceConfig

    teacher = compose["services"]["teacher"]
    # Off unless asked: a run without distillation starts no teacher and needs no teacher model.
    assert teacher["profiles"] == ["distill"]
    assert all("profiles" not in service for name, service in compose["services"].items() if name != "teacher")
    assert re.fullmatch(r"\$\{ZB_TEACHER_MEMORY:-\d+g\}", teacher["mem_limit"])
    assert isinstance(teacher["pids_limit"], int) and teacher["pids_limit"] > 0
    assert "ports" not in teacher, "only the trainer calls it, on the compose network"
    mounts = {m.rsplit(":", 2)[1]: m.rsplit(":", 2)[0] for m in teacher["volumes"]}
    config = load_config(TeacherServiceConfig, COMPOSE_FILE.parent / mounts["/etc/zerobubble/teacher.yaml"])
    assert str(config.model.path).startswith("/models/") and "/models" in mounts
    # compose.distill.yml: the trainer's own config with the teacher's address, the token and a coefficient; it
    # waits for the teacher, and still for the buffer (compose merges depends_on).
    trainer = yaml.safe_load(DISTILL.read_text())["services"]["trainer"]
    assert trainer["depends_on"]["teacher"]["condition"] == "service_healthy"
    command = trainer["command"]
    base = compose["services"]["trainer"]["command"]
    assert command[:len(base)] == base, "the trainer's own command and config, with the teacher added"
    sets = [value.replace("${ZB_DISTILLATION_COEF:-0.5}", "0.5") for value in command[len(base) + 1::2]]
    assert command[len(base)::2] == ["--set"] * len(sets)
    mounted = {m.split(":")[1]: m.split(":")[0] for m in compose["services"]["trainer"]["volumes"]}
    loaded = load_config(TrainerServiceConfig, COMPOSE_FILE.parent / mounted[base[-1]], overrides=sets)
    assert loaded.teacher.address == f"teacher:{config.server.listen.rpartition(':')[2]}" == "teacher:50058"
    assert loaded.teacher.auth_token_file == config.server.auth_token_file
    assert loaded.algorithm.distillation_coef == 0.5


def test_every_service_has_a_health_check(compose):
    for name, service in compose["services"].items():
        test = service["healthcheck"]["test"]
        assert test[0] == "CMD" and len(test) > 1, name
        if name in GRPC_PORTS:
            assert test[1:3] == ["python", "-c"]
            assert test[-1] == f"127.0.0.1:{GRPC_PORTS[name]}"


def test_run_folder_is_a_named_volume(compose):
    assert "runs" in compose["volumes"]
    for name in ("buffer", "trainer", "rollout-1"):
        assert "runs:/runs" in compose["services"][name]["volumes"], name


def test_workers_wait_for_healthy_dependencies(compose):
    for name in ("rollout-1", "rollout-2"):
        depends = compose["services"][name]["depends_on"]
        for peer in ("buffer", "reward", "environment"):
            assert depends[peer]["condition"] == "service_healthy", (name, peer)
    assert compose["services"]["trainer"]["depends_on"]["buffer"]["condition"] == "service_healthy"


def published_hosts(compose: dict) -> dict[str, list[str]]:
    """The host address of each published port (docker's short syntax HOST:PUBLISHED:TARGET[/PROTO])."""
    return {name: [str(entry).rsplit(":", 2)[0] if str(entry).count(":") >= 2 else "" for entry in service["ports"]]
            for name, service in compose["services"].items() if service.get("ports")}


def test_ports_are_published_on_loopback_unless_the_user_opts_in(compose):
    published = published_hosts(compose)
    assert published, "the reward service, Prometheus and Grafana are published for the user"
    for name, hosts in published.items():
        # An empty host publishes on every interface of the machine.
        assert all(h == "${ZB_PUBLISH_HOST:-127.0.0.1}" for h in hosts), f"{name}: {hosts}"


@needs_docker_compose
def test_docker_compose_publishes_on_loopback_by_default_and_elsewhere_only_when_asked():
    env = {k: v for k, v in os.environ.items() if k != "ZB_PUBLISH_HOST"}
    default = yaml.safe_load(docker_compose_config(COMPOSE_FILE, env=env).stdout)
    assert {h for hosts in published_hosts(default).values() for h in hosts} == {"127.0.0.1"}
    opened = yaml.safe_load(docker_compose_config(COMPOSE_FILE, env={**env, "ZB_PUBLISH_HOST": "0.0.0.0"}).stdout)
    assert {h for hosts in published_hosts(opened).values() for h in hosts} == {"0.0.0.0"}


def test_grafana_allows_no_anonymous_viewer_and_takes_its_password_from_a_secret(compose):
    grafana = compose["services"]["grafana"]
    settings = grafana["environment"]
    assert settings["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    assert settings["GF_USERS_ALLOW_SIGN_UP"] == "false"
    (secret,) = grafana["secrets"]
    assert settings["GF_SECURITY_ADMIN_PASSWORD__FILE"] == f"/run/secrets/{secret}"
    assert compose["secrets"][secret]["file"].startswith("./secrets/")


def test_every_zerobubble_service_gets_the_token_secret_its_config_reads(compose):
    for name in GRPC_PORTS:
        service = compose["services"][name]
        (secret,) = service["secrets"]
        config = service["command"][service["command"].index("--config") + 1]
        source = {m.split(":")[1]: m.split(":")[0] for m in service["volumes"]}[config]
        settings = yaml.safe_load((COMPOSE_FILE.parent / source).read_text())
        assert settings["server"]["auth_token_file"] == f"/run/secrets/{secret}", name
    assert compose["secrets"][secret]["file"].startswith("./secrets/")


def test_the_secrets_folder_is_never_committed(compose):
    for secret in compose["secrets"].values():
        path = (COMPOSE_FILE.parent / secret["file"]).relative_to(REPO)
        ignored = subprocess.run(["git", "check-ignore", "-q", str(path)], cwd=REPO, timeout=30)
        assert ignored.returncode == 0, f"{path} would be committed"


def probe(compose: dict, address: str) -> int:
    """Runs the compose file's gRPC health probe as the container would."""
    code = compose["x-grpc-health"]
    return subprocess.run([sys.executable, "-c", code, address], capture_output=True, timeout=60).returncode


def test_health_probe_answers_for_a_real_server(compose, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret")
    # The probe sends no token: health checks stay open on a server that requires one.
    host = ServiceHost("probe", ServerConfig(listen="127.0.0.1:0", metrics_port=None, auth_token_file=token)).start()
    try:
        assert probe(compose, host.address) == 0
    finally:
        host.stop(0)
    assert probe(compose, host.address) != 0
