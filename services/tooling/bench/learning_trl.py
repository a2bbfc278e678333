"""TRL's side of `zerobubble bench learning`: one GRPOTrainer run, in the TRL environment (.venv-trl), on the
settings the bench hands it as a JSON file. Its last stdout line is a JSON object of what it measured; the
trained weights land in OUT/final.

    .venv-trl/bin/python -m zerobubble.tooling.bench.learning_trl SETTINGS.json

The prompts come already rendered by the project's own prompt builder (chat template and system prompt), with
their token ids: the run stops before training if TRL's tokenizer would read them differently. Rewards come from
the running reward service through the project's TRL adapter (zerobubble.reward.adapters.trl).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from pydantic import Field

from zerobubble.common.config import Schema


class TRLRunSettings(Schema):
    """What every TRL run of a bench is told: the model and prompts, the steps and batch, the optimizer and its
    schedule, and sampling; zerobubble.tooling.bench.learning's docstring says why each value."""

    model: Path
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
    temperature: float = Field(gt=0)
    max_completion_length: int = Field(gt=0)
    torch_threads: int | None


class TRLSettings(TRLRunSettings):
    """The GRPOTrainer run's: its rewards through the project's reward service, and GRPO's loss."""

    answers: list[str]
    reward_url: str
    verifier: str
    num_generations: int = Field(gt=1)
    beta: float = Field(ge=0)
    epsilon_low: float
    epsilon_high: float
    scale_rewards: str
    loss_type: str


def check_tokens(tokenizer, settings: TRLSettings) -> None:
    """TRL tokenizes text prompts itself (as `processing_class(text=...)`): they must come out as the token ids the
    project's builder made."""
    for text, ids in zip(settings.prompts, settings.prompt_ids, strict=True):
        got = tokenizer(text=text)["input_ids"]
        if got != ids:
            raise SystemExit(f"TRL's tokenizer reads the prompt {text!r} as {got}, the project's builder made {ids}")


def checked_tokenizer(settings):
    """The model's tokenizer, once it reads every prompt as the project's builder made it; torch's threads set."""
    import torch
    from transformers import AutoTokenizer

    if settings.torch_threads:
        torch.set_num_threads(settings.torch_threads)
    tokenizer = AutoTokenizer.from_pretrained(settings.model)
    check_tokens(tokenizer, settings)
    return tokenizer


def training_arguments(settings) -> dict:
    """The HF Trainer's arguments both TRL scripts set alike: steps, seed, batch, optimizer and schedule, on CPU."""
    return dict(
        output_dir=str(settings.output_dir), max_steps=settings.steps, seed=settings.seed,
        per_device_train_batch_size=settings.batch_samples, gradient_accumulation_steps=1,
        learning_rate=settings.learning_rate, lr_scheduler_type=settings.lr_scheduler_type,
        lr_scheduler_kwargs=settings.lr_scheduler_kwargs, warmup_steps=settings.warmup_steps,
        weight_decay=settings.weight_decay, adam_beta1=settings.adam_betas[0], adam_beta2=settings.adam_betas[1],
        adam_epsilon=settings.adam_epsilon, optim="adamw_torch",
        # The HF Trainer clips only above 0: 0 is its "no clip", the project's null.
        max_grad_norm=settings.max_grad_norm if settings.max_grad_norm is not None else 0.0,
        logging_steps=10, save_strategy="no", report_to="none", use_cpu=True, bf16=False, dataloader_num_workers=0,
    )


def main(path: str) -> int:
    settings = TRLSettings.model_validate_json(Path(path).read_text())
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from zerobubble.reward.adapters.trl import TRLReward

    tokenizer = checked_tokenizer(settings)
    dataset = Dataset.from_list([{"prompt": prompt, "gt_answer": answer}
                                 for prompt, answer in zip(settings.prompts, settings.answers, strict=True)])
    config = GRPOConfig(
        **training_arguments(settings), num_generations=settings.num_generations, steps_per_generation=1,
        num_iterations=1, beta=settings.beta, epsilon=settings.epsilon_low, epsilon_high=settings.epsilon_high,
        loss_type=settings.loss_type, scale_rewards=settings.scale_rewards, temperature=settings.temperature,
        top_p=1.0, top_k=0, max_completion_length=settings.max_completion_length, mask_truncated_completions=False,
    )
    reward = TRLReward(settings.reward_url, verifier=settings.verifier)
    trainer = GRPOTrainer(model=str(settings.model), reward_funcs=[reward], args=config, train_dataset=dataset,
                          processing_class=tokenizer)
    return train_and_report(trainer, tokenizer, settings.output_dir, settings.batch_samples)


def train_and_report(trainer, tokenizer, output_dir: Path, batch_samples: int) -> int:
    """Trains, saves the final weights in OUTPUT_DIR/final, and prints what the bench reads as the last line."""
    train_started = time.monotonic()
    trainer.train()
    trained = time.monotonic()
    trainer.save_model(str(output_dir / "final"))
    tokenizer.save_pretrained(output_dir / "final")
    print(json.dumps({
        "steps": trainer.state.global_step,
        "samples_trained": trainer.state.global_step * batch_samples,
        "training_seconds": round(trained - train_started, 2),
        "weights": str(output_dir / "final"),
    }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
