"""One run mixing math, code and custom-verified prompts: a real rollout worker (tiny model) scores each group with
the verifier its row's data_source maps to, through a real buffer and reward service."""

from __future__ import annotations

import json
import os
import shutil
import textwrap

import pytest
from stack import start_buffer, start_reward, tiny_assets
from test_rollout_worker import rollout_config, wait_for

from zerobubble.common.clients.buffer import BufferClient
from zerobubble.common.codec import decode_array
from zerobubble.rollout.app import build
from zerobubble.rollout.prompting import SYSTEM_PROMPTS

GENERATIONS = 2
PROBE = textwrap.dedent('''
    def score(response, gt, metadata):
        # Proves what reached it: the row's data source and id, and its ground truth.
        ok = metadata.get("data_source") == "tagged" and metadata.get("prompt_id", "").startswith("t") and gt == "7"
        return 0.5 if ok else -1.0
''')

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("bwrap") is None,
                                reason="the code verifier's sandbox needs root and bubblewrap")


def mixed_rows(math_rows: list[dict]) -> list[dict]:
    rows = [{**row, "id": f"m{i}", "data_source": "arith"} for i, row in enumerate(math_rows)]
    rows += [{"id": f"c{i}", "data_source": "progs", "messages": [{"role": "user", "content": f"Print {i}."}],
              "test_cases": {"inputs": [""], "outputs": [str(i)]}} for i in range(4)]
    rows += [{"id": f"t{i}", "data_source": "tagged", "messages": [{"role": "user", "content": "3+4="}],
              "gt_answer": "7"} for i in range(2)]
    return rows


def test_each_row_is_scored_by_the_verifier_of_its_data_source(tmp_path):
    model, train, _ = tiny_assets(tmp_path, train_size=4, eval_size=1)
    rows = mixed_rows([json.loads(line) for line in train.read_text().splitlines()])
    prompts = tmp_path / "mixed.jsonl"
    prompts.write_text("\n".join(json.dumps(row) for row in rows))
    (tmp_path / "probe.py").write_text(PROBE)
    reward = start_reward(**{"custom_verifiers": [{"name": "probe", "function": "probe:score",
                                                   "path": str(tmp_path)}], "sandbox.slots": 1})
    # The routing is the run's: the buffer's run spec carries it and the worker fetches it.
    buffer = start_buffer(prompts, tmp_path / "wal", **{
        "run_spec.num_generations": GENERATIONS, "run_spec.max_new_tokens": 8,
        "run_spec.by_data_source": {"arith": "boxed", "progs": "code", "tagged": "probe"}})
    config = rollout_config(model, buffer.address, reward.address, tmp_path, **{
        "generation.num_generations": GENERATIONS})
    host = build(config).start()
    try:
        wait_for(host.worker.drained.is_set, 120, "the worker to finish the data")
        with BufferClient(buffer.address) as client:
            groups = [pulled.group for pulled in client.pull(0, 1, 1000, wait_seconds=0.5).groups]
        assert len(groups) == len(rows)
        tokenizer = host.engine.tokenizer
        for group in groups:
            source = group.prompt.data_source
            prompt_text = tokenizer.decode(decode_array(group.prompt_ids, "prompt_ids").tolist())
            rewards = [t.reward for t in group.trajectories]
            if source == "tagged":
                assert rewards == [0.5] * GENERATIONS
                assert SYSTEM_PROMPTS["boxed"] not in prompt_text
            else:
                assert set(rewards) <= {0.0, 1.0}
                verifier = {"arith": "boxed", "progs": "code"}[source]
                assert SYSTEM_PROMPTS[verifier] in prompt_text
        counted = {verifier: sum(sample.value for metric in reward.registry.collect()
                                 if metric.name == "zerobubble_reward_items"
                                 for sample in metric.samples
                                 if sample.name.endswith("_total") and sample.labels["verifier"] == verifier)
                   for verifier in ("boxed", "code", "probe")}
        assert counted == {"boxed": 4 * GENERATIONS, "code": 4 * GENERATIONS, "probe": 2 * GENERATIONS}
    finally:
        host.stop(grace=0.5)
        buffer.stop(grace=0.5)
        reward.stop(grace=0.5)
