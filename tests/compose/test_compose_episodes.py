"""The tool demo under `docker compose up` (docker-compose.yml + compose.cpu.yml + compose.tool-demo.yml), for real:
the `assets` service warm-starts the tiny model to call the calculator, the rollout worker plays every prompt as an
episode against the `environment` container, and the trainer learns from the episodes to the end of the data. What
the trainer learnt from (its rollout log on the `runs` volume) holds the model's turns unmasked and the calculator's
answers, computed in the environment container, masked out between them.

Runs from `make test-compose` (ZEROBUBBLE_COMPOSE=1); plain pytest skips it. The warm-started model and its task
are kept in two docker volumes named after what makes them (the `assets` command and the sizes below), so only the
first run pays for the warm start.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import uuid

import pytest
import yaml
from compose_stack import DEPLOY, IMAGE, Stack, run, sandbox_cgroups

PROMPTS = 32                 # four steps of the demo's eight groups
WARM_START_STEPS = 300       # enough for the calls' fixed shape; the demo's 1,500 also make the answers right
OVERRIDE = DEPLOY / "compose.tool-demo.yml"
SERVICES = ("reward", "environment", "buffer", "trainer", "rollout-1")
CALL = re.compile(r"@calculator\((\d+)\+(\d+)\)")


def asset_volumes() -> dict[str, str]:
    """Volume names that change whenever what the `assets` service would make changes."""
    assets = yaml.safe_load(OVERRIDE.read_text())["services"]["assets"]["command"]
    key = hashlib.sha256(json.dumps([assets, PROMPTS, WARM_START_STEPS]).encode()).hexdigest()[:12]
    return {"models": f"zbtest-tool-demo-models-{key}", "data": f"zbtest-tool-demo-data-{key}"}


@pytest.fixture(scope="module")
def stack(images, tmp_path_factory):
    folder = tmp_path_factory.mktemp("compose-episodes")
    (folder / "token").write_text(uuid.uuid4().hex)
    (folder / "grafana_password").write_text(uuid.uuid4().hex)
    volumes = asset_volumes()
    for name in volumes.values():
        run(["docker", "volume", "create", name], timeout=60)
    services = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())["services"]
    trainer = services["trainer"]["command"]
    rollout = services["rollout-1"]["command"]
    override = folder / "compose.test.yml"
    override.write_text(yaml.safe_dump({
        "networks": {"default": {"internal": True}},
        "secrets": {"zerobubble_token": {"file": str(folder / "token")},
                    "grafana_admin_password": {"file": str(folder / "grafana_password")}},
        "volumes": {key: {"external": True, "name": name} for key, name in volumes.items()},
        "services": {
            # The demo's schedule for this many prompts, and every step's episodes in the rollout log.
            "trainer": {"command": [*trainer, "--set", f"strategy.optim.total_steps={PROMPTS // 8}",
                                    "--set", "tracking.rollout_log.interval_steps=1"]},
            # No evaluation of the starting weights: 400 more episodes that test nothing here.
            "rollout-1": {"command": [*rollout, "--set", "eval.at_start=false"]},
        },
    }))
    name = f"zbtest{uuid.uuid4().hex[:8]}"
    with sandbox_cgroups(name) as cgroups:
        env = {**os.environ, "ZB_IMAGE": IMAGE, "ZB_PROMPTS": str(PROMPTS),
               "ZB_WARM_START_STEPS": str(WARM_START_STEPS), **cgroups}
        project = Stack(name, [DEPLOY / "docker-compose.yml", DEPLOY / "compose.cpu.yml", OVERRIDE, override], env)
        try:
            yield project
        finally:
            project("down", "-v", "--remove-orphans", "-t", "10", timeout=300, check=False)


def loss_mask(response: dict) -> list[int]:
    """The log leaves out a mask that is all ones (an episode the model played in one turn)."""
    return response.get("loss_mask", [1] * len(response["token_ids"]))


def masked_text(response: dict) -> str:
    return "".join(t for t, m in zip(response["tokens"], loss_mask(response), strict=True) if m == 0)


def test_the_tool_demo_trains_on_episodes_played_in_the_environment_container(stack):
    stack("up", "-d", *SERVICES, timeout=1800)
    stack.wait_for(lambda: stack.state("trainer")[0] == "exited", 1200, "the trainer to finish")
    assert stack.state("trainer") == ("exited", 0), stack.logs("trainer")[-4000:]
    assert stack.state("environment")[0] == "running"

    rows = [json.loads(line) for line in stack.read_run_file("/runs/trainer/rollouts.jsonl").splitlines()]
    logged = [response for row in rows for response in row["responses"]]
    assert logged and all(r["episode"]["environment"] == "calculator" for r in logged)
    called = [r for r in logged if r["episode"]["turns"] >= 2]
    assert called, [(r["episode"], r["text"]) for r in logged[:8]]
    for response in logged:
        mask, logprobs = loss_mask(response), response["logprobs"]
        # The model's turns are learnt from; one masked stretch (the tool's answer and the template around it)
        # sits between each two of them, with no behaviour log-prob.
        stretches = sum(m == 0 and (i == 0 or mask[i - 1] == 1) for i, m in enumerate(mask))
        assert mask[0] == 1 and stretches == response["episode"]["turns"] - 1, (response["episode"], mask)
        assert all(lp == 0 for lp, m in zip(logprobs, mask, strict=True) if m == 0)
    # The answer between the turns is the environment container's: the sum the model asked for.
    answered = 0
    for response in called:
        masked = masked_text(response)
        assert "<|im_start|>tool\n" in masked, masked
        call = CALL.search(response["text"])
        if call and response["text"].index(call.group(0)) < response["text"].index("<|im_start|>tool\n"):
            assert str(int(call.group(1)) + int(call.group(2))) in masked, (call.group(0), masked)
            answered += 1
    assert answered, [r["text"] for r in called[:4]]
    print(f"episodes: {len(logged)} logged, {len(called)} with a tool call, {answered} answered by the calculator")

    stack("down", "-v", "-t", "10", timeout=300)
    assert stack.leftover() == []
