"""The rollout worker's episodes through a real environment service whose environments fail every way they can: each
episode ends with its reason, keeps the turns the model took, and the batch (and the worker) goes on."""

from __future__ import annotations

import json
import textwrap

import pytest

from zerobubble.common.config import ClientConfig, load_config
from zerobubble.common.run_spec import RunSpec
from zerobubble.environment.app import build
from zerobubble.environment.config import EnvironmentServiceConfig
from zerobubble.rollout.engine import SamplingSettings
from zerobubble.rollout.engine_transformers import TransformersEngine
from zerobubble.rollout.episodes.play import make_player
from zerobubble.tooling.tiny.model import make_tiny_model
from zerobubble.v1 import common_pb2

# Each fails on every step (or at reset), whatever the model writes.
FAILING = '''
import os, time

class Hangs:
    def reset(self, row): return None
    def step(self, text): time.sleep(3600)

class Raises:
    def reset(self, row): return None
    def step(self, text): raise ValueError("broken")

class Exits:
    def reset(self, row): return None
    def step(self, text): os._exit(3)

class Garbage:
    def reset(self, row): return None
    def step(self, text): return "not a dict"

class Huge:
    def reset(self, row): return None
    def step(self, text): return {"observation": "x" * (1024 * 1024), "reward": 0.0, "done": False, "info": {}}

class NeverDone:
    def reset(self, row): return None
    def step(self, text): return {"observation": "again", "reward": 0.25, "done": False, "info": {}}

class ResetFails:
    def reset(self, row): raise KeyError("no such column")
    def step(self, text): return {"observation": None, "reward": 0.0, "done": True, "info": {}}
'''
EXPECTED = {"Hangs": "timeout", "Raises": "error", "Exits": "exited", "Garbage": "bad_reply",
            "Huge": "observation_too_large", "NeverDone": "max_turns", "ResetFails": "reset_failed"}


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    folder = tmp_path_factory.mktemp("failing_envs")
    (folder / "failing_envs.py").write_text(textwrap.dedent(FAILING))
    host = build(load_config(EnvironmentServiceConfig, overrides={
        "server.listen": "127.0.0.1:0", "limits.step_timeout_s": 5.0,
        "environments": [{"name": name, "environment": f"failing_envs:{name}", "path": str(folder)}
                         for name in EXPECTED]})).start()
    yield host
    host.stop(0)


def test_every_failure_ends_its_episode_with_its_reason_and_the_batch_goes_on(service, tmp_path):
    engine = TransformersEngine(make_tiny_model(tmp_path / "model", size="1m"), seed=0)
    spec = RunSpec(num_generations=2, max_new_tokens=128, episodes={
        "by_data_source": {name: {"environment": name} for name in EXPECTED}, "max_turns": 3, "max_turn_tokens": 6})
    player = make_player(engine.tokenizer, spec, system_prompt="",
                         environment=ClientConfig(address=service.address, timeout_seconds=30, retry_seconds=5))
    prompts = [common_pb2.Prompt(prompt_id=name, data_source=name,
                                 messages_json=json.dumps([{"role": "user", "content": "1+1="}])) for name in EXPECTED]
    _, samples = player.play(engine, prompts, SamplingSettings(n=2, temperature=1.0, max_new_tokens=6, seed=0))
    for prompt, per_prompt in zip(prompts, samples, strict=True):
        for sample in per_prompt:
            record = sample.episode
            assert record.ended_reason == EXPECTED[prompt.prompt_id], prompt.prompt_id
            assert sample.loss_mask.any(), "the model's first turn is kept"
            assert record.turns == (3 if prompt.prompt_id == "NeverDone" else 1)
    never_done = samples[list(EXPECTED).index("NeverDone")][0]
    assert never_done.episode.step_rewards == [0.25, 0.25, 0.25] and never_done.finish_reason == "length"
    # The service stays usable: every failed episode was closed or ended, nothing is left open.
    assert service.core.live() == 0
