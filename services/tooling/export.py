"""`zerobubble export RUN_DIR OUT`: the run's final policy as a clean Hugging Face folder (weights, config,
tokenizer; a LoRA run's adapter merged into its base), without optimizer, scheduler or RNG state, for any tool
that loads HF models."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from zerobubble.common.config import ConfigError
from zerobubble.common.lora_adapter import is_peft_adapter
from zerobubble.trainer.checkpoints import STATE_FILE, latest_checkpoint

PROVENANCE_FILE = "zerobubble-export.json"


def export_policy(run_dir: Path, out: Path) -> dict:
    """Writes the policy of `run_dir`'s latest complete checkpoint into `out` (new or empty); what was exported."""
    checkpoint = latest_checkpoint(run_dir / "trainer" / "checkpoints")
    if checkpoint is None:
        raise ConfigError(f"RUN_DIR: {run_dir} has no complete checkpoint (in {run_dir / 'trainer' / 'checkpoints'})")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"OUT: {out} exists and is not an empty folder")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if is_peft_adapter(checkpoint):
        from peft import AutoPeftModelForCausalLM

        model = AutoPeftModelForCausalLM.from_pretrained(checkpoint).merge_and_unload()
    else:
        model = AutoModelForCausalLM.from_pretrained(checkpoint)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(checkpoint).save_pretrained(out)
    state = json.loads((checkpoint / STATE_FILE).read_text())
    exported = {"run_dir": str(run_dir), "checkpoint": str(checkpoint), "step": state["step"],
                "policy_version": state["policy_version"], "lora_merged": is_peft_adapter(checkpoint)}
    (out / PROVENANCE_FILE).write_text(json.dumps(exported, indent=1) + "\n")
    return exported


def cmd_export(args) -> int:
    try:
        exported = export_policy(args.run_dir, args.out)
    except ConfigError as exc:
        print(f"zerobubble export: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({**exported, "out": str(args.out)}))
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser("export", help="write a run's final policy as a Hugging Face model folder")
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    parser.add_argument("out", type=Path, metavar="OUT", help="a new (or empty) folder")
    parser.set_defaults(run=cmd_export)
