"""`zerobubble slurm-plan`: one Slurm job's nodes turned into each service's address and config.

deploy/slurm/zerobubble.sbatch runs it once at the start of the job (and again when the job is requeued). The
first node of the job serves the reward service and the buffer, the next `--trainer-nodes` nodes the trainer's
ranks (torchrun, one rank per GPU), every other node a rollout worker; the environment service and the teacher
(on-policy distillation), where the templates have them, on the first node too (the teacher on its GPU, which the
reward service and the buffer leave free). A node's address is the one Slurm reaches
it at (NodeAddr), so the services' configs name the same network that Slurm's own traffic crosses. The user's
config of each service is the template: the plan sets only what follows from the job (addresses, the run folder,
the token, worker ids), checks every result against its service's schema, and writes the configs with a shell file
of the facts the batch script needs (which node runs what).
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from zerobubble.buffer.config import BufferServiceConfig
from zerobubble.common.config import ConfigError
from zerobubble.environment.config import EnvironmentServiceConfig
from zerobubble.reward.config import RewardServiceConfig
from zerobubble.rollout.config import RolloutServiceConfig
from zerobubble.teacher.config import TeacherServiceConfig
from zerobubble.tooling.launcher.config import validated, write_yaml
from zerobubble.trainer.config import TrainerServiceConfig

SCHEMAS = {"reward": RewardServiceConfig, "buffer": BufferServiceConfig, "trainer": TrainerServiceConfig,
           "rollout": RolloutServiceConfig, "environment": EnvironmentServiceConfig, "teacher": TeacherServiceConfig}
# Started only where --configs has its template: a run without episodes needs no environment service, one without
# distillation no teacher.
OPTIONAL = ("environment", "teacher")
# The ports of deploy/hosts/, so that one firewall description fits both; torchrun's rendezvous is the trainer
# head's TORCH_PORT.
PORTS = {"reward": 50052, "buffer": 50053, "rollout": 50054, "trainer": 50055, "environment": 50056,
         "teacher": 50058}
STORE_PORT = 29500
TORCH_PORT = 29400
PLAN_ENV = "plan.env"
TOKEN = "token"


@dataclass(frozen=True)
class Node:
    name: str
    address: str


@dataclass(frozen=True)
class Plan:
    service_node: Node
    trainer_nodes: list[Node]
    rollout_nodes: list[Node]
    trainer_processes_per_node: int

    def address(self, service: str, node: Node | None = None) -> str:
        if node is None:
            node = self.trainer_nodes[0] if service == "trainer" else self.service_node
        return f"{node.address}:{PORTS[service]}"


def assign(nodes: list[Node], trainer_nodes: int, gpus_per_node: int) -> Plan:
    """Which node runs what: the service node first, then the trainer's, then the rollout workers'."""
    if trainer_nodes < 1:
        raise ConfigError(f"--trainer-nodes: {trainer_nodes} is less than 1")
    if len(nodes) < trainer_nodes + 2:
        raise ConfigError(f"SLURM_JOB_NODELIST: {len(nodes)} nodes; the run needs {trainer_nodes + 2} (one for the "
                          f"reward service and the buffer, {trainer_nodes} for the trainer, at least one rollout)")
    return Plan(nodes[0], nodes[1:1 + trainer_nodes], nodes[1 + trainer_nodes:], max(1, gpus_per_node))


def gpus_per_node(environ: dict[str, str]) -> int:
    """The GPUs of each node: SLURM_GPUS_PER_NODE (`--gpus-per-node`: `4`, or with the type, `a100:4`), else
    SLURM_GPUS_ON_NODE (what `--gres=gpu:N` gave the batch step's node); 0 on a job without GPUs."""
    for variable in ("SLURM_GPUS_PER_NODE", "SLURM_GPUS_ON_NODE"):
        value = environ.get(variable, "").strip()
        if not value:
            continue
        found = re.fullmatch(r"(?:[^:,]+:)?(\d+)", value)
        if found is None:
            raise ConfigError(f"{variable}: {value!r} is not a GPU count (N or TYPE:N)")
        return int(found.group(1))
    return 0


def node_addresses(show_node: str) -> dict[str, str]:
    """NodeName -> NodeAddr from `scontrol show node -o` (one node a line)."""
    found = {}
    for line in show_node.splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        if "NodeName" in fields:
            found[fields["NodeName"]] = fields.get("NodeAddr") or fields["NodeName"]
    return found


def job_nodes(nodelist: str) -> list[Node]:
    """The job's nodes in Slurm's order, each at the address Slurm reaches it at."""
    names = _scontrol("show", "hostnames", nodelist).split()
    addresses = node_addresses(_scontrol("show", "node", "-o", ",".join(names)))
    return [Node(name, addresses.get(name, name)) for name in names]


def _scontrol(*args: str) -> str:
    try:
        done = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise ConfigError("scontrol is not on PATH: slurm-plan runs inside a Slurm job") from None
    if done.returncode != 0:
        raise ConfigError(f"scontrol {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def _set(tree: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for key in parents:
        tree = tree.setdefault(key, {})
    tree[leaf] = value


def service_trees(plan: Plan, templates: dict[str, dict], run_dir: Path, token: Path) -> dict[str, tuple[str, dict]]:
    """Each config to write, by file name: (its service, its tree). What follows from the job replaces whatever the
    templates said of it."""

    def tree(service: str, node: Node, changes: dict[str, Any]) -> dict:
        result = yaml.safe_load(yaml.safe_dump(templates.get(service) or {}))
        for key, value in {"server.listen": plan.address(service, node), "server.metrics_host": node.address,
                           "server.auth_token_file": str(token), **changes}.items():
            _set(result, key, value)
        return result

    def client(section: str, service: str) -> dict[str, Any]:
        return {f"{section}.address": plan.address(service), f"{section}.auth_token_file": str(token)}

    head = plan.trainer_nodes[0]
    distillation = client("teacher", "teacher") if "teacher" in templates else {}
    trees = {
        "reward": ("reward", tree("reward", plan.service_node, {})),
        "buffer": ("buffer", tree("buffer", plan.service_node, {"wal.directory": str(run_dir / "buffer-wal")})),
        "trainer": ("trainer", tree("trainer", head, {
            "run_dir": str(run_dir / "trainer"), "resume": True, "weight_sync.store_host": head.address,
            "weight_sync.store_port": STORE_PORT, **client("buffer", "buffer"), **distillation})),
    }
    if distillation:
        trees["teacher"] = ("teacher", tree("teacher", plan.service_node, {}))
    episodes = {}
    if "environment" in templates:
        trees["environment"] = ("environment", tree("environment", plan.service_node, {}))
        episodes = client("environment", "environment")
    for node in plan.rollout_nodes:
        trees[f"rollout-{node.name}"] = ("rollout", tree("rollout", node, {
            "worker_id": f"rollout-{node.name}", **client("buffer", "buffer"), **client("reward_service", "reward"),
            **client("trainer", "trainer"), **episodes}))
    return trees


def shell_facts(plan: Plan, out: Path, token: Path) -> str:
    """What the batch script sources: which nodes run what, and where the configs are."""
    facts = {
        "ZB_PLAN": str(out), "ZB_TOKEN_FILE": str(token),
        "ZB_SERVICE_NODE": plan.service_node.name,
        "ZB_TRAINER_NODES": ",".join(node.name for node in plan.trainer_nodes),
        "ZB_TRAINER_NNODES": str(len(plan.trainer_nodes)),
        "ZB_TRAINER_NPROC": str(plan.trainer_processes_per_node),
        "ZB_TRAINER_HEAD": plan.trainer_nodes[0].address, "ZB_TORCH_PORT": str(TORCH_PORT),
        "ZB_ROLLOUT_NODES": " ".join(node.name for node in plan.rollout_nodes),
    }
    return "".join(f"{key}={shlex.quote(value)}\n" for key, value in facts.items())


def write_token(path: Path) -> Path:
    """A new token, readable by the job's user only (the folder too: the file's name is no secret)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.parent.chmod(0o700)
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(secrets.token_urlsafe(32) + "\n")
    return path


def load_templates(folder: Path) -> dict[str, dict]:
    templates = {}
    for service in SCHEMAS:
        path = folder / f"{service}.yaml"
        if not path.is_file() and service in OPTIONAL:
            continue
        if not path.is_file():
            raise ConfigError(f"--configs: {folder} has no {service}.yaml")
        loaded = yaml.safe_load(path.read_text()) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"--configs: {path} is not a mapping")
        templates[service] = loaded
    return templates


def write_plan(plan: Plan, templates: dict[str, dict], run_dir: Path, out: Path) -> Path:
    """Every config checked before any is written (a mistake fails the job before a step starts), then written;
    the shell facts last. Returns the shell file's path."""
    token = write_token(out / TOKEN)
    trees = service_trees(plan, templates, run_dir, token)
    configs = {name: validated(SCHEMAS[service], tree, f"{name} (from --configs {service}.yaml)")
               for name, (service, tree) in trees.items()}
    if "teacher" in configs and not configs["trainer"].algorithm.distillation_coef:
        # A teacher the trainer would connect to and never ask: a template forgotten on one side.
        raise ConfigError("--configs: teacher.yaml starts a teacher, but trainer.yaml's algorithm distils from none: "
                          "set algorithm.distillation_coef (or preset DISTILL), or remove teacher.yaml")
    for name, (_service, tree) in trees.items():
        write_yaml(out / f"{name}.yaml", tree)
    (out / PLAN_ENV).write_text(shell_facts(plan, out, token))
    return out / PLAN_ENV


def cmd_slurm_plan(args) -> int:
    nodelist, job = os.environ.get("SLURM_JOB_NODELIST"), os.environ.get("SLURM_JOB_ID")
    if not nodelist or not job:
        raise ConfigError("SLURM_JOB_NODELIST, SLURM_JOB_ID: not set; slurm-plan runs inside a Slurm job")
    templates = load_templates(args.configs)
    plan = assign(job_nodes(nodelist), args.trainer_nodes, gpus_per_node(dict(os.environ)))
    run_dir = args.run_dir.resolve()
    print(write_plan(plan, templates, run_dir, run_dir / "slurm" / f"job-{job}"))
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser("slurm-plan", help="inside a Slurm job: each node's service, address and config")
    parser.add_argument("--configs", type=Path, required=True,
                        help="folder of reward.yaml, buffer.yaml, trainer.yaml, rollout.yaml (and environment.yaml "
                        "for episodes, teacher.yaml for distillation): the templates")
    parser.add_argument("--run-dir", type=Path, required=True, help="the run folder, on the shared file system")
    parser.add_argument("--trainer-nodes", type=int, default=1, help="nodes for the trainer's ranks (default 1)")
    parser.set_defaults(run=cmd_slurm_plan)
