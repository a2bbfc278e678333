"""Every service on its own host (a network namespace with its own address), started with
`ip netns exec NS python -m zerobubble serve SVC --config FILE`, configs naming the others by address:
a short training of multi-turn episodes runs to its end, the environment service on a host of its own playing them
for the rollout worker, and the weights reach the rollout worker over gloo between hosts."""

from __future__ import annotations

import json

import grpc
import pytest
from e2e_helpers import (
    FEEDBACK,
    FEEDBACK_ENVIRONMENT,
    GROUPS_PER_STEP,
    PROXY_VARIABLES,
    NamespacedService,
    buffer_tree,
    loaded_versions,
    log_tail,
    metrics_rows,
    reward_tree,
    rollout_tree,
    start_all,
    stop_all,
    trainer_tree,
    user_environments,
    wait_for,
    write_config,
)
from e2e_netns import NetworkNamespaces, namespaces_unavailable
from stack import tiny_assets

from zerobubble.common.clients.buffer import BufferClient
from zerobubble.environment.config import EnvironmentServiceConfig
from zerobubble.tooling.launcher.config import validated, write_yaml
from zerobubble.v1 import rollout_pb2, rollout_pb2_grpc

PROMPTS = 32
STEPS = PROMPTS // GROUPS_PER_STEP
SERVICES = ("reward", "environment", "buffer", "trainer", "rollout")
PORTS = {"reward": 50052, "buffer": 50053, "rollout": 50054, "trainer": 50055, "environment": 50056}
# An episode's whole response, and each of the model's turns in it: room for the feedback between two turns.
EPISODE_TOKENS, TURN_TOKENS = 96, 8
# A user's environment: feedback after the first answer, the end after the second; a reward that varies.
@pytest.fixture
def hosts(monkeypatch):
    reason = namespaces_unavailable()
    if reason is not None:
        pytest.skip(reason)
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    net = NetworkNamespaces(list(SERVICES))
    try:
        yield net.create()
    finally:
        net.close()
    assert not net.leftovers()


def test_training_runs_to_the_end_with_every_service_on_its_own_host(hosts, tmp_path):
    model, train, _ = tiny_assets(tmp_path / "assets", train_size=PROMPTS, eval_size=4)
    run_dir, logs = tmp_path / "run", tmp_path / "run" / "logs"
    at = {name: f"{hosts.addresses[name]}:{PORTS[name]}" for name in SERVICES}
    envs = user_environments(tmp_path, "feedback_env", FEEDBACK_ENVIRONMENT)
    episodes = {"default": {"environment": "feedback"}, "max_turns": 3, "max_turn_tokens": TURN_TOKENS}
    trees = {
        "reward": reward_tree(at["reward"]),
        "environment": {"server": {"listen": at["environment"], "metrics_port": None},
                        "environments": [{"name": "feedback", "environment": "feedback_env:Feedback",
                                          "path": str(envs)}]},
        "buffer": buffer_tree(at["buffer"], train, run_dir / "buffer-wal"),
        # The weight-sync store and the trainer's gloo end listen on the trainer host's own address.
        "trainer": trainer_tree(at["trainer"], model, run_dir / "trainer", at["buffer"],
                                hosts.addresses["trainer"]),
        "rollout": rollout_tree(at["rollout"], "rollout-0", model, buffer=at["buffer"], reward=at["reward"],
                                trainer=at["trainer"], seed=0),
    }
    trees["buffer"]["run_spec"].update(max_new_tokens=EPISODE_TOKENS, episodes=episodes)
    trees["trainer"]["batch"]["max_new_tokens"] = EPISODE_TOKENS
    trees["trainer"]["tracking"] = {"rollout_log": {"interval_steps": 1, "groups": GROUPS_PER_STEP}}
    trees["rollout"]["generation"]["max_new_tokens"] = EPISODE_TOKENS
    trees["rollout"]["environment"] = {"address": at["environment"]}
    configs = {name: write_config(run_dir, name, name, tree) for name, tree in trees.items() if name != "environment"}
    validated(EnvironmentServiceConfig, trees["environment"], "environment")
    configs["environment"] = write_yaml(run_dir / "configs" / "environment.yaml", trees["environment"])
    processes = [NamespacedService(name, name, configs[name], logs, hosts.namespaces[name]) for name in SERVICES]
    reward, environment, buffer, trainer, rollout = processes
    try:
        # The trainer serves before the worker starts: a worker that finds no trainer joins again with a backoff
        # growing to 5 s, and this 8-step run can end inside one such wait, leaving the worker rightly on version 0.
        start_all([reward, environment, buffer, trainer])
        start_all([rollout])
        assert [p.address for p in processes] == [at[name] for name in SERVICES]
        wait_for(lambda: trainer.exit_code is not None, 120, "the trainer to finish",
                 [p for p in processes if p is not trainer])
        assert trainer.exit_code == 0, log_tail(trainer)
        with BufferClient(buffer.address) as client:
            stats = client.stats()
        with grpc.insecure_channel(rollout.address) as channel:
            status = rollout_pb2_grpc.RolloutServiceStub(channel).Status(rollout_pb2.RolloutStatusRequest(),
                                                                         timeout=10)
    finally:
        stop_all(processes)

    assert [row["step"] for row in metrics_rows(run_dir)] == list(range(1, STEPS + 1))
    assert stats.end_of_data and stats.groups_in == PROMPTS
    assert status.worker_id == "rollout-0" and status.policy_version > 0, (
        f"no weights reached the worker:\n{log_tail(rollout)}\n{log_tail(trainer)}")
    assert 0 < status.policy_version <= max(loaded_versions(rollout.log_path)) <= STEPS
    assert f"weight sync store on {hosts.addresses['trainer']}:" in trainer.log_path.read_text()

    # Every response is an episode the environment host played: the model's two turns learnt from, the feedback
    # that crossed from the environment host between them masked out, with no behaviour log-prob.
    logged = [response for line in (run_dir / "trainer" / "rollouts.jsonl").read_text().splitlines()
              for response in json.loads(line)["responses"]]
    assert logged and all(r["episode"]["environment"] == "feedback" for r in logged)
    finished = [r for r in logged if r["episode"]["ended_reason"] == "done"]
    assert len(finished) > len(logged) // 2, [r["episode"]["ended_reason"] for r in logged]
    for response in finished:
        mask, tokens = response["loss_mask"], response["tokens"]
        assert response["episode"]["turns"] == 2, response["episode"]
        masked = "".join(t for t, m in zip(tokens, mask, strict=True) if m == 0)
        assert FEEDBACK in masked and FEEDBACK not in "".join(t for t, m in zip(tokens, mask, strict=True) if m)
        first, second = mask.index(0), len(mask) - mask[::-1].index(0)
        assert 0 < first < second < len(mask) and set(mask[first:second]) == {0}, "one observation between turns"
        assert all(lp == 0 for lp, m in zip(response["logprobs"], mask, strict=True) if m == 0)
