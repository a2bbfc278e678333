"""CLI subcommands: `zerobubble make-tiny-model` and `zerobubble make-task`."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from zerobubble.tooling.tiny.model import SIZES

TASKS = ("arithmetic",)


def _threads(args) -> None:
    # On a shared machine one intra-op thread per process is many times faster than spinning on busy cores.
    if args.threads:
        torch.set_num_threads(args.threads)


def cmd_make_tiny_model(args) -> int:
    from transformers import AutoModelForCausalLM

    from zerobubble.tooling.tiny.model import make_tiny_model, parameter_count
    from zerobubble.tooling.tiny.warm_start import evaluate, warm_start

    _threads(args)
    started = time.perf_counter()
    out_dir = make_tiny_model(args.dir, size=args.size, seed=args.seed)
    report = {
        "model_dir": str(out_dir),
        "size": args.size,
        "seed": args.seed,
        "parameters": parameter_count(AutoModelForCausalLM.from_pretrained(out_dir)),
        "make_seconds": round(time.perf_counter() - started, 3),
    }
    if args.warm_start_task is not None:
        shape = None
        if args.warm_start_tool_fraction:
            from zerobubble.tooling.tiny.tool_use import ToolCallShape

            shape = ToolCallShape(args.warm_start_tool_call, args.warm_start_tool_name)
        report["warm_start"] = warm_start(out_dir, args.warm_start_task / "train.jsonl", steps=args.warm_start_steps,
                                          seed=args.seed, label_smoothing=args.warm_start_label_smoothing,
                                          system_prompt=args.system_prompt, tool_use=shape,
                                          tool_fraction=args.warm_start_tool_fraction)
        eval_jsonl = args.warm_start_task / "eval.jsonl"
        if args.eval_samples > 0 and eval_jsonl.is_file():
            started = time.perf_counter()
            figures = evaluate(out_dir, eval_jsonl, samples_per_prompt=args.eval_samples, temperature=1.0,
                               max_new_tokens=args.max_new_tokens, seed=args.seed,
                               system_prompt=args.system_prompt)
            report["eval"] = {**figures, "seconds": round(time.perf_counter() - started, 3)}
    print(json.dumps(report), flush=True)
    return 0


def cmd_make_task(args) -> int:
    from zerobubble.tooling.tiny.task import make_arithmetic_task

    train, held_out = make_arithmetic_task(args.dir, train_size=args.train_size, eval_size=args.eval_size,
                                           seed=args.seed, max_operand=args.max_operand,
                                           operations=args.operations, operands=args.operands)
    print(json.dumps({"task": args.task, "train": str(train), "eval": str(held_out),
                      "train_size": args.train_size, "eval_size": args.eval_size}), flush=True)
    return 0


def register(subparsers) -> None:
    from zerobubble.rollout.prompting import SYSTEM_PROMPTS
    from zerobubble.tooling.tiny.task import (
        DEFAULT_EVAL_SIZE,
        DEFAULT_MAX_OPERAND,
        DEFAULT_OPERANDS,
        DEFAULT_OPERATIONS,
        DEFAULT_TRAIN_SIZE,
    )
    from zerobubble.tooling.tiny.warm_start import DEFAULT_LABEL_SMOOTHING, DEFAULT_STEPS

    model = subparsers.add_parser("make-tiny-model", help="write a tiny Qwen2-architecture model and tokenizer")
    model.add_argument("dir", type=Path, help="output folder (HF format)")
    model.add_argument("--size", default="2m", choices=list(SIZES), help="parameter-count preset")
    model.add_argument("--seed", type=int, default=0, help="weights (and warm-start order) depend on it only")
    model.add_argument("--warm-start-task", type=Path, metavar="TASK_DIR",
                       help="fine-tune on TASK_DIR/train.jsonl, then measure accuracy on TASK_DIR/eval.jsonl")
    model.add_argument("--warm-start-steps", type=int, default=DEFAULT_STEPS, help="supervised steps")
    model.add_argument("--warm-start-label-smoothing", type=float, default=DEFAULT_LABEL_SMOOTHING,
                       help="label smoothing of the warm start (leaves the model unsure, for RL to sharpen)")
    model.add_argument("--system-prompt", default=SYSTEM_PROMPTS["boxed"],
                       help="the system prompt the rollout workers will send ('' for none; default: the reference's "
                       "for the boxed verifier, which they send unless rollout.reward.system_prompt says otherwise)")
    # As `up`'s tiny_model.warm_start_tool_use (the tool demo): a model that sometimes calls the tool, for RL to teach.
    model.add_argument("--warm-start-tool-fraction", type=float, default=0.0, metavar="FRACTION",
                       help="share of warm-start examples that call a tool and box its answer (0: none)")
    model.add_argument("--warm-start-tool-call", default="@calculator({expression})",
                       help="how those examples write the call; {expression} is the question without its '='")
    model.add_argument("--warm-start-tool-name", default="calculator", help="the tool whose answer they show")
    model.add_argument("--eval-samples", type=int, default=4, help="samples per eval prompt (0 skips the eval)")
    model.add_argument("--max-new-tokens", type=int, default=16, help="eval response length limit")
    model.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0 keeps torch's default)")
    model.set_defaults(run=cmd_make_tiny_model)

    task = subparsers.add_parser("make-task", help="write a synthetic task: train.jsonl and held-out eval.jsonl")
    task.add_argument("task", choices=TASKS)
    task.add_argument("dir", type=Path, help="output folder")
    task.add_argument("--train-size", type=int, default=DEFAULT_TRAIN_SIZE)
    task.add_argument("--eval-size", type=int, default=DEFAULT_EVAL_SIZE)
    task.add_argument("--max-operand", type=int, default=DEFAULT_MAX_OPERAND, help="operands are 0..N")
    task.add_argument("--operations", default=DEFAULT_OPERATIONS, help="the operators questions use: +, - or +-")
    task.add_argument("--operands", type=int, default=DEFAULT_OPERANDS, help="numbers per question")
    task.add_argument("--seed", type=int, default=0)
    task.set_defaults(run=cmd_make_task)


def build_parser() -> argparse.ArgumentParser:
    """A parser with only these subcommands (the `zerobubble` command adds them to its own)."""
    parser = argparse.ArgumentParser(prog="zerobubble")
    register(parser.add_subparsers(dest="command", required=True))
    return parser
