"""The service configurations under deploy/ load with their service's schema and agree with each other."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from zerobubble.buffer.config import BufferServiceConfig
from zerobubble.common.config import ClientConfig, load_config
from zerobubble.reward.config import RewardServiceConfig
from zerobubble.rollout.config import RolloutServiceConfig
from zerobubble.trainer.config import TrainerServiceConfig

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
SCHEMAS = {"reward": RewardServiceConfig, "buffer": BufferServiceConfig, "rollout": RolloutServiceConfig,
           "trainer": TrainerServiceConfig}
CONFIG_FILES = sorted([*(DEPLOY / "hosts").glob("*.yaml"), *(DEPLOY / "compose").glob("*.yaml")])


def service_of(path: Path) -> str:
    """reward.yaml -> reward, rollout-2.yaml -> rollout: the file name says which service reads it."""
    return path.stem.split("-")[0]


def load(path: Path):
    return load_config(SCHEMAS[service_of(path)], path)


def port(address: str) -> int:
    return int(address.rpartition(":")[2])


def test_every_service_has_a_host_example_and_a_compose_config():
    for folder in ("hosts", "compose"):
        assert {service_of(p) for p in (DEPLOY / folder).glob("*.yaml")} == set(SCHEMAS), folder


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_config_loads_with_its_service_schema(path):
    assert service_of(path) in SCHEMAS, f"{path.name}: name it after its service (reward, buffer, ...)"
    config = load(path)
    # Other hosts and containers must reach every service, and Prometheus its metrics port.
    assert config.server.listen.startswith("0.0.0.0:")
    assert config.server.metrics_host == "0.0.0.0"
    assert config.server.metrics_port


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
        # The trainer's overlong rules and loss normalisation assume the workers' generation limit.
        assert rollout.generation.max_new_tokens == trainer.batch.max_new_tokens
        assert buffer.filters.num_generations in (None, rollout.generation.num_generations)
    assert len({r.worker_id for r in rollouts}) == len(rollouts)
    assert trainer.weight_sync.store_port != 0, "workers behind a firewall or NAT need a known store port"


def test_compose_configs_name_compose_services():
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())["services"]
    for path in (DEPLOY / "compose").glob("*.yaml"):
        config = load(path)
        clients = [getattr(config, name, None) for name in ("buffer", "reward_service", "trainer")]
        for client in (c for c in clients if isinstance(c, ClientConfig)):
            host = client.address.rpartition(":")[0]
            assert host in compose, f"{path.name}: {host!r} is not a service of docker-compose.yml"
    trainer = load(DEPLOY / "compose" / "trainer.yaml")
    # Listening everywhere, the trainer advertises its host name; compose makes that name resolvable.
    assert trainer.weight_sync.store_host == "0.0.0.0"
    assert compose["trainer"]["hostname"] == "trainer"
