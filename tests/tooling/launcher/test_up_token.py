"""`zerobubble up` needs no token from the user, yet none of its services answers a caller without the run's token:
the services `Run.launch` starts (real processes on loopback) refuse anonymous calls, train with each other, and the
evaluation after the run gets through; the token is written in the run folder only to its own file, readable by its
owner alone (for the user's own calls)."""

from __future__ import annotations

import os
import stat
import time

import grpc
import pytest
from stack import tiny_assets

from zerobubble.common.clients.buffer import BufferClient
from zerobubble.common.clients.trainer import TrainerClient
from zerobubble.common.config import TOKEN_ENV
from zerobubble.tooling.launcher.assets import RunAssets
from zerobubble.tooling.launcher.config import UpConfig
from zerobubble.tooling.launcher.run import TOKEN_FILE, Run, final_eval
from zerobubble.v1 import (
    buffer_pb2,
    buffer_pb2_grpc,
    reward_pb2,
    reward_pb2_grpc,
    rollout_pb2,
    rollout_pb2_grpc,
    trainer_pb2,
    trainer_pb2_grpc,
)

ANONYMOUS_CALLS = {
    "reward": lambda ch: reward_pb2_grpc.RewardServiceStub(ch).ListVerifiers(reward_pb2.ListVerifiersRequest(),
                                                                              timeout=10),
    "buffer": lambda ch: buffer_pb2_grpc.BufferServiceStub(ch).Stats(buffer_pb2.StatsRequest(), timeout=10),
    "trainer": lambda ch: trainer_pb2_grpc.TrainerServiceStub(ch).JoinWeightSync(
        trainer_pb2.JoinRequest(worker_id="stranger", device="cpu"), timeout=10),
    "rollout": lambda ch: rollout_pb2_grpc.RolloutServiceStub(ch).Status(rollout_pb2.RolloutStatusRequest(),
                                                                          timeout=10),
}


@pytest.fixture
def no_token_in_the_environment(monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    yield
    os.environ.pop(TOKEN_ENV, None)  # launch set it for its services


def wait_for(condition, timeout: float, what: str, run: Run) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        for process in run.services:
            assert process.exit_code in (None, 0), f"{process.name} exited with {process.exit_code}; " \
                                                   f"{process.log_path.read_text()[-2000:]}"
        assert time.monotonic() < deadline, f"no {what} within {timeout}s"
        time.sleep(0.5)


@pytest.mark.slow  # a whole-service restart, stop or run: make test runs it, make test-fast leaves it out
def test_up_services_refuse_strangers_and_work_with_the_runs_own_token(tmp_path, no_token_in_the_environment):
    model, train, held_out = tiny_assets(tmp_path / "assets", train_size=8, eval_size=2)
    run_dir = tmp_path / "run"
    config = UpConfig.model_validate({
        "run_dir": run_dir, "final_eval": True,
        "run": {"num_generations": 4, "max_new_tokens": 8},
        "buffer": {"prompts": {"epochs": 1}},
        "trainer": {"batch": {"groups_per_step": 4, "micro_batch_samples": 16}, "max_steps": 2,
                    "server": {"grace_seconds": 1.0}},
        "rollout": {"generation": {"prompts_per_batch": 4}, "eval": {"samples_per_prompt": 2},
                    "server": {"grace_seconds": 1.0}},
    })
    run = Run(config)
    assets = RunAssets(model=model, train=train, eval=held_out)
    try:
        trainer = run.launch(assets)
        token = os.environ[TOKEN_ENV]
        assert len(token) >= 32
        for process in run.services:
            with grpc.insecure_channel(process.address) as channel, pytest.raises(grpc.RpcError) as refused:
                ANONYMOUS_CALLS[process.service](channel)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, process.name

        # The worker's calls carry the token: it joined the weight sync and its groups reach the trainer.
        with TrainerClient(run.client_config(trainer)) as client:
            wait_for(lambda: client.status().sync_members == 1, 120, "weight-sync member", run)
        wait_for(lambda: trainer.exit_code == 0, 300, "end of training", run)
        buffer = next(p for p in run.services if p.service == "buffer")
        with BufferClient(run.client_config(buffer)) as client:
            assert client.stats().groups_out == 8
        final_eval(run, assets)
    finally:
        run.stop_all()
    assert (run_dir / "eval" / "summary.jsonl").read_text().count('"version": 2') == 1
    for path in run_dir.rglob("*"):
        if path.is_file() and path.suffix in (".yaml", ".log", ".jsonl", ".json"):
            assert token not in path.read_text(errors="replace"), f"the token is written in {path}"
    token_file = run_dir / TOKEN_FILE
    assert token_file.read_text().strip() == token and stat.S_IMODE(token_file.stat().st_mode) == 0o600
