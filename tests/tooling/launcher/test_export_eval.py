"""`zerobubble export` and `zerobubble eval` on their own: a LoRA checkpoint exported merged into its base, bad
input refused naming it, and a run with episodes evaluated after its services are gone (its environment service
started again from its config, its episodes' transcripts printed). (Both run end to end after a real run in
tests/e2e/test_up_template.py and tests/e2e/test_eval_tool_run.py.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
import yaml
from peft import LoraConfig, get_peft_model
from stack import tiny_assets
from transformers import AutoModelForCausalLM

from zerobubble.common.config import TOKEN_ENV
from zerobubble.tooling.cli import main
from zerobubble.tooling.tiny.model import make_tiny_model
from zerobubble.trainer.checkpoints import STATE_FILE


def test_a_lora_checkpoint_is_exported_merged_into_its_base(tmp_path, capsys):
    base = make_tiny_model(tmp_path / "base", size="1m", seed=0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.5)   # a trained adapter: it changes the outputs
    checkpoint = tmp_path / "run" / "trainer" / "checkpoints" / "step-000003"
    model.save_pretrained(checkpoint)
    for path in base.iterdir():
        if "token" in path.name or path.name.endswith(".jinja"):
            shutil.copy(path, checkpoint)
    (checkpoint / STATE_FILE).write_text(json.dumps({"step": 3, "policy_version": 3}))
    (checkpoint / "optimizer.pt").write_bytes(b"state a user's model folder must not carry")

    assert main(["export", str(tmp_path / "run"), str(tmp_path / "out")]) == 0
    assert json.loads(capsys.readouterr().out)["lora_merged"] is True
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert not (tmp_path / "out" / "optimizer.pt").exists() and not (tmp_path / "out" / "adapter_config.json").exists()
    ids = torch.tensor([[5, 17, 42, 99, 3]])
    with torch.no_grad():
        merged, adapted = exported(ids).logits, model(ids).logits
        plain = AutoModelForCausalLM.from_pretrained(base)(ids).logits
    assert torch.allclose(merged, adapted, atol=1e-5) and not torch.allclose(merged, plain, atol=1e-3)


def test_export_and_eval_refuse_what_they_cannot_use_naming_it(tmp_path, capsys):
    assert main(["export", str(tmp_path / "nothing"), str(tmp_path / "out")]) == 2
    assert "RUN_DIR: " in capsys.readouterr().err and not (tmp_path / "out").exists()
    assert main(["eval", str(tmp_path / "no-model"), "--data", str(tmp_path / "x.jsonl")]) == 2
    assert "model: " in capsys.readouterr().err
    model = make_tiny_model(tmp_path / "model", size="1m", seed=0)
    assert main(["eval", str(model), "--data", str(tmp_path / "missing.jsonl")]) == 2
    assert "--data: " in capsys.readouterr().err
    assert main(["eval", str(model), "--data", str(model / "config.json"), "--run", str(tmp_path)]) == 2
    assert "--run: " in capsys.readouterr().err


# A user's environment that answers the model's first turn as a tool would, then ends the episode.
TOOL_ENVIRONMENT = '''
class Lookup:
    def reset(self, row):
        return None

    def step(self, assistant_text):
        if not hasattr(self, "called"):
            self.called = True
            return {"observation": "lookup() returned 42", "reward": 0.0, "done": False, "info": {}}
        return {"observation": None, "reward": 0.0, "done": True, "info": {}}
'''


def finished_episode_run(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A finished run with episodes, as `up` leaves it (its configs, a checkpoint), whose services are gone: its
    rollout config names a dead environment service."""
    model, _, held_out = tiny_assets(tmp_path / "assets", train_size=4, eval_size=2)
    envs = tmp_path / "my_envs"
    envs.mkdir()
    (envs / "lookup_env.py").write_text(TOOL_ENVIRONMENT)
    run_dir = tmp_path / "run"
    configs = run_dir / "configs"
    configs.mkdir(parents=True)
    token = {"auth_token_env": TOKEN_ENV}
    (configs / "buffer.yaml").write_text(yaml.safe_dump({
        "prompts": {"path": str(held_out)},
        "run_spec": {"num_generations": 2, "max_new_tokens": 160,
                     "episodes": {"default": {"environment": "lookup", "reward": "verifier"}, "max_turns": 3,
                                  "max_turn_tokens": 8}}}))
    (configs / "rollout-0.yaml").write_text(yaml.safe_dump({
        "model": {"path": str(model)}, "environment": {"address": "127.0.0.1:9", **token},
        "eval": {"samples_per_prompt": 2}}))
    (configs / "environment.yaml").write_text(yaml.safe_dump({
        "server": {"listen": "127.0.0.1:0", **token},
        "environments": [{"name": "lookup", "environment": "lookup_env:Lookup", "path": str(envs)}]}))
    return run_dir, model, held_out


def test_eval_of_a_run_with_episodes_starts_its_environment_service_and_prints_transcripts(tmp_path, capfd,
                                                                                          monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    run_dir, model, held_out = finished_episode_run(tmp_path)
    assert main(["eval", str(model), "--data", str(held_out), "--run", str(run_dir), "--samples", "2",
                 "--out", str(tmp_path / "eval"), "--transcripts", "3"]) == 0
    out = capfd.readouterr().out
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["prompts"] == 2 and summary["n"] == 2 and 0.0 <= summary["pass@1"] <= 1.0
    # Every episode was played in the environment started here: the tool's answer sits in its transcript.
    results = [json.loads(line) for line in Path(summary["samples"]).read_text().splitlines()]
    assert len(results) == 4
    assert all(r["episode"]["ended"] in ("done", "max_tokens") for r in results), [r["episode"] for r in results]
    assert all("lookup() returned 42" in r["episode"]["transcript"] for r in results)
    # The first three transcripts are printed before the summary line.
    assert out.count("--- ") == 3 and out.count("lookup() returned 42") == 3
    assert "tool calls, ended " in out
