"""A short supervised warm start of the tiny model on the arithmetic task, and its accuracy by sampling.

From random weights a policy never writes \\boxed{...}, so reinforcement learning would see only zero
rewards. A few hundred supervised steps on prompt -> "\\boxed{answer}<|im_end|>" teach the format and
some arithmetic, leaving accuracy well below the top so that reinforcement learning has room to show.

Label smoothing leaves the model unsure: its most likely answer is often right, but samples at temperature 1
often break the format or the answer. That is the state reinforcement learning on verifiable rewards improves
in real base models, by sharpening the distribution towards the answers it can already reach (Yue et al. 2025,
"Does reinforcement learning really incentivize reasoning capacity...?"); a 1M-parameter model cannot learn
held-out arithmetic facts from a few minutes of rewards, but sharpening carries over to held-out questions.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from zerobubble.reward.extraction import extract_boxed
from zerobubble.reward.math_judge import judge
from zerobubble.rollout.episodes.render import TurnRenderer
from zerobubble.tooling.tiny.task import TaskRow, chat_messages, filler_lengths, read_task, target_response
from zerobubble.tooling.tiny.tool_use import ToolCallShape, tool_episode

IGNORE_INDEX = -100
# Measured on the default arithmetic task with the "1m" model (see the report of `zerobubble make-tiny-model`).
log = logging.getLogger(__name__)
DEFAULT_STEPS = 300
DEFAULT_LABEL_SMOOTHING = 0.1


@dataclass(frozen=True)
class Example:
    prompt_ids: list[int]
    response_ids: list[int]
    targets: list[int] | None = None      # 1 where a response token is a target; None: every one


def encode_examples(tokenizer, rows: list[TaskRow], system_prompt: str, fillers: list[int] | None = None, *,
                    tool_use: ToolCallShape | None = None, tool_fraction: float = 0.0, seed: int = 0) -> list[Example]:
    """Chat-templated prompt (system + user + generation prompt) and the target response with end of turn, after
    fillers[i] dots for row i (none when None); with `tool_use`, a `tool_fraction` of the rows (chosen by `seed`)
    as a tool-using episode instead."""
    fillers = fillers or [0] * len(rows)
    chosen = random.Random(seed).sample(range(len(rows)), round(tool_fraction * len(rows))) if tool_use else []
    renderer = TurnRenderer(tokenizer, max_observation_tokens=64) if chosen else None
    examples = []
    for row, filler in zip(rows, fillers, strict=True):
        prompt_ids = list(tokenizer.apply_chat_template(chat_messages(row, system_prompt), add_generation_prompt=True,
                                                        tokenize=True, return_dict=False))
        answer = tokenizer(target_response(row.gt_answer, filler), add_special_tokens=False)["input_ids"]
        examples.append(Example(prompt_ids, [*answer, tokenizer.eos_token_id]))
    for index in chosen:
        response, targets = tool_episode(tokenizer, renderer, rows[index], tool_use)
        examples[index] = Example(examples[index].prompt_ids, response, targets)
    return examples


def collate(examples: list[Example], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded batch whose labels count only response tokens."""
    width = max(len(e.prompt_ids) + len(e.response_ids) for e in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((len(examples), width), dtype=torch.long)
    for i, example in enumerate(examples):
        sequence = example.prompt_ids + example.response_ids
        input_ids[i, : len(sequence)] = torch.tensor(sequence)
        targets = torch.tensor(example.response_ids)
        if example.targets is not None:
            targets[torch.tensor(example.targets) == 0] = IGNORE_INDEX
        labels[i, len(example.prompt_ids) : len(sequence)] = targets
        attention_mask[i, : len(sequence)] = 1
    return {"input_ids": input_ids, "labels": labels, "attention_mask": attention_mask}


def warm_start(
    model_dir: Path,
    train_jsonl: Path,
    *,
    steps: int = DEFAULT_STEPS,
    seed: int = 0,
    lr: float = 3e-3,
    batch_size: int = 32,
    label_smoothing: float = DEFAULT_LABEL_SMOOTHING,
    system_prompt: str,
    response_filler: int = 0,
    report_seconds: float = 10.0,
    tool_use: ToolCallShape | None = None,
    tool_fraction: float = 0.0,
) -> dict:
    """Fine-tune the model in model_dir on the task's targets for `steps` AdamW steps; save it in place. With
    `tool_use`, a `tool_fraction` of the examples call the tool and box its answer (tiny/tool_use.py).

    system_prompt: the one the rollout workers will send (empty: none), so the warm start sees their prompts.
    response_filler: targets start with up to this many dots (task.filler_lengths): long, uneven responses.
    A line is logged after the first step and then every `report_seconds` (it takes minutes on a CPU)."""
    model_dir = Path(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    rows = read_task(train_jsonl)
    examples = encode_examples(tokenizer, rows, system_prompt, filler_lengths(len(rows), response_filler, seed),
                               tool_use=tool_use, tool_fraction=tool_fraction, seed=seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    # Short runs end far lower when the rate warms up briefly and then decays to a tenth.
    warmup = max(1, steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min((step + 1) / warmup, 1.0 - 0.9 * max(0, step - warmup) / max(1, steps - warmup))
    )
    generator = torch.Generator().manual_seed(seed)
    losses: list[float] = []
    model.train()
    started = time.perf_counter()
    reported = None
    for step in range(1, steps + 1):
        picks = torch.randint(len(examples), (batch_size,), generator=generator).tolist()
        batch = collate([examples[i] for i in picks], tokenizer.pad_token_id)
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].flatten(0, 1), batch["labels"][:, 1:].flatten(), ignore_index=IGNORE_INDEX,
            label_smoothing=label_smoothing)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        now = time.perf_counter()
        if reported is None or now - reported >= report_seconds or step == steps:
            reported = now
            left = (now - started) / step * (steps - step)
            log.info("warm start: step %d/%d, loss %.3f, about %.0f s left", step, steps, losses[-1], left)
    seconds = time.perf_counter() - started
    model.eval()
    model.save_pretrained(model_dir, safe_serialization=True)
    tail = losses[-max(1, steps // 10) :]
    return {
        "steps": steps,
        "batch_size": batch_size,
        "lr": lr,
        "label_smoothing": label_smoothing,
        "seconds": round(seconds, 3),
        "initial_loss": round(losses[0], 4) if losses else None,
        "final_loss": round(sum(tail) / len(tail), 4) if losses else None,
    }


def evaluate(
    model_dir: Path,
    eval_jsonl: Path,
    *,
    samples_per_prompt: int = 4,
    temperature: float = 1.0,
    max_new_tokens: int = 16,
    batch_size: int = 64,
    seed: int = 0,
    system_prompt: str,
) -> dict:
    """Sample responses to every eval prompt and score them as the `boxed` verifier does.

    accuracy: share of samples whose last \\boxed{} equals the gold; format: share with a \\boxed{} that
    ended their turn within max_new_tokens. temperature 0 means greedy decoding.
    """
    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    rows = read_task(eval_jsonl)
    prompts = [
        tokenizer.apply_chat_template(chat_messages(row, system_prompt), add_generation_prompt=True, tokenize=False)
        for row in rows
        for _ in range(samples_per_prompt)
    ]
    golds = [row.gt_answer for row in rows for _ in range(samples_per_prompt)]
    sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature > 0 else {
        "do_sample": False}
    correct = formatted = 0
    with torch.random.fork_rng(devices=[]), torch.inference_mode():
        torch.manual_seed(seed)
        for start in range(0, len(prompts), batch_size):
            batch = tokenizer(prompts[start : start + batch_size], return_tensors="pt", padding=True,
                              add_special_tokens=False)
            out = model.generate(**batch, max_new_tokens=max_new_tokens, **sampling)
            for gold, new_ids in zip(golds[start : start + batch_size], out[:, batch["input_ids"].shape[1] :],
                                     strict=True):
                ids = new_ids.tolist()
                ended = tokenizer.eos_token_id in ids
                extraction = extract_boxed(tokenizer.decode(ids, skip_special_tokens=True))
                formatted += ended and extraction.format_ok
                correct += extraction.answer is not None and judge(gold, extraction.answer)[0]
    total = len(prompts)
    return {"accuracy": correct / total, "format": formatted / total, "samples": total,
            "temperature": temperature}

