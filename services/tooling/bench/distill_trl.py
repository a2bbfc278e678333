"""TRL's side of `zerobubble bench distill`: one DistillationTrainer run (TRL's on-policy distillation: the student
samples, the teacher's whole next-token distribution at each position is the target, beta 1 the reverse KL), in the
TRL environment (.venv-trl), on the settings the bench hands it as a JSON file. Its last stdout line is a JSON
object of what it measured; the trained weights land in OUT/final.

    .venv-trl/bin/python -m zerobubble.tooling.bench.distill_trl SETTINGS.json

The prompts come already rendered by the project's own prompt builder, with their token ids: the run stops before
training if TRL's tokenizer would read them differently. No reward: distillation alone, as the teacher is the
signal.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from pydantic import Field

from zerobubble.common.config import Schema
from zerobubble.tooling.bench.learning_trl import check_tokens


class DistillSettings(Schema):
    """What the bench decides for the TRL run; zerobubble.tooling.bench.distill's docstring says why each value."""

    model: Path
    teacher: Path
    output_dir: Path
    prompts: list[str] = Field(min_length=1)
    prompt_ids: list[list[int]]
    steps: int = Field(gt=0)
    seed: int
    batch_samples: int = Field(gt=0)
    learning_rate: float = Field(gt=0)
    lr_scheduler_type: str
    lr_scheduler_kwargs: dict[str, float]
    warmup_steps: int = Field(ge=0)
    weight_decay: float = Field(ge=0)
    adam_betas: tuple[float, float]
    adam_epsilon: float = Field(gt=0)
    max_grad_norm: float | None
    beta: float = Field(ge=0, le=1)
    temperature: float = Field(gt=0)
    max_completion_length: int = Field(gt=0)
    torch_threads: int | None


def main(path: str) -> int:
    settings = DistillSettings.model_validate_json(Path(path).read_text())
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import DistillationConfig, DistillationTrainer

    if settings.torch_threads:
        torch.set_num_threads(settings.torch_threads)
    tokenizer = AutoTokenizer.from_pretrained(settings.model)
    check_tokens(tokenizer, settings)
    dataset = Dataset.from_list([{"prompt": prompt} for prompt in settings.prompts])
    config = DistillationConfig(
        output_dir=str(settings.output_dir), max_steps=settings.steps, seed=settings.seed,
        per_device_train_batch_size=settings.batch_samples, gradient_accumulation_steps=1,
        learning_rate=settings.learning_rate, lr_scheduler_type=settings.lr_scheduler_type,
        lr_scheduler_kwargs=settings.lr_scheduler_kwargs, warmup_steps=settings.warmup_steps,
        weight_decay=settings.weight_decay, adam_beta1=settings.adam_betas[0], adam_beta2=settings.adam_betas[1],
        adam_epsilon=settings.adam_epsilon, optim="adamw_torch",
        max_grad_norm=settings.max_grad_norm if settings.max_grad_norm is not None else 0.0,
        beta=settings.beta, temperature=settings.temperature, top_p=1.0, top_k=0,
        max_completion_length=settings.max_completion_length, gradient_checkpointing=False,
        logging_steps=10, save_strategy="no", report_to="none", use_cpu=True, bf16=False,
        dataloader_num_workers=0,
    )
    trainer = DistillationTrainer(model=str(settings.model), teacher_model=str(settings.teacher), args=config,
                                  train_dataset=dataset, processing_class=tokenizer)
    train_started = time.monotonic()
    trainer.train()
    trained = time.monotonic()
    trainer.save_model(str(settings.output_dir / "final"))
    tokenizer.save_pretrained(settings.output_dir / "final")
    print(json.dumps({
        "steps": trainer.state.global_step,
        "samples_trained": trainer.state.global_step * settings.batch_samples,
        "training_seconds": round(trained - train_started, 2),
        "weights": str(settings.output_dir / "final"),
    }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
