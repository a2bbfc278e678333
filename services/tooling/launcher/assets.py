"""The model and data a run starts from: the user's, or the tiny model and arithmetic task made here
(cached by their settings, so a second run starts at once)."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from zerobubble.common.data_spec import DataSpec
from zerobubble.rollout.prompting import system_prompt
from zerobubble.tooling.launcher.config import TinyModel, UpConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunAssets:
    model: Path
    train: Path
    eval: Path | None
    teacher: Path | None = None   # a teacher made here (tiny_teacher)


def prepare_assets(config: UpConfig, cache: Path) -> RunAssets:
    task = config.task
    train, held_out = config.train_data, config.eval_data
    if train is None:
        from zerobubble.tooling.tiny.task import make_arithmetic_task

        task_dir = cache / (f"arithmetic-{task.train_size}-{task.eval_size}-{task.seed}"
                            f"-{task.max_operand}{task.operations}x{task.operands}")
        if not (task_dir / "eval.jsonl").exists():
            make_arithmetic_task(task_dir, train_size=task.train_size, eval_size=task.eval_size, seed=task.seed,
                                 max_operand=task.max_operand, operations=task.operations, operands=task.operands)
        train = task_dir / "train.jsonl"
        held_out = held_out or task_dir / "eval.jsonl"
    model = config.model
    if model is None:
        model = _tiny_model(config, config.tiny_model, train, cache)
    teacher = None
    if config.tiny_teacher is not None and not (config.teacher.get("model") or {}).get("path"):
        teacher = _tiny_model(config, config.tiny_teacher, train, cache)
    return RunAssets(model=model, train=train, eval=held_out, teacher=teacher)


def _task_rows(config: UpConfig, train: Path, path: Path) -> Path:
    """The user's math rows, in whatever form the buffer reads them, as the task's JSONL that the warm start reads."""
    from zerobubble.common.data import load_data

    data = load_data(DataSpec(path=train, **config.prompts_reading("split", "columns", "skip_bad_rows")),
                     field="buffer.prompts", default_split="train")
    with open(path, "w", encoding="utf-8") as out:
        for row in data:
            if row.gt_answer is not None:
                out.write(json.dumps({"messages": json.loads(row.messages_json), "gt_answer": row.gt_answer}) + "\n")
    return path


def _tiny_model(config: UpConfig, tiny: TinyModel, train: Path, cache: Path) -> Path:
    import torch

    from zerobubble.tooling.tiny.model import make_tiny_model
    from zerobubble.tooling.tiny.tool_use import ToolCallShape
    from zerobubble.tooling.tiny.warm_start import warm_start

    # The warm start trains on the prompts the workers will send: the boxed verifier's system prompt unless the
    # run sets its own.
    prompt = system_prompt("boxed", config.rollout.get("reward", {}).get("system_prompt"))
    tool_use = tiny.warm_start_tool_use
    tools = "" if tool_use is None else \
        f"-tools{hashlib.sha256(tool_use.model_dump_json().encode()).hexdigest()[:8]}"
    directory = cache / (f"tiny-{tiny.size}-seed{tiny.seed}-warm{tiny.warm_start_steps}"
                         f"-ls{tiny.warm_start_label_smoothing:g}-sys{hashlib.sha256(prompt.encode()).hexdigest()[:8]}"
                         f"{tools}{f'-filler{tiny.response_filler}' if tiny.response_filler else ''}"
                         f"-{train.parent.name}")
    if (directory / "ready.json").exists():
        return directory
    partial = directory.with_name(directory.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    log.info("making the tiny model (%s) in %s", tiny.size, directory)
    make_tiny_model(partial, size=tiny.size, seed=tiny.seed)
    figures = {}
    if config.pipeline.torch_threads:
        torch.set_num_threads(config.pipeline.torch_threads)
    if tiny.warm_start_steps:
        log.info("warm start: %d supervised steps on %s", tiny.warm_start_steps, train)
        rows = train if config.train_data is None else _task_rows(config, train, partial / "warm-start.jsonl")
        shape = None if tool_use is None else ToolCallShape(tool_use.call, tool_use.tool_name)
        figures = warm_start(partial, rows, steps=tiny.warm_start_steps, seed=tiny.seed,
                             label_smoothing=tiny.warm_start_label_smoothing, system_prompt=prompt,
                             tool_use=shape, tool_fraction=0.0 if tool_use is None else tool_use.fraction,
                             response_filler=tiny.response_filler)
    (partial / "ready.json").write_text(json.dumps(figures, default=str))
    shutil.rmtree(directory, ignore_errors=True)
    partial.rename(directory)
    return directory
