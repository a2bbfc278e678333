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

import sys
from pathlib import Path

from pydantic import Field

from zerobubble.tooling.bench.learning_trl import (
    TRLRunSettings,
    checked_tokenizer,
    train_and_report,
    training_arguments,
)


class DistillSettings(TRLRunSettings):
    """The DistillationTrainer run's: its teacher and the divergence; zerobubble.tooling.bench.distill's docstring
    says why each value."""

    teacher: Path
    beta: float = Field(ge=0, le=1)


def main(path: str) -> int:
    settings = DistillSettings.model_validate_json(Path(path).read_text())
    from datasets import Dataset
    from trl import DistillationConfig, DistillationTrainer

    tokenizer = checked_tokenizer(settings)
    dataset = Dataset.from_list([{"prompt": prompt} for prompt in settings.prompts])
    config = DistillationConfig(
        **training_arguments(settings), beta=settings.beta, temperature=settings.temperature, top_p=1.0, top_k=0,
        max_completion_length=settings.max_completion_length, gradient_checkpointing=False,
    )
    trainer = DistillationTrainer(model=str(settings.model), teacher_model=str(settings.teacher), args=config,
                                  train_dataset=dataset, processing_class=tokenizer)
    return train_and_report(trainer, tokenizer, settings.output_dir, settings.batch_samples)

if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
