"""The tinker-cookbook's supervised loop (tinker_cookbook.supervised.train) on a local conversation file, then its RL
loop (tinker_cookbook.rl.train) from the state the first saved, on the demo's kind of task: each run with the
cookbook's own Config, against the front by base URL, API key and model name only. What the front answered is
read from the cookbook's own records: its metrics carry the front's optimizer counters (step:max,
grad_norm:mean), and its checkpoints name weights that only the front holds."""

from __future__ import annotations

from pathlib import Path

import pytest
import tinker
from tinker import types

from zerobubble.tooling.tinker.cookbook_runner import LoopRun, run_loop
from zerobubble.tooling.tiny.task import read_task

# Renders the tiny model's chat template (Qwen's ChatML, no system turn) token for token, and stops on its EOS.
RENDERER = "qwen3_instruct"
SL_STEPS = 12          # 400 conversations in batches of 32: one epoch
RL_STEPS = 3
TIMEOUT = 300


@pytest.fixture(scope="module")
def supervised(cookbook_python, front, task, tmp_path_factory) -> LoopRun:
    config = {"recipe_name": "zerobubble_test_sl", "renderer_name": RENDERER, "learning_rate": 3e-3,
              "lr_schedule": "constant", "lora_rank": 16, "save_every": 0, "eval_every": 0, "max_steps": SL_STEPS}
    dataset = {"file_path": str(task["conversations"]),
               "common": {"model_name_for_tokenizer": front.model_name, "renderer_name": RENDERER,
                          "max_length": 64, "batch_size": 32}}
    return run_loop(cookbook_python, front, "sl", config, dataset, tmp_path_factory.mktemp("sl"), timeout=TIMEOUT)


@pytest.fixture(scope="module")
def reinforcement(cookbook_python, front, task, supervised, tmp_path_factory) -> LoopRun:
    config = {"recipe_name": "zerobubble_test_rl", "renderer_name": RENDERER, "learning_rate": 1e-3,
              "lora_rank": 16, "max_tokens": 12, "save_every": 0, "eval_every": 2, "max_steps": RL_STEPS,
              "load_checkpoint_path": supervised.final["state_path"]}
    dataset = {"train_file": str(task["train"]), "test_file": str(task["eval"]),
               "model_name_for_tokenizer": front.model_name, "renderer_name": RENDERER,
               "groups_per_batch": 4, "group_size": 4, "test_group_size": 2}
    return run_loop(cookbook_python, front, "rl", config, dataset, tmp_path_factory.mktemp("rl"), timeout=TIMEOUT)


def test_the_cookbooks_own_loops_ran(supervised, reinforcement, cookbook_python):
    site = cookbook_python.parent.parent / "lib"
    for run, module in ((supervised, "tinker_cookbook/supervised/train.py"),
                        (reinforcement, "tinker_cookbook/rl/train.py")):
        assert run.result["cookbook_version"] == "0.5.8"
        assert run.result["train_module"].endswith(module)
        assert site in Path(run.result["train_module"]).resolve().parents


def test_supervised_loop_lowers_the_loss_through_the_fronts_optimizer(supervised):
    steps = [record for record in supervised.metrics if "train_mean_nll" in record]
    assert [record["step"] for record in steps] == list(range(SL_STEPS))
    # The front's Adam step counter, as its optim_step answers it, one a step.
    assert [record["step:max"] for record in steps] == [step + 1 for step in range(SL_STEPS)]
    first, last = steps[0]["train_mean_nll"], [record["train_mean_nll"] for record in steps[-3:]]
    assert sum(last) / len(last) < first - 0.5, (first, last)


def test_rl_loop_samples_and_trains_from_the_supervised_state(reinforcement, supervised):
    steps = [record for record in reinforcement.metrics if "env/all/reward/total" in record]
    assert [record["step"] for record in steps] == list(range(RL_STEPS))
    for record in steps:
        assert record["env/all/total_episodes"] == 16          # 4 groups of 4, each episode sampled by the front
        assert record["step:max"] == record["step"] + 1        # a fresh optimizer on the loaded weights
        assert record["optim/kl_sample_train_v1"] == pytest.approx(0, abs=1e-3)  # sampler and trainer agree
    evaluated = [record["step"] for record in reinforcement.metrics if "test/env/all/correct" in record]
    assert evaluated == [0, 2]
    # A new training client made from the supervised loop's state, not the same one.
    assert reinforcement.final["state_path"].split("/")[2] != supervised.final["state_path"].split("/")[2]


def test_the_loops_final_weights_sample_at_the_front(front, reinforcement, task):
    service = tinker.ServiceClient(base_url=front.url, api_key=front.token)
    sampler = service.create_sampling_client(model_path=reinforcement.final["sampler_path"]).result(60)
    tokenizer = sampler.get_tokenizer()
    question = read_task(task["eval"])[0].messages
    prompt = tokenizer.encode(tokenizer.apply_chat_template(question, add_generation_prompt=True, tokenize=False),
                              add_special_tokens=False)
    result = sampler.sample(types.ModelInput.from_ints(prompt), num_samples=2,
                            sampling_params=types.SamplingParams(max_tokens=12, temperature=1.0)).result(timeout=60)
    assert len(result.sequences) == 2 and all(sequence.tokens for sequence in result.sequences)


def test_the_cookbooks_evaluator_scores_the_loops_weights_apart_from_the_loop(cookbook_python, front, task,
                                                                             reinforcement, tmp_path):
    dataset = {"train_file": str(task["train"]), "test_file": str(task["eval"]),
               "model_name_for_tokenizer": front.model_name, "renderer_name": RENDERER,
               "groups_per_batch": 4, "group_size": 4, "test_group_size": 2}
    config = {"max_tokens": 12, "model_path": reinforcement.final["sampler_path"]}
    run = run_loop(cookbook_python, front, "eval", config, dataset, tmp_path, timeout=TIMEOUT)
    assert run.result["train_module"].endswith("tinker_cookbook/rl/metric_util.py")
    assert run.result["metrics"]["test/env/all/total_episodes"] == 40     # 20 held-out sums, 2 samples each
    assert 0 <= run.result["metrics"]["test/env/all/correct"] <= 1
