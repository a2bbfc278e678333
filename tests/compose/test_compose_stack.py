"""`docker compose up` of deploy/ on CPU, for real: the image builds here, the stack (reward, buffer, trainer, two
rollout workers, Prometheus, and the teacher of compose.distill.yml) trains the tiny model to the end of its data,
distilling from the teacher container beside the verifier's reward, a restarted rollout worker and a restarted
buffer lose no group, Prometheus scraped every service, the code verifier scores programs inside the reward
container (not privileged: two capabilities, its seccomp profile, a memory cgroup of its own), and `down` leaves
nothing behind.

Runs from `make test-compose` (ZEROBUBBLE_COMPOSE=1), which first makes sure a Docker engine answers; plain pytest
skips it. Every container sits on a network compose makes `internal`: nothing reaches an address off this machine.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
import uuid

import pytest
import yaml
from compose_stack import DEPLOY, IMAGE, PROMETHEUS_IMAGE, Stack, sandbox_cgroups

PROMPTS, GENERATIONS = 128, 4
GROUPS_PER_STEP = yaml.safe_load((DEPLOY / "compose" / "cpu" / "trainer.yaml").read_text())["batch"]["groups_per_step"]
MOST_STEPS = PROMPTS // GROUPS_PER_STEP  # fewer where groups are dropped as stale
SERVICES = ("reward", "environment", "teacher", "buffer", "trainer", "rollout-1", "rollout-2", "prometheus")
SCRAPED = {"reward": 1, "environment": 1, "teacher": 1, "buffer": 1, "rollout": 2, "trainer": 1}

BUFFER_STATS = ("import json; from zerobubble.buffer.config import BufferServiceConfig; "
                "from zerobubble.buffer.core import Buffer; from zerobubble.common.config import load_config; "
                "b = Buffer(load_config(BufferServiceConfig, '/etc/zerobubble/buffer.yaml')); "
                "print(json.dumps(b.stats())); b.close()")
CODE_SCORE = ("import json, sys; from zerobubble.common.config import ClientConfig; "
              "from zerobubble.common.clients.reward import RewardClient; "
              "c = RewardClient(ClientConfig(address='127.0.0.1:50052', "
              "auth_token_file='/run/secrets/zerobubble_token', timeout_seconds=60)); "
              "tests = {'inputs': ['2 3\\n'], 'outputs': ['5\\n']}; "
              "r = [c.score('code', '```python\\n' + p + '\\n```', test_cases=tests) for p in sys.argv[1:]]; "
              "print(json.dumps([[x.reward, x.reason] for x in r]))")

# One episode of the environment service's python tool per program: the tool's answer (the observation) of each.
PYTHON_TOOL = """
import json, sys
from zerobubble.common.clients.environment import EnvironmentClient
from zerobubble.common.config import ClientConfig
c = EnvironmentClient(ClientConfig(address='127.0.0.1:50056', auth_token_file='/run/secrets/zerobubble_token',
                                   timeout_seconds=60))
answers = []
for program in sys.argv[1:]:
    episode = c.open_episode('python', {'messages': [{'role': 'user', 'content': 'Run it.'}]}).episode_id
    call = '<tool_call>' + json.dumps({'name': 'python', 'arguments': {'code': program}}) + '</tool_call>'
    answers.append(json.loads(c.step_episode(episode, call).observation_json))
    c.close_episode(episode)
print(json.dumps(answers))
"""


@pytest.fixture(scope="module")
def stack(images, tmp_path_factory):
    folder = tmp_path_factory.mktemp("compose")
    (folder / "token").write_text(uuid.uuid4().hex)
    (folder / "grafana_password").write_text(uuid.uuid4().hex)
    override = folder / "compose.test.yml"
    override.write_text(yaml.safe_dump({
        # No route off the compose network: the containers reach each other and nothing else.
        "networks": {"default": {"internal": True}},
        "secrets": {"zerobubble_token": {"file": str(folder / "token")},
                    "grafana_admin_password": {"file": str(folder / "grafana_password")}},
    }))
    name = f"zbtest{uuid.uuid4().hex[:8]}"
    with sandbox_cgroups(name) as cgroups:
        env = {**os.environ, "ZB_IMAGE": IMAGE, "ZB_PROMETHEUS_IMAGE": PROMETHEUS_IMAGE, "ZB_PROMPTS": str(PROMPTS),
               "COMPOSE_PROFILES": "distill", **cgroups}
        project = Stack(name, [DEPLOY / "docker-compose.yml", DEPLOY / "compose.cpu.yml",
                               DEPLOY / "compose.distill.yml", override], env)
        try:
            yield project
        finally:
            project("down", "-v", "--remove-orphans", "-t", "10", timeout=300, check=False)


USERNS_REFUSED = ("import ctypes; a, b = map(int, input().split()); "
                  "print(a + b if ctypes.CDLL(None).unshare(0x10000000) else 0)")  # CLONE_NEWUSER


def test_the_stack_trains_to_the_end_through_restarts_and_leaves_nothing(stack):
    started = time.monotonic()
    stack("up", "-d", *SERVICES, timeout=900)

    def steps() -> int:
        """The trainer's newest step, read inside it while it runs (a one-off container takes seconds)."""
        text = stack("exec", "-T", "trainer", "sh", "-c", "tail -n 1 /runs/trainer/metrics.jsonl 2>/dev/null",
                     timeout=60, check=False).stdout
        return json.loads(text)["step"] if text.startswith("{") else 0

    stack.wait_for(lambda: steps() >= 2, 600, "two training steps")
    for service in ("buffer", "rollout-1"):
        step = steps()
        assert stack.state("trainer")[0] == "running" and step < MOST_STEPS - 4, \
            f"the run was nearly over (step {step} of at most {MOST_STEPS}) before {service} was restarted"
        stack("restart", "-t", "20", service, timeout=180)
        stack.wait_for(lambda step=step: steps() >= step + 2, 600, f"two more steps after restarting {service}")

    stack.wait_for(lambda: stack.state("trainer")[0] == "exited", 900, "the trainer to finish")
    assert stack.state("trainer") == ("exited", 0)
    print(f"compose run: {time.monotonic() - started:.0f} s from up to the trainer's end")

    # Prometheus scraped every zerobubble service while the run went on.
    query = "http://127.0.0.1:9090/api/v1/query?query=max_over_time(up[30m])"
    reply = json.loads(stack.exec("prometheus", "wget", "-qO-", query))
    seen: dict[str, int] = {}
    for series in reply["data"]["result"]:
        if series["value"][1] == "1":
            seen[series["metric"]["job"]] = seen.get(series["metric"]["job"], 0) + 1
    assert seen == SCRAPED, reply

    # The code verifier runs in the reward container without `privileged`, under deploy/seccomp/sandbox.json: the
    # third program answers right only where its user namespace is refused (seccomp=unconfined would allow it).
    scores = json.loads(stack.exec("reward", "python", "-c", CODE_SCORE,
                                   "a, b = map(int, input().split()); print(a + b)",
                                   "a, b = map(int, input().split()); print(a - b)", USERNS_REFUSED, timeout=120))
    assert [reward for reward, _ in scores] == [1.0, 0.0, 1.0], scores
    assert scores[1][1] == "wrong_answer", scores
    # The environment service's python tool, in its container with the same pieces: a program's output comes back
    # as the tool's answer, and a user namespace is refused there too.
    answers = stack.exec("environment", "python", "-c", PYTHON_TOOL, "print(2 + 3)",
                         "import ctypes; print('refused' if ctypes.CDLL(None).unshare(0x10000000) else 'made')",
                         timeout=120)
    first, second = (json.dumps(answer) for answer in json.loads(answers))
    assert "5" in first and "refused" in second and "made" not in second, answers

    # The run folder on the volume: every step once, the final checkpoint, and every group accounted for.
    logs = stack("logs", "--no-color", "trainer", timeout=120).stdout
    stack("stop", "-t", "20", "rollout-1", "rollout-2", "buffer", timeout=180)
    by_step = {row["step"]: row for row in stack.metrics_rows()}
    assert sorted(by_step) == list(range(1, len(by_step) + 1))
    # Every step scored by the teacher container: its own starting weights at step 1 (no gap), then a gap as the
    # student moves away from them.
    gaps = [by_step[step]["teacher_reverse_kl"] for step in sorted(by_step)]
    assert all(math.isfinite(gap) for gap in gaps) and abs(gaps[0]) < 1e-3 and max(map(abs, gaps)) > 1e-3, gaps
    assert stack.read_run_file("/runs/trainer/checkpoints/latest").strip()
    stats = json.loads(stack("run", "--rm", "--no-deps", "--entrypoint", "python", "buffer", "-c", BUFFER_STATS,
                             timeout=180).stdout.strip().splitlines()[-1])
    trained = sum(int(row["samples"]) for row in by_step.values()) // GENERATIONS
    found = re.findall(r"end of the data: (\d+) groups left over", logs)
    leftover = int(found[-1]) if found else 0
    print(f"groups: {stats['groups_in']} stored, {trained} trained, {stats['filtered']} filtered, "
          f"{stats['stale_dropped']} stale, {leftover} left over")
    assert stats["end_of_data"] and stats["queued_groups"] == 0
    assert stats["groups_in"] + stats["filtered"] == PROMPTS
    assert trained + stats["stale_dropped"] + leftover == stats["groups_in"]
    assert leftover < GROUPS_PER_STEP and len(by_step) == trained // GROUPS_PER_STEP

    stack("down", "-v", "-t", "10", timeout=300)
    assert stack.leftover() == []
