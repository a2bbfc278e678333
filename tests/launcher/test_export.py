"""`zerobubble export RUN_DIR OUT`: the newest checkpoint as a plain Hugging Face folder that from_pretrained loads
and that computes what the trained policy computes; a LoRA adapter merged into its base; no training state."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from zerobubble.tooling.cli import main
from zerobubble.tooling.launcher.config import write_yaml
from zerobubble.tooling.tiny.model import make_tiny_model
from zerobubble.trainer import lora
from zerobubble.trainer.checkpoints import copy_model_files
from zerobubble.trainer.lora_config import LoraConfig


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def save_checkpoint(run_dir, base, model, step):
    """A checkpoint laid out as the trainer writes one: weights, the base's other files, the training state."""
    directory = run_dir / "trainer" / "checkpoints" / f"step-{step:06d}"
    model.save_pretrained(directory)
    copy_model_files(base, directory)
    torch.save({"state": {}}, directory / "optimizer.pt")
    (directory / "trainer_state.json").write_text(json.dumps({"step": step, "policy_version": step}))
    write_yaml(run_dir / "configs" / "trainer.yaml", {"model": str(base)})


def logits(model, tokenizer):
    with torch.inference_mode():
        return model(**tokenizer(["1+2=3"], return_tensors="pt")).logits


@pytest.mark.parametrize("use_lora", [False, True])
def test_export_writes_a_loadable_model_of_the_trained_policy(tmp_path, capsys, use_lora):
    base = make_tiny_model(tmp_path / "base", size="1m", seed=0)
    tokenizer = AutoTokenizer.from_pretrained(base)
    trained = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    if use_lora:
        trained = lora.wrap(trained, LoraConfig(rank=4))
    with torch.no_grad():
        for name, parameter in trained.named_parameters():
            if parameter.requires_grad and (not use_lora or "lora_B" in name):
                parameter.add_(0.05 * torch.randn_like(parameter))
    run_dir = tmp_path / "run"
    save_checkpoint(run_dir, base, trained, step=7)
    expected = logits(trained.eval(), tokenizer)

    out = tmp_path / "exported"
    assert main(["export", str(run_dir), str(out)]) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert summary["step"] == 7 and summary["lora_merged"] == use_lora
    assert not {"optimizer.pt", "trainer_state.json", "adapter_config.json"} & {p.name for p in out.iterdir()}
    exported = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert torch.allclose(logits(exported, AutoTokenizer.from_pretrained(out)), expected, atol=1e-4)
    base_model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    assert not torch.allclose(logits(base_model, tokenizer), expected, atol=1e-4)

    assert main(["export", str(run_dir), str(out)]) == 2
    assert "OUT" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "base"), str(tmp_path / "again")]) == 2
    assert "no complete checkpoint" in capsys.readouterr().err
