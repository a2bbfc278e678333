"""The service configurations under deploy/ load with their service's schema, agree with each other, require a
bearer token from a secret file, and listen only where they are meant to be reached."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from zerobubble.buffer.config import BufferServiceConfig
from zerobubble.common.config import ClientConfig, ConfigError, TLSConfig, load_config
from zerobubble.common.run_spec import require_agreement
from zerobubble.common.server import ServiceHost
from zerobubble.environment.config import EnvironmentServiceConfig
from zerobubble.reward.config import RewardServiceConfig
from zerobubble.rollout.config import RolloutServiceConfig
from zerobubble.teacher.config import TeacherServiceConfig
from zerobubble.trainer.config import TrainerServiceConfig

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
SCHEMAS = {"reward": RewardServiceConfig, "buffer": BufferServiceConfig, "rollout": RolloutServiceConfig,
           "trainer": TrainerServiceConfig, "environment": EnvironmentServiceConfig, "teacher": TeacherServiceConfig}
HOST_FILES = sorted((DEPLOY / "hosts").glob("*.yaml"))
COMPOSE_FILES = sorted([*(DEPLOY / "compose").glob("*.yaml"), *(DEPLOY / "compose" / "cpu").glob("*.yaml"),
                        *(DEPLOY / "compose" / "tool-demo").glob("*.yaml")])
CONFIG_FILES = [*HOST_FILES, *COMPOSE_FILES]
WILDCARDS = ("0.0.0.0", "::", "[::]")


def service_of(path: Path) -> str:
    """reward.yaml -> reward, rollout-2.yaml -> rollout: the file name says which service reads it."""
    return path.stem.split("-")[0]


def load(path: Path):
    return load_config(SCHEMAS[service_of(path)], path)


def port(address: str) -> int:
    return int(address.rpartition(":")[2])


def host(address: str) -> str:
    return address.rpartition(":")[0]


def clients(config) -> dict[str, ClientConfig]:
    sections = {name: getattr(config, name, None)
                for name in ("buffer", "reward_service", "trainer", "environment", "teacher")}
    return {name: section for name, section in sections.items() if isinstance(section, ClientConfig)}


def test_every_service_has_a_host_example_and_a_compose_config():
    for folder in ("hosts", "compose"):
        assert {service_of(p) for p in (DEPLOY / folder).glob("*.yaml")} == set(SCHEMAS), folder


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_config_loads_with_its_service_schema(path):
    assert service_of(path) in SCHEMAS, f"{path.name}: name it after its service (reward, buffer, ...)"
    config = load(path)
    assert config.server.metrics_port, "Prometheus scrapes every service"


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_server_and_client_takes_the_token_from_a_secret_file(path):
    config = load(path)
    secret = config.server.auth_token_file
    assert secret is not None and config.server.auth_token is None, "the token is never written in a config"
    for name, client in clients(config).items():
        assert client.auth_token_file == secret and client.auth_token is None, f"{name}: not the deployment's token"
    # Where the secret is missing (as on this machine), the service does not start: it never runs open.
    server = config.server.model_copy(update={"listen": "127.0.0.1:0", "metrics_port": None, "tls": TLSConfig()})
    with pytest.raises(ConfigError, match=f"auth_token_file: cannot read {secret}"):
        ServiceHost(service_of(path), server)


def test_separate_hosts_listen_on_their_own_address_and_speak_tls():
    configs = {service_of(p): load(p) for p in HOST_FILES}
    rollout = configs["rollout"]
    reached_at = {"buffer": host(rollout.buffer.address), "reward": host(rollout.reward_service.address),
                  "trainer": host(rollout.trainer.address), "environment": host(rollout.environment.address)}
    for service, config in configs.items():
        listen = host(config.server.listen)
        assert listen not in WILDCARDS, f"{service}: listens on every interface"
        assert config.server.metrics_host == listen, f"{service}: metrics on another interface than its RPCs"
        assert listen == reached_at.get(service, listen), f"{service}: the others call it at {reached_at[service]}"
        # The token crosses a network: TLS, or anyone on the path can read it.
        assert config.server.tls.cert and config.server.tls.key, service
        for name, client in clients(config).items():
            assert client.tls.ca, f"{service}.{name}: does not verify the server"
    assert configs["trainer"].weight_sync.store_host == reached_at["trainer"]


def with_distillation(path: Path) -> str:
    """A trainer.yaml with its commented teacher section and distillation_coef turned on."""
    return re.sub(r"^( *)#(?=teacher:|distillation_coef:|  )", r"\1", path.read_text(), flags=re.MULTILINE)


@pytest.mark.parametrize("folder", ["hosts", "compose"])
def test_the_trainer_reaches_the_teacher_once_its_commented_section_is_on(folder, tmp_path):
    """hosts/trainer.yaml for a teacher host, compose/trainer.yaml as the Kubernetes ConfigMap's trainer.yaml."""
    trainer_file = DEPLOY / folder / "trainer.yaml"
    shipped = load(trainer_file)
    assert shipped.teacher is None, "a run without distillation needs no teacher"
    on = tmp_path / "trainer.yaml"
    on.write_text(with_distillation(trainer_file))
    trainer, teacher = load(on), load(DEPLOY / folder / "teacher.yaml")
    assert trainer.algorithm.distillation_coef > 0
    assert port(trainer.teacher.address) == port(teacher.server.listen)
    if folder == "hosts":
        assert trainer.teacher.address == teacher.server.listen, "the trainer calls the teacher where it listens"
        assert trainer.teacher.tls.ca, "the trainer verifies the teacher"
    assert trainer.teacher.auth_token_file == teacher.server.auth_token_file == trainer.server.auth_token_file
    # Nothing else changed: the rest of the file is the trainer's as shipped.
    assert trainer.model_copy(update={"teacher": None, "algorithm": shipped.algorithm}) == shipped


def test_compose_services_listen_inside_their_container():
    """Every interface of a container is on the compose network; what the host publishes is docker-compose.yml's
    business (tests/deploy/test_compose.py)."""
    for path in COMPOSE_FILES:
        config = load(path)
        assert host(config.server.listen) == "0.0.0.0" and config.server.metrics_host == "0.0.0.0", path.name


@pytest.mark.parametrize("folder", ["hosts", "compose"])
def test_clients_point_at_the_ports_services_listen_on(folder):
    configs = {p.stem: load(p) for p in (DEPLOY / folder).glob("*.yaml")}
    listen = {service_of(Path(name)): port(c.server.listen) for name, c in configs.items()}
    rollouts = [c for name, c in configs.items() if service_of(Path(name)) == "rollout"]
    trainer, buffer = configs["trainer"], configs["buffer"]
    assert port(trainer.buffer.address) == listen["buffer"]
    for rollout in rollouts:
        assert port(rollout.buffer.address) == listen["buffer"]
        assert port(rollout.reward_service.address) == listen["reward"]
        assert port(rollout.trainer.address) == listen["trainer"]
        assert port(rollout.environment.address) == listen["environment"]
        # The run's facts are the buffer's run spec alone: a worker states none of them.
        assert {field: value for field, (_, value) in rollout.expectations().items() if value is not None} == {}
    assert len({r.worker_id for r in rollouts}) == len(rollouts)
    # The trainer's preset is the spec's (the trainer refuses to start otherwise).
    require_agreement(buffer.run_spec, trainer.expectations(), source=f"deploy/{folder}/buffer.yaml")
    assert trainer.weight_sync.store_port != 0, "workers behind a firewall or NAT need a known store port"


def test_compose_configs_name_compose_services():
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())["services"]
    for path in COMPOSE_FILES:
        for client in clients(load(path)).values():
            assert host(client.address) in compose, f"{path.name}: {client.address!r} is not a compose service"
    trainer = load(DEPLOY / "compose" / "trainer.yaml")
    # Listening everywhere, the trainer advertises its host name; compose makes that name resolvable.
    assert trainer.weight_sync.store_host == "0.0.0.0"
    assert compose["trainer"]["hostname"] == "trainer"


def test_the_compose_tool_demo_is_the_shipped_tool_demo():
    """compose/tool-demo/ holds what `zerobubble up --config tool-demo` writes for each service, as far as the run
    goes: the run spec (episodes included), the environments, the trainer's algorithm, optimizer and batch, the
    worker's generation and system prompt. Only addresses, paths and the device differ."""
    from zerobubble.common.config import load_config as load_up
    from zerobubble.tooling.configs import named
    from zerobubble.tooling.launcher.config import UpConfig
    from zerobubble.tooling.launcher.preflight import check_services

    trees = check_services(load_up(UpConfig, named(Path("tool-demo"))))
    folder = DEPLOY / "compose" / "tool-demo"
    compose = {path.stem: load(path) for path in folder.glob("*.yaml")}
    assert set(compose) == {"environment", "buffer", "trainer", "rollout-1"}
    up_environment = validated_as(EnvironmentServiceConfig, trees["environment"])
    assert compose["environment"].environments == up_environment.environments
    up_buffer = validated_as(BufferServiceConfig, trees["buffer"])
    assert compose["buffer"].run_spec == up_buffer.run_spec
    assert compose["buffer"].prompts.epochs == up_buffer.prompts.epochs
    assert compose["buffer"].capacity == up_buffer.capacity
    up_trainer = validated_as(TrainerServiceConfig, trees["trainer"])
    for section in ("algorithm", "batch", "checkpoint"):
        assert getattr(compose["trainer"], section) == getattr(up_trainer, section), section
    assert compose["trainer"].strategy.optim == up_trainer.strategy.optim
    assert compose["trainer"].tracking.rollout_log == up_trainer.tracking.rollout_log
    up_rollout = validated_as(RolloutServiceConfig, {**trees["rollout"], "model": {"path": "/models/tool-demo"}})
    assert compose["rollout-1"].generation.prompts_per_batch == up_rollout.generation.prompts_per_batch
    assert compose["rollout-1"].reward == up_rollout.reward
    assert (compose["rollout-1"].eval.interval, compose["rollout-1"].eval.samples_per_prompt) == \
        (up_rollout.eval.interval, up_rollout.eval.samples_per_prompt)


def validated_as(schema, tree: dict):
    from zerobubble.tooling.launcher.config import validated

    return validated(schema, tree, "up's tree")
