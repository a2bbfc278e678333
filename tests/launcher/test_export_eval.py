"""`zerobubble export` and `zerobubble eval` on their own: a LoRA checkpoint exported merged into its base, and bad
input refused naming it. (Both run end to end after a real run in tests/e2e/test_up_template.py.)"""

from __future__ import annotations

import json
import shutil

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

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
