"""deploy/slurm/zerobubble.sbatch's end, run by bash with Slurm's commands replaced by scripts that record what they
were asked: when the trainer's step ends the script stops the other steps with scancel, unless Slurm requeued the job
meanwhile (a failed node's step can end with 0 before the requeue is seen), since a requeued job keeps its id and a
scancel would reach the steps of its next start. tests/e2e/test_slurm_cluster.py runs the script on a real cluster."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "deploy" / "slurm" / "zerobubble.sbatch"

# A step runs until it is signalled; the trainer's ends at once with the code the test chose.
SRUN = """\
#!/bin/bash
name=
for arg in "$@"; do case $arg in --job-name=*) name=${arg#--job-name=} ;; esac; done
if [ "$name" = trainer ]; then exit "$(cat "$FAKE/trainer-code")"; fi
echo $$ > "$FAKE/steps/$name.$$"
sleep 300 </dev/null >/dev/null 2>&1 &
trap 'kill $!; rm -f "$FAKE/steps/$name.$$"; exit 143' TERM
wait
"""
SCANCEL = """\
#!/bin/bash
echo "$*" >> "$FAKE/scancel.log"
for pid in "$FAKE"/steps/*; do [ -e "$pid" ] && kill -TERM "$(cat "$pid")"; done
exit 0
"""
SCONTROL = """\
#!/bin/bash
echo "JobId=7 JobName=zerobubble JobState=RUNNING Restarts=$(cat "$FAKE/restarts") BatchFlag=1"
"""
# `zerobubble slurm-plan` writes the facts the script sources; this one writes them for nodes n1 to n3.
PLAN = """\
#!/bin/bash
cat > "$FAKE/facts.env" <<EOF
ZB_PLAN=$FAKE/plan
ZB_SERVICE_NODE=n1
ZB_TRAINER_NODES=n2
ZB_TRAINER_NNODES=1
ZB_TRAINER_NPROC=1
ZB_TRAINER_HEAD=n2
ZB_TORCH_PORT=29500
ZB_ROLLOUT_NODES=n3
EOF
echo "$FAKE/facts.env"
"""


@pytest.fixture
def fake_slurm(tmp_path):
    fake = tmp_path / "fake"
    (fake / "bin").mkdir(parents=True)
    (fake / "steps").mkdir()
    (fake / "plan").mkdir()
    for name, text in {"srun": SRUN, "scancel": SCANCEL, "scontrol": SCONTROL, "python": PLAN}.items():
        path = fake / "bin" / name
        path.write_text(text)
        path.chmod(0o755)
    yield fake
    for pid in (fake / "steps").glob("*"):
        try:
            os.kill(int(pid.read_text()), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def run_script(fake: Path, *, trainer_code: int, restarts_seen: int) -> tuple[int, str]:
    """The script's exit code and output (to a file: a step it left running must not hold a pipe open)."""
    (fake / "trainer-code").write_text(str(trainer_code))
    (fake / "restarts").write_text(str(restarts_seen))
    env = {"PATH": f"{fake / 'bin'}:{os.environ['PATH']}", "FAKE": str(fake), "SLURM_JOB_ID": "7",
           "SLURM_JOB_NODELIST": "n[1-3]", "ZB_RUN_DIR": str(fake / "run"), "ZB_PYTHON": str(fake / "bin" / "python"),
           "ZB_ROLLOUT_RESTART_SECONDS": "1"}
    output = fake / "job.out"
    with open(output, "w") as out:
        code = subprocess.run(["bash", str(SCRIPT)], env=env, stdout=out, stderr=subprocess.STDOUT, timeout=120)
    return code.returncode, output.read_text()


def test_when_the_trainer_ends_the_other_steps_are_cancelled_and_the_job_ends_with_its_code(fake_slurm):
    code, output = run_script(fake_slurm, trainer_code=0, restarts_seen=0)
    assert code == 0, output
    assert "trainer step ended with 0" in output
    assert (fake_slurm / "scancel.log").read_text().splitlines()[0] == "--signal=TERM 7"
    assert not list((fake_slurm / "steps").glob("*")), "a step was left running"
    assert (fake_slurm / "plan" / "trainer.done").exists(), "the rollout loops were not told to stop"


def test_a_start_requeued_before_its_trainer_step_ended_cancels_nothing_and_fails(fake_slurm):
    # As when the trainer's node failed: its step ended with 0, and the controller has requeued the job already.
    code, output = run_script(fake_slurm, trainer_code=0, restarts_seen=1)
    assert code == 1, output
    assert not (fake_slurm / "scancel.log").exists(), (fake_slurm / "scancel.log").read_text()
