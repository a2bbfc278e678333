"""`zerobubble export RUN_DIR OUT`: the run's newest checkpoint as a plain Hugging Face model folder, loadable by
`from_pretrained` anywhere: the weights (a LoRA adapter merged into its base), the model's config, tokenizer and
generation files, and none of the training state (optimizer, scheduler, RNG, trainer state)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml

from zerobubble.common.config import ConfigError

# What a checkpoint holds for resuming, not for using the model.
TRAINING_STATE = {"optimizer.pt", "scheduler.pt", "rng.pt", "trainer_state.json"}
ADAPTER_FILES = {"adapter_config.json", "adapter_model.safetensors", "adapter_model.bin"}


def export(run_dir: Path, out: Path) -> dict:
    from zerobubble.trainer.checkpoints import STATE_FILE, latest_checkpoint

    checkpoint = latest_checkpoint(run_dir / "trainer" / "checkpoints")
    if checkpoint is None:
        raise ConfigError(f"RUN_DIR: {run_dir} has no complete checkpoint (trainer/checkpoints/step-*)")
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"OUT: {out} is not empty; give a new folder")
    state = json.loads((checkpoint / STATE_FILE).read_text())
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    lora = (checkpoint / "adapter_config.json").exists()
    skip = TRAINING_STATE | ADAPTER_FILES
    for path in checkpoint.iterdir():
        if path.is_file() and path.name not in skip:
            shutil.copy2(path, partial / path.name)
    if lora:
        _merge_adapter(checkpoint, _base_model(run_dir), partial)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists():
        out.rmdir()
    partial.rename(out)
    return {"out": str(out), "checkpoint": str(checkpoint), "step": state["step"],
            "policy_version": state["policy_version"], "lora_merged": lora}


def _base_model(run_dir: Path) -> Path:
    """The base model the run's trainer loaded (what the adapter was trained on)."""
    path = run_dir / "configs" / "trainer.yaml"
    try:
        return Path(yaml.safe_load(path.read_text())["model"])
    except (OSError, KeyError, TypeError) as exc:
        raise ConfigError(f"RUN_DIR: the base model of the adapter is named in {path}, which cannot be read: "
                          f"{exc}") from None


def _merge_adapter(checkpoint: Path, base: Path, out: Path) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, checkpoint).merge_and_unload()
    merged.save_pretrained(out, safe_serialization=True)


def cmd_export(args) -> int:
    print(json.dumps(export(args.run_dir, args.out)), flush=True)
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser("export", help="write a run's newest checkpoint as a Hugging Face model folder "
                                   "(LoRA merged, no optimizer state)")
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    parser.add_argument("out", type=Path, metavar="OUT", help="a new folder")
    parser.set_defaults(run=cmd_export)
