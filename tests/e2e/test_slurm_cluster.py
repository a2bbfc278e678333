"""deploy/slurm/zerobubble.sbatch on a real Slurm cluster made here (e2e_slurm: slurmctld and four slurmd nodes,
each with its own hostname and address): the job is submitted with sbatch and followed to its end, and its run
folder checked (every acknowledged group trained once in the final lineage, the final checkpoint). Then the faults
a cluster brings: a rollout node's step killed mid-run (started again, the run goes on), the trainer's node
failing (the job is requeued and resumes from its last checkpoint without training a group twice), and scancel
mid-run (no process is left on any node). The tiny model on CPU, a few steps."""

from __future__ import annotations

import json
import re
import shlex
import time
from pathlib import Path

import pytest
import yaml
from e2e_helpers import (
    GENERATIONS,
    GROUPS_PER_STEP,
    PROXY_VARIABLES,
    buffer_tree,
    metrics_rows,
    reward_tree,
    rollout_tree,
    trainer_tree,
)
from e2e_slurm import INTERFACE, SlurmCluster, slurm_unavailable
from e2e_up import lineage
from stack import tiny_assets

from zerobubble.buffer.config import BufferServiceConfig
from zerobubble.buffer.core import Buffer
from zerobubble.common.config import load_config

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "deploy" / "slurm" / "zerobubble.sbatch"
NODES = 4
PROMPTS = 32
JOB_SECONDS = 420.0
# The plan sets every address; these stand in until it does.
UNSET = "0.0.0.0:1"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = slurm_unavailable()
    if reason is not None:
        pytest.skip(reason)
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"), NODES)
    try:
        yield cluster.start()
    finally:
        cluster.close()
    assert not cluster.net.leftovers()


def templates(folder: Path, assets: Path, *, checkpoint_steps: int) -> Path:
    """The run's configs as a user would write them for the tiny model on CPU: everything but what the plan sets."""
    model, train, _ = tiny_assets(assets, train_size=PROMPTS, eval_size=4)
    trainer = trainer_tree(UNSET, model, assets / "unset", UNSET, "0.0.0.0")
    trainer["checkpoint"] = {"interval_steps": checkpoint_steps}
    trees = {
        "reward": reward_tree(UNSET),
        # Short leases: the prompts a killed worker held go to its restarted step soon.
        "buffer": buffer_tree(UNSET, train, assets / "unset", leases={"timeout_seconds": 10.0},
                              capacity={"max_groups": 8}),
        "trainer": trainer,
        "rollout": rollout_tree(UNSET, "unset", model, buffer=UNSET, reward=UNSET, trainer=UNSET, seed=0),
    }
    folder.mkdir(parents=True)
    for service, tree in trees.items():
        (folder / f"{service}.yaml").write_text(yaml.safe_dump(json.loads(json.dumps(tree, default=str))))
    return folder


class Job:
    """One submitted run: its id, its output (every step's services print there) and its run folder."""

    def __init__(self, cluster: SlurmCluster, tmp_path: Path, *, nodes: int = 3, trainer_nodes: int = 1,
                 checkpoint_steps: int = 1000):
        configs = templates(tmp_path / "configs", tmp_path / "assets", checkpoint_steps=checkpoint_steps)
        self.cluster, self.run_dir = cluster, tmp_path / "run"
        # What a user exports before sbatch on a cluster whose nodes have several interfaces.
        env = {"ZB_RUN_DIR": str(self.run_dir), "ZB_CONFIGS": str(configs), "ZB_TRAINER_NODES": str(trainer_nodes),
               "ZB_PYTHON": str(REPO / ".venv" / "bin" / "python"), "ZB_ROLLOUT_RESTART_SECONDS": "2",
               "GLOO_SOCKET_IFNAME": INTERFACE, **dict.fromkeys(PROXY_VARIABLES, "")}
        self.id = cluster.sbatch(SCRIPT, f"--nodes={nodes}", f"--chdir={REPO}", f"--output={tmp_path}/job-%j.out",
                                 env=env)
        self.output_path = tmp_path / f"job-{self.id}.out"
        self.plan = self.run_dir / "slurm" / f"job-{self.id}"

    def output(self) -> str:
        return self.output_path.read_text(errors="replace") if self.output_path.exists() else "(no output yet)"

    def state(self) -> str:
        return self.cluster.job(self.id).get("JobState", "")

    def ended(self) -> str | None:
        """The job's final state, or None while it is pending, running or completing."""
        state = self.state()
        return state if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY") else None

    def facts(self) -> dict[str, str]:
        """What the plan told the batch script: which nodes run what."""
        lines = (self.plan / "plan.env").read_text().splitlines()
        return {key: shlex.split(value)[0] if value else "" for key, value in (line.split("=", 1) for line in lines)}

    def nodes(self) -> list[str]:
        facts = self.facts()
        return [facts["ZB_SERVICE_NODE"], *facts["ZB_TRAINER_NODES"].split(","), *facts["ZB_ROLLOUT_NODES"].split()]

    def steps_trained(self) -> int:
        rows = metrics_rows(self.run_dir)
        return rows[-1]["step"] if rows else 0

    def wait(self, condition, what: str, timeout: float = JOB_SECONDS, *, may_end: bool = False) -> None:
        """Poll `condition`; fail naming `what` when the time is up, or when the job ended first."""
        deadline = time.monotonic() + timeout
        while not condition():
            ended = None if may_end else self.ended()
            if ended or time.monotonic() > deadline:
                why = f"the job ended {ended}" if ended else f"timed out after {timeout:.0f} s"
                raise AssertionError(f"{why} waiting for {what}\n{self.output()[-6000:]}")
            time.sleep(1.0)

    def wait_end(self) -> str:
        self.wait(self.ended, "the job to end", may_end=True)
        return self.ended()

    def assert_every_group_trained_once(self) -> list[dict]:
        """Every prompt stored or filtered; every stored group trained once in the final lineage (none twice),
        dropped as stale, or left over at the end; the final checkpoint written. Returns the lineage."""
        steps = lineage(metrics_rows(self.run_dir))
        assert [row["step"] for row in steps] == list(range(1, len(steps) + 1)), [row["step"] for row in steps]
        names = [name for row in steps for name in row["groups"]]
        assert len(names) == len(set(names)), "a group was trained twice in the final lineage"
        trained = sum(int(row["samples"]) for row in steps) // GENERATIONS
        assert trained == len(names)
        buffer = Buffer(load_config(BufferServiceConfig, self.plan / "buffer.yaml"))
        try:
            stats = buffer.stats()
        finally:
            buffer.close()
        found = re.findall(r"end of the data: (\d+) groups left over", self.output())
        leftover = int(found[-1]) if found else 0
        print(f"groups: {stats['groups_in']} stored, {trained} trained, {stats['filtered']} filtered, "
              f"{stats['stale_dropped']} stale, {leftover} left over; {len(steps)} steps")
        assert stats["end_of_data"] and stats["queued_groups"] == 0
        assert stats["groups_in"] + stats["filtered"] == PROMPTS
        assert leftover < GROUPS_PER_STEP
        assert trained + stats["stale_dropped"] + leftover == stats["groups_in"]
        assert (self.run_dir / "trainer" / "checkpoints" / "latest").read_text().strip(), "no final checkpoint"
        return steps


def assert_no_process_left(cluster: SlurmCluster) -> None:
    left = {}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        left = {node: cluster.job_processes(node) for node in cluster.nodes}
        if not any(left.values()):
            return
        time.sleep(1.0)
    raise AssertionError(f"processes left on the nodes: {left}")


def test_the_job_runs_to_its_end_across_nodes_and_a_killed_rollout_step_starts_again(cluster, tmp_path):
    # Four nodes: reward and buffer on n1, the trainer's two ranks on n2 and n3 (torchrun on each), a worker on n4.
    job = Job(cluster, tmp_path, nodes=4, trainer_nodes=2)
    job.wait(lambda: job.steps_trained() >= 2, "two training steps")
    steps = cluster.steps(job.id)
    assert {"reward", "buffer", "trainer", "rollout-n4"} <= set(steps), steps
    for node in ("n2", "n3"):
        assert any("zerobubble serve trainer" in line for line in cluster.job_processes(node)), node
    cluster.run("scancel", "--signal=KILL", steps["rollout-n4"])
    job.wait(lambda: cluster.steps(job.id).get("rollout-n4") not in (None, steps["rollout-n4"]),
             "the rollout step to start again", 120)
    assert job.wait_end() == "COMPLETED", job.output()[-6000:]

    output = job.output()
    assert "rollout step on n4 ended with" in output and "trainer step ended with 0" in output
    assert output.count('{"service": "rollout"') >= 2, "the worker did not serve again after its step was killed"
    facts = job.facts()
    assert (facts["ZB_SERVICE_NODE"], facts["ZB_TRAINER_NODES"], facts["ZB_ROLLOUT_NODES"]) == ("n1", "n2,n3", "n4")
    steps = job.assert_every_group_trained_once()
    assert steps[-1]["step"] > 2, "no step was trained after the rollout step started again"
    assert_no_process_left(cluster)


def test_the_job_requeued_after_its_trainer_node_fails_resumes_from_the_last_checkpoint(cluster, tmp_path):
    job = Job(cluster, tmp_path, checkpoint_steps=2)
    job.wait(lambda: job.steps_trained() >= 3, "three training steps (a checkpoint at step 2)")
    trainer_node = job.facts()["ZB_TRAINER_NODES"]
    saved = int((job.run_dir / "trainer" / "checkpoints" / "latest").read_text().strip().rsplit("-", 1)[-1])
    cluster.fail_node(trainer_node)
    job.wait(lambda: int(cluster.job(job.id).get("Restarts", "0")) >= 1, "Slurm to requeue the job", 120,
             may_end=True)
    cluster.start_node(trainer_node)
    assert job.wait_end() == "COMPLETED", job.output()[-6000:] + "\n--- slurmctld ---\n" + cluster.controller_log()

    output = job.output()
    assert f"job {job.id} (restart 1)" in output
    resumed = re.findall(r"resumed from \S+ at step (\d+)", output)
    # The newest checkpoint when the node failed (or one it was finishing then).
    assert resumed and int(resumed[0]) >= saved >= 2 and int(resumed[0]) % 2 == 0, output[-6000:]
    steps = job.assert_every_group_trained_once()
    assert steps[-1]["step"] > int(resumed[0])
    assert_no_process_left(cluster)


def test_scancel_mid_run_leaves_no_process_on_any_node(cluster, tmp_path):
    job = Job(cluster, tmp_path)
    job.wait(lambda: job.steps_trained() >= 1, "a first training step")
    assert all(cluster.job_processes(node) for node in job.nodes()), "a node of the job runs nothing"
    cluster.run("scancel", str(job.id))
    assert job.wait_end() == "CANCELLED"
    assert_no_process_left(cluster)
