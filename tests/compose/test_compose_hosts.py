"""deploy/hosts/*.yaml as separate hosts, each service in a container of its own at the address its file names
(hosts.compose.yml): the token and TLS set up the way deploy/README.md says, the trainer's weight-sync store on its
own address, gloo on the interface GLOO_SOCKET_IFNAME names, and two rollout hosts (the second with the --listen,
metrics host and worker_id the README gives for more hosts). The run trains to its last step.

Runs from `make test-compose` (ZEROBUBBLE_COMPOSE=1) with the compose test's image; plain pytest skips it.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from pathlib import Path

import pytest
import yaml
from compose_stack import HERE, IMAGE, REPO, Stack, run

PROMPTS = 24
HOSTS = {"reward": "10.0.0.2", "buffer": "10.0.0.3", "rollout-4": "10.0.0.4", "trainer": "10.0.0.5",
         "rollout-6": "10.0.0.6", "environment": "10.0.0.7", "teacher": "10.0.0.8"}
WORKERS = ("rollout-4", "rollout-6")
COMPOSE_FILE = HERE / "hosts.compose.yml"


def groups_per_step() -> int:
    command = yaml.safe_load(COMPOSE_FILE.read_text())["services"]["trainer"]["command"]
    (value,) = [item.split("=")[1] for item in command if item.startswith("batch.groups_per_step=")]
    return int(value)


def make_credentials(etc: Path) -> None:
    """A token, and one CA with a certificate for each host's own address, made as deploy/README.md says."""
    etc.mkdir()
    (etc / "token").write_text(uuid.uuid4().hex)
    openssl = ["openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    run([*openssl, "-x509", "-days", "2", "-subj", "/CN=zerobubble-ca", "-keyout", "ca.key", "-out", "ca.crt"],
        timeout=60, cwd=etc)
    for address in HOSTS.values():
        host = etc / address
        host.mkdir()
        (host / "san.ext").write_text(f"subjectAltName=IP:{address}\n")
        run([*openssl, "-subj", f"/CN={address}", "-keyout", "server.key", "-out", "server.csr"], timeout=60,
            cwd=host)
        run(["openssl", "x509", "-req", "-in", "server.csr", "-CA", "../ca.crt", "-CAkey", "../ca.key",
             "-CAcreateserial", "-days", "2", "-out", "server.crt", "-extfile", "san.ext"], timeout=60, cwd=host)
        (host / "ca.crt").write_bytes((etc / "ca.crt").read_bytes())


def container_addresses(stack: Stack, service: str) -> list[str]:
    out = run(["docker", "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}",
               stack.container(service)], timeout=30).stdout
    return out.split()


@pytest.fixture
def hosts(images, tmp_path):
    make_credentials(tmp_path / "etc")
    env = {**os.environ, "ZB_IMAGE": IMAGE, "ZB_HOSTS_ETC": str(tmp_path / "etc"), "ZB_PROMPTS": str(PROMPTS)}
    stack = Stack(f"zbhosts{uuid.uuid4().hex[:8]}", [COMPOSE_FILE], env)
    try:
        yield stack
    finally:
        stack("down", "-v", "--remove-orphans", "-t", "10", timeout=300, check=False)


def test_each_service_on_its_own_host_config_trains_to_the_last_step(hosts):
    hosts("up", "-d", *HOSTS, timeout=900)
    for service, address in HOSTS.items():
        assert container_addresses(hosts, service) == [address], service

    def over() -> bool:
        """The trainer has exited, or a worker failed (the workers have no restart policy here)."""
        failed = any(hosts.state(worker) not in (("running", 0), ("exited", 0)) for worker in WORKERS)
        return failed or hosts.state("trainer")[0] == "exited"

    hosts.wait_for(over, 900, "the trainer to finish")
    # The environment and teacher hosts served on their own addresses with TLS (their health checks), though no run
    # here had episodes or distilled.
    for service in ("environment", "teacher"):
        health = run(["docker", "inspect", "-f", "{{.State.Health.Status}}", hosts.container(service)], timeout=30)
        assert health.stdout.strip() == "healthy", hosts.logs(service)[-3000:]
    trainer_log = hosts.logs("trainer")
    assert hosts.state("trainer") == ("exited", 0), trainer_log[-4000:]

    # Every step once, to the last one the data gives, and the final checkpoint, in the trainer's run folder.
    volume = f"{hosts.project}_run"
    read = ["docker", "run", "--rm", "--network", "none", "-v", f"{volume}:/run:ro", "--entrypoint", "cat", IMAGE]
    rows = [json.loads(line) for line in run([*read, "/run/trainer/metrics.jsonl"], timeout=120).stdout.splitlines()
            if line.startswith("{")]
    assert [row["step"] for row in rows] == list(range(1, PROMPTS // groups_per_step() + 1))
    assert run([*read, "/run/trainer/checkpoints/latest"], timeout=120).stdout.strip()

    # The store listened on the trainer's own address, both workers joined it, and each loaded new weights.
    assert "weight sync store on 10.0.0.5:29500 (gloo)" in trainer_log
    for worker in WORKERS:
        assert f"rollout-{HOSTS[worker]} joined the weight sync" in trainer_log
        versions = [int(v) for v in re.findall(r"loaded weights of policy version (\d+)", hosts.logs(worker))]
        assert versions and max(versions) >= 1, worker

    hosts("down", "-v", "-t", "10", timeout=300)
    assert hosts.leftover() == []


def test_the_host_configs_are_mounted_unchanged():
    """What the containers run is what a user of real hosts copies: deploy/hosts/ itself."""
    services = yaml.safe_load(COMPOSE_FILE.read_text())["services"]
    for service in HOSTS:
        kind = services[service]["command"][1]
        mounts = {m.split(":")[1]: m.split(":")[0] for m in services[service]["volumes"]}
        source = (HERE / mounts[f"/etc/zerobubble/{kind}.yaml"]).resolve()
        assert source == REPO / "deploy" / "hosts" / f"{kind}.yaml", service
