"""`zerobubble slurm-plan` without a cluster: which node runs what, the configs it writes from deploy/slurm/configs
(each loaded with its service's schema; the teacher's from deploy/slurm/teacher.yaml), the job's token, and the facts
the batch script sources.
tests/e2e/test_slurm_cluster.py runs it inside real Slurm jobs."""

from __future__ import annotations

import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from zerobubble.common.config import ConfigError, load_config
from zerobubble.tooling.slurm_plan import (
    SCHEMAS,
    Node,
    assign,
    gpus_per_node,
    load_templates,
    node_addresses,
    write_plan,
)

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = REPO / "deploy" / "slurm" / "configs"
TEACHER_TEMPLATE = REPO / "deploy" / "slurm" / "teacher.yaml"  # copied into a configs folder to distil
NODES = [Node(f"gpu{i:02d}", f"10.1.0.{i}") for i in range(1, 6)]


def test_the_first_node_serves_reward_and_buffer_then_the_trainer_nodes_then_rollout_workers():
    plan = assign(NODES, trainer_nodes=2, gpus_per_node=8)
    assert plan.service_node == NODES[0]
    assert plan.trainer_nodes == NODES[1:3] and plan.rollout_nodes == NODES[3:]
    assert plan.trainer_processes_per_node == 8
    assert plan.address("trainer") == "10.1.0.2:50055" and plan.address("buffer") == "10.1.0.1:50053"
    assert assign(NODES[:3], trainer_nodes=1, gpus_per_node=0).trainer_processes_per_node == 1


def test_too_few_nodes_or_trainer_nodes_are_refused_naming_what_to_change():
    with pytest.raises(ConfigError, match=r"SLURM_JOB_NODELIST: 3 nodes; the run needs 4"):
        assign(NODES[:3], trainer_nodes=2, gpus_per_node=0)
    with pytest.raises(ConfigError, match="--trainer-nodes"):
        assign(NODES, trainer_nodes=0, gpus_per_node=0)


@pytest.mark.parametrize(("environ", "count"), [
    ({}, 0), ({"SLURM_GPUS_PER_NODE": ""}, 0), ({"SLURM_GPUS_PER_NODE": "4"}, 4),
    ({"SLURM_GPUS_PER_NODE": "a100:8", "SLURM_GPUS_ON_NODE": "2"}, 8), ({"SLURM_GPUS_ON_NODE": "2"}, 2)])
def test_gpus_per_node_reads_slurms_count_from_gpus_per_node_or_gres(environ, count):
    assert gpus_per_node(environ) == count


def test_a_gpu_count_slurm_did_not_write_is_refused_naming_the_variable():
    with pytest.raises(ConfigError, match="SLURM_GPUS_PER_NODE: 'h100 : 2'"):
        gpus_per_node({"SLURM_GPUS_PER_NODE": "h100 : 2"})


def test_node_addresses_come_from_scontrols_one_line_records():
    shown = ("NodeName=n1 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 NodeAddr=10.77.3.3 NodeHostName=n1 Version=22.05\n"
             "NodeName=n2 Arch=x86_64 NodeAddr= NodeHostName=n2\n")
    assert node_addresses(shown) == {"n1": "10.77.3.3", "n2": "n2"}


def test_the_plan_writes_every_services_config_from_the_shipped_templates(tmp_path):
    run_dir = tmp_path / "run"
    out = run_dir / "slurm" / "job-7"
    plan = assign(NODES[:4], trainer_nodes=1, gpus_per_node=4)
    facts = write_plan(plan, load_templates(TEMPLATES), run_dir, out)

    token = out / "token"
    assert stat.S_IMODE(token.stat().st_mode) == 0o600 and stat.S_IMODE(out.stat().st_mode) == 0o700
    assert len(token.read_text().strip()) >= 32
    configs = {path.stem: path for path in out.glob("*.yaml")}
    assert sorted(configs) == ["buffer", "environment", "reward", "rollout-gpu03", "rollout-gpu04", "trainer"]
    loaded = {name: load_config(SCHEMAS[name.split("-")[0]], path) for name, path in configs.items()}
    for name, config in loaded.items():
        assert config.server.auth_token_file == token, name
    assert loaded["reward"].server.listen == "10.1.0.1:50052" and loaded["buffer"].server.listen == "10.1.0.1:50053"
    assert loaded["buffer"].wal.directory == run_dir / "buffer-wal"
    assert loaded["environment"].server.listen == "10.1.0.1:50056"
    assert [entry.name for entry in loaded["environment"].environments] == ["calculator", "python"]
    trainer = loaded["trainer"]
    assert trainer.server.listen == "10.1.0.2:50055" and trainer.server.metrics_host == "10.1.0.2"
    assert trainer.run_dir == run_dir / "trainer" and trainer.resume
    assert (trainer.weight_sync.store_host, trainer.weight_sync.store_port) == ("10.1.0.2", 29500)
    assert trainer.buffer.address == "10.1.0.1:50053" and trainer.buffer.auth_token_file == token
    # What the template said stays: the model, the algorithm, the GPU.
    assert str(trainer.model) == "/shared/models/policy" and trainer.strategy.device == "cuda"
    for i, node in ((3, "gpu03"), (4, "gpu04")):
        rollout = loaded[f"rollout-{node}"]
        assert rollout.worker_id == f"rollout-{node}" and rollout.server.listen == f"10.1.0.{i}:50054"
        assert (rollout.buffer.address, rollout.reward_service.address, rollout.trainer.address) == (
            "10.1.0.1:50053", "10.1.0.1:50052", "10.1.0.2:50055")
        assert rollout.reward_service.timeout_seconds == 300
        assert (rollout.environment.address, rollout.environment.auth_token_file) == ("10.1.0.1:50056", token)

    sourced = subprocess.run(["bash", "-c", f'source "{facts}"; echo "$ZB_SERVICE_NODE|$ZB_TRAINER_NODES|'
                              '$ZB_TRAINER_NPROC|$ZB_TRAINER_HEAD|$ZB_ROLLOUT_NODES|$ZB_PLAN"'],
                             capture_output=True, text=True, check=True).stdout.strip()
    assert sourced == f"gpu01|gpu02|4|10.1.0.2|gpu03 gpu04|{out}"


def test_without_an_environment_template_no_environment_service_runs(tmp_path):
    """A run without episodes: the batch script starts an environment step only where its config was written."""
    templates = load_templates(TEMPLATES)
    del templates["environment"]
    out = tmp_path / "plan"
    write_plan(assign(NODES[:3], 1, 0), templates, tmp_path, out)
    assert not (out / "environment.yaml").exists()
    assert load_config(SCHEMAS["rollout"], out / "rollout-gpu03.yaml").environment is None
    script = (REPO / "deploy" / "slurm" / "zerobubble.sbatch").read_text()
    assert 'if [ -e "$ZB_PLAN/environment.yaml" ]; then' in script


def distilling_templates(folder: Path) -> dict[str, dict]:
    """The shipped configs, the teacher's template copied in and the trainer's distillation on, as the guide says."""
    shutil.copytree(TEMPLATES, folder)
    shutil.copy(TEACHER_TEMPLATE, folder / "teacher.yaml")
    trainer = yaml.safe_load((folder / "trainer.yaml").read_text())
    trainer["algorithm"]["distillation_coef"] = 0.5
    (folder / "trainer.yaml").write_text(yaml.safe_dump(trainer))
    return load_templates(folder)


def test_the_shipped_configs_start_no_teacher(tmp_path):
    out = tmp_path / "plan"
    write_plan(assign(NODES[:3], 1, 0), load_templates(TEMPLATES), tmp_path, out)
    assert not (out / "teacher.yaml").exists()
    assert load_config(SCHEMAS["trainer"], out / "trainer.yaml").teacher is None
    script = (REPO / "deploy" / "slurm" / "zerobubble.sbatch").read_text()
    assert 'if [ -e "$ZB_PLAN/teacher.yaml" ]; then' in script
    assert '"$ZB_PYTHON" -m zerobubble serve teacher --config "$ZB_PLAN/teacher.yaml" &' in script


def test_with_a_teacher_template_the_first_node_serves_it_to_the_trainer(tmp_path):
    out = tmp_path / "plan"
    write_plan(assign(NODES[:4], 1, 4), distilling_templates(tmp_path / "configs"), tmp_path, out)
    token = out / "token"
    teacher = load_config(SCHEMAS["teacher"], out / "teacher.yaml")
    assert teacher.server.listen == "10.1.0.1:50058" and teacher.server.metrics_host == "10.1.0.1"
    assert teacher.server.auth_token_file == token
    assert str(teacher.model.path) == "/shared/models/teacher", "what the template said stays"
    trainer = load_config(SCHEMAS["trainer"], out / "trainer.yaml")
    assert (trainer.teacher.address, trainer.teacher.auth_token_file) == ("10.1.0.1:50058", token)
    assert trainer.algorithm.distillation_coef == 0.5
    for node in ("gpu03", "gpu04"):
        assert "teacher" not in yaml.safe_load((out / f"rollout-{node}.yaml").read_text()), "only the trainer calls it"


def test_a_teacher_the_trainer_would_never_ask_fails_the_plan(tmp_path):
    templates = distilling_templates(tmp_path / "configs")
    del templates["trainer"]["algorithm"]["distillation_coef"]
    with pytest.raises(ConfigError, match=r"teacher\.yaml starts a teacher.*algorithm\.distillation_coef"):
        write_plan(assign(NODES[:3], 1, 0), templates, tmp_path, tmp_path / "plan")
    assert not list((tmp_path / "plan").glob("*.yaml")), "no config is written when one is wrong"


def test_a_template_mistake_fails_the_plan_naming_the_file_and_field(tmp_path):
    templates = load_templates(TEMPLATES)
    templates["rollout"]["generation"]["prompts_per_batch"] = "many"
    with pytest.raises(ConfigError, match=r"(?s)rollout-gpu03 \(from --configs rollout.yaml\).*generation.prompts_"):
        write_plan(assign(NODES[:3], 1, 0), templates, tmp_path, tmp_path / "plan")
    assert not list((tmp_path / "plan").glob("*.yaml")), "no config is written when one is wrong"


def test_outside_a_job_the_command_says_so():
    done = subprocess.run([sys.executable, "-m", "zerobubble", "slurm-plan", "--configs", str(TEMPLATES),
                           "--run-dir", "/tmp/unused"], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin"}, timeout=120)
    assert done.returncode == 2
    assert "SLURM_JOB_NODELIST, SLURM_JOB_ID: not set" in done.stderr
