"""Colossal-RL's rl_example.py flags, accepted by `zerobubble up` and mapped onto its configuration.

Each flag names the field of UpConfig it sets (dotted); the README's table is this list.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ReferenceFlag:
    flags: tuple[str, ...]
    target: str                     # dotted UpConfig field
    type: Callable[[str], Any]
    help: str
    metavar: str | None = None      # what --help shows for the value; default: the field's own name

    @property
    def placeholder(self) -> str:
        return self.metavar or self.target.rpartition(".")[2].upper()


def _eval_path(text: str) -> str:
    """A path, or the reference's JSON object of name -> path (its first path is taken)."""
    if text.lstrip().startswith("{"):
        return next(iter(json.loads(text).values()))
    return text


FLAGS = (
    ReferenceFlag(("-m", "--model"), "model", str, "HF model folder"),
    ReferenceFlag(("-d", "--dataset"), "train_data", str, "training JSONL"),
    ReferenceFlag(("-ed", "--eval-dataset"), "eval_data", _eval_path,
                  "held-out JSONL (the reference's JSON of name:path takes its first path)"),
    ReferenceFlag(("-p", "--project"), "run_dir", lambda name: f"runs/{name}", "run folder runs/NAME", "NAME"),
    ReferenceFlag(("-e", "--num-episodes"), "buffer.prompts.epochs", int, "passes over the data"),
    ReferenceFlag(("-i", "--num-inferencer"), "pipeline.rollout_workers", int, "rollout workers"),
    ReferenceFlag(("-g", "--num-generations"), "run.num_generations", int, "responses per prompt"),
    ReferenceFlag(("-ibs", "--inference-batch-size"), "rollout.generation.prompts_per_batch", int,
                  "prompts leased and generated together"),
    ReferenceFlag(("-tbs", "--train-batch-size"), "trainer.batch.groups_per_step", int,
                  "prompts (groups) per training step"),
    ReferenceFlag(("-tMbs", "--train-minibatch-size"), "trainer.batch.mini_batch_groups", int,
                  "groups per optimizer update"),
    ReferenceFlag(("-tmbs", "--train-microbatch-size"), "trainer.batch.micro_batch_samples", int,
                  "samples per forward/backward pass"),
    ReferenceFlag(("-b", "--backend"), "rollout.model.engine", str, "transformers or vllm"),
    ReferenceFlag(("-temp", "--temperature"), "run.sampling.temperature", float, "sampling temperature"),
    ReferenceFlag(("-topk", "--top-k"), "rollout.generation.top_k", int, "top-k (-1 off)"),
    ReferenceFlag(("-topp", "--top-p"), "rollout.generation.top_p", float, "top-p"),
    ReferenceFlag(("-s", "--system-prompt"), "rollout.reward.system_prompt", str, "system prompt"),
    ReferenceFlag(("-mnt", "--max-new-tokens"), "run.max_new_tokens", int, "response limit"),
    ReferenceFlag(("-mpt", "--max-prompt-tokens"), "run.max_prompt_tokens", int, "prompt limit"),
    ReferenceFlag(("-a", "--algo"), "run.algorithm", str,
                  "GRPO, DAPO, RLOO, REINFORCE_PPB, DR_GRPO or GSPO"),
    ReferenceFlag(("-lr", "--learning-rate"), "trainer.strategy.optim.lr", float, "learning rate"),
    ReferenceFlag(("-kl", "--kl-coeff"), "trainer.algorithm.beta", float, "KL coefficient (0: no reference model)"),
    ReferenceFlag(("-rt", "--reward-type"), "run.verifier", str, "boxed, think_answer_tags or code"),
    ReferenceFlag(("-ei", "--eval-interval"), "rollout.eval.interval", int, "evaluate every N policy versions"),
    ReferenceFlag(("-si", "--save-interval"), "trainer.checkpoint.interval_steps", int, "steps between checkpoints"),
    ReferenceFlag(("-sd", "--save-dir"), "run_dir", str, "run folder (checkpoints go to RUN/trainer/checkpoints)"),
    ReferenceFlag(("-t", "--num-trainers"), "trainer_processes", int,
                  "data-parallel trainer processes (ranks under torchrun)"),
)


def add_reference_flags(parser) -> None:
    group = parser.add_argument_group("Colossal-RL rl_example.py flags (mapped onto the configuration)")
    for flag in FLAGS:
        group.add_argument(*flag.flags, dest=_dest(flag), type=flag.type, default=None, metavar=flag.placeholder,
                           help=f"{flag.help} [{flag.target}]")


def _dest(flag: ReferenceFlag) -> str:
    return "ref_" + flag.flags[-1].lstrip("-").replace("-", "_")


def reference_overrides(args) -> dict[str, Any]:
    """Dotted UpConfig fields -> values, for the flags given on the command line."""
    out = {}
    for flag in FLAGS:
        value = getattr(args, _dest(flag))
        if value is not None:
            out[flag.target] = value
    return out


def reference_flags(args) -> dict[str, str]:
    """Dotted UpConfig fields -> the flag that set it, for the flags given on the command line."""
    return {flag.target: flag.flags[0] for flag in FLAGS if getattr(args, _dest(flag)) is not None}


def markdown_table() -> str:
    rows = ["| rl_example.py flag | `zerobubble up` setting | meaning |", "|---|---|---|"]
    rows += [f"| `{' / '.join(f.flags)}` | `{f.target}` | {f.help} |" for f in FLAGS]
    return "\n".join(rows)
