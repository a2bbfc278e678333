"""The trainer service's configuration schema (all defaults are here)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from zerobubble.common.config import ClientConfig, ConfigError, Schema, ServerConfig
from zerobubble.trainer.algorithms.presets import AlgorithmConfig
from zerobubble.trainer.lora_config import LoraConfig
from zerobubble.trainer.strategy_config import StrategyConfig
from zerobubble.trainer.sync_config import WeightSyncConfig


class BatchConfig(Schema):
    groups_per_step: int = Field(8, gt=0, description="experience groups consumed by one training step "
                                 "(over all data-parallel ranks)")
    mini_batch_groups: int | None = Field(None, gt=0, description="groups per optimizer update (null: the "
                                          "whole step, one update)")
    micro_batch_samples: int = Field(16, gt=0, description="samples per forward/backward pass (gradients "
                                     "accumulate over a mini-batch)")
    max_tokens_per_micro_batch: int | None = Field(
        None, gt=0, description="cut micro-batches by tokens instead of micro_batch_samples: each holds samples "
        "whose prompt + response tokens (padded length where sequences are not packed) add up to at most this; a "
        "longer sample goes alone (null: by micro_batch_samples)")
    logprob_chunk_tokens: int | None = Field(
        512, gt=0, description="response positions whose logits exist at once: log-probs and entropy come from the "
        "last hidden states through the output projection this many positions at a time, in forward and backward "
        "(null: full logits of every position, the memory of samples x length x vocabulary)")
    packing: bool = Field(True, description="sequences end to end without padding, position ids restarting per "
                          "sample (needs logprob_chunk_tokens, and an attention implementation that keeps packed "
                          "sequences apart: sdpa, eager, flex or flash; otherwise padded, said once in the log)")
    max_new_tokens: int | None = Field(None, gt=0, description="expected run_spec.max_new_tokens (null: the "
                                       "spec's, which the constant loss normalisation and overlong rules use)")
    pull_wait_seconds: float = Field(5.0, gt=0, description="how long one pull waits for groups")
    prefetch: bool = Field(False, description="pull the next step's groups while this step trains (their staleness "
                           "counts from the weights that train them, as without); off: measured on the demo, the "
                           "trainer waited 10 ms a step for its pull, and prefetching did not make it faster")

    @property
    def mini_batches(self) -> int:
        return self.groups_per_step // (self.mini_batch_groups or self.groups_per_step)

    def groups_per_rank(self, world_size: int) -> int:
        """Each data-parallel rank's share of a step; every rank must make the same optimizer updates, so the
        step's groups and each mini-batch's split evenly over the ranks."""
        for name, groups in (("groups_per_step", self.groups_per_step), ("mini_batch_groups", self.mini_batch_groups)):
            if groups is not None and groups % world_size:
                raise ConfigError(f"batch.{name} ({groups}) must be a multiple of the {world_size} trainer processes")
        return self.groups_per_step // world_size

    @model_validator(mode="after")
    def _whole_mini_batches(self) -> BatchConfig:
        if self.mini_batch_groups and self.groups_per_step % self.mini_batch_groups:
            raise ValueError(f"groups_per_step ({self.groups_per_step}) must be a multiple of mini_batch_groups "
                             f"({self.mini_batch_groups})")
        return self


class CheckpointConfig(Schema):
    interval_steps: int = Field(50, gt=0, description="save (and commit to the buffer) every this many steps")
    keep: int = Field(2, gt=0, description="newest checkpoints kept")
    at_end: bool = True


def _installed(package: str, field: str) -> None:
    if importlib.util.find_spec(package) is None:
        raise ValueError(f"needs the {package} package, which `pip install 'zerobubble[tracking]'` brings ({field})")


class WandbConfig(Schema):
    project: str = Field("zerobubble", min_length=1)
    entity: str | None = Field(None, description="team or user (null: the logged-in user's default)")
    name: str | None = Field(None, description="the run's display name (null: wandb picks one)")
    mode: Literal["online", "offline"] | None = Field(
        None, description="offline writes the run under run_dir/wandb for `wandb sync` later, with no network; "
        "null: $WANDB_MODE, else online")


class RolloutLogConfig(Schema):
    interval_steps: int = Field(10, gt=0, description="every this many steps")
    groups: int = Field(2, gt=0, description="experience groups of the step sampled, each with all its responses")
    tokens: bool = Field(True, description="each response's token ids, their text, behaviour log-probs and (where "
                         "the experience has them) loss mask and per-token policy versions, for `zerobubble view`")
    max_tokens: int = Field(4096, gt=0, description="the tokens logged of one response at most (the first ones; "
                            "the row says when it was cut)")


class TrackingConfig(Schema):
    """Where the run's figures go besides metrics.jsonl and /metrics: each step's figures, the pipeline's timing
    (idle fraction, staleness, weight-sync time) and the evaluations, as the user's dashboards read them."""

    tensorboard: bool = Field(False, description="TensorBoard event files in run_dir/tensorboard (runs train and "
                              "eval)")
    wandb: WandbConfig | None = Field(None, description="a Weights & Biases run, {project, entity, name, mode: online "
                                      "or offline} (null: none)")
    rollout_log: RolloutLogConfig | None = Field(
        None, description="{interval_steps: 10, groups: 2}: every interval_steps a sample of the step's prompts, "
        "responses, rewards, advantages, policy versions and tokens to run_dir/rollouts.jsonl, and a wandb table "
        "(null: none)")
    eval_summary: Path | None = Field(None, description="the evaluations' summary.jsonl, whose new results go to "
                                      "TensorBoard and wandb as they appear (zerobubble up sets it)")

    @field_validator("tensorboard")
    @classmethod
    def _tensorboard_installed(cls, value: bool) -> bool:
        if value:
            _installed("tensorboard", "tracking.tensorboard")
        return value

    @field_validator("wandb")
    @classmethod
    def _wandb_installed(cls, value: WandbConfig | None) -> WandbConfig | None:
        if value is not None:
            _installed("wandb", "tracking.wandb")
        return value


class TrainerServiceConfig(Schema):
    server: ServerConfig = ServerConfig(listen="127.0.0.1:50055")
    model: Path = Field(description="the HF-format model folder to start from")
    run_dir: Path = Field(Path("runs/trainer"), description="checkpoints and metrics.jsonl go here")
    resume: bool = Field(False, description="continue from the newest checkpoint in run_dir")
    algorithm: AlgorithmConfig = Field(AlgorithmConfig(), description="a preset plus any field of it to override, "
                                       "e.g. {preset: DAPO, clip_high: 0.3}")
    strategy: StrategyConfig = StrategyConfig()
    lora: LoraConfig | None = Field(
        None, description="train LoRA adapters on a frozen base, {rank, alpha, dropout, target_modules, lr_scale}; "
        "the weight sync then sends only the adapters (null: full fine-tuning)")
    batch: BatchConfig = BatchConfig()
    weight_sync: WeightSyncConfig | None = Field(
        WeightSyncConfig(), description="the broadcast group rollout workers join; null: no weight sync")
    checkpoint: CheckpointConfig = CheckpointConfig()
    tracking: TrackingConfig = TrackingConfig()
    buffer: ClientConfig = ClientConfig(address="127.0.0.1:50053")
    teacher: ClientConfig | None = Field(
        None, description="the teacher service that scores each step's tokens for on-policy distillation "
        "(algorithm.distillation_coef); its tokenizer must name ids as the model's does (null: no teacher)")
    teachers_by_data_source: dict[str, ClientConfig] = Field(
        default_factory=dict, description="data_source -> the teacher service that scores that source's samples "
        "instead of `teacher` (several teachers routed by task, e.g. {gsm8k: {address: ...}, apps: {...}}); each "
        "tokenizer is checked as teacher's is")
    teacher_context: str | None = Field(
        None, description="self-distillation: the teacher scores each sample's tokens after the row's messages with "
        "this text added to the last user message, {answer} replaced by the row's ground-truth answer (e.g. 'The "
        "answer is {answer}.'); with teacher.model.path the student's own folder, the student in the know is its own "
        "teacher (docs/guides/distillation.md); null: the teacher sees the student's prompt")
    max_steps: int | None = Field(None, gt=0, description="stop after this many steps (default: the end of the data)")
    torch_threads: int | None = Field(None, gt=0, description="CPU threads of torch in this process (null: "
                                      "torch's default, all cores); on a shared small machine 1 avoids contention")
    seed: int = 0

    def expectations(self) -> dict[str, tuple[str, object]]:
        """What this config states of the run spec, by spec field (checked against the buffer's at start)."""
        return {"algorithm": ("algorithm.preset", self.algorithm.preset),
                "max_new_tokens": ("batch.max_new_tokens", self.batch.max_new_tokens)}

    @model_validator(mode="after")
    def _teacher_for_distillation(self) -> TrainerServiceConfig:
        if self.algorithm.distillation_coef and self.teacher is None:
            raise ValueError("algorithm.distillation_coef: distillation needs a teacher: set teacher.address (the "
                             "teacher service's HOST:PORT)")
        if self.teacher_context is not None:
            try:
                self.teacher_context.format(answer="")
            except (KeyError, IndexError, ValueError) as exc:
                raise ValueError(f"teacher_context: {exc!r}: the text may name {{answer}} only (write {{{{ and }}}} "
                                 "for braces)") from None
            if self.teacher is None:
                raise ValueError("teacher_context: a context is for a teacher: set teacher.address")
        if self.teachers_by_data_source and self.teacher is None:
            raise ValueError("teachers_by_data_source: the samples of other data sources need a teacher too: set "
                             "teacher.address (the teacher of every source the routes do not name)")
        return self

    @model_validator(mode="after")
    def _valid_lora(self) -> TrainerServiceConfig:
        if self.lora is None:
            return self
        if self.strategy.name != "fsdp":
            raise ValueError(f"lora: needs strategy.name fsdp, not {self.strategy.name}")
        # A folder not made yet (the launcher validates before it builds the model) is checked when it loads.
        if (self.model / "config.json").is_file():
            from zerobubble.trainer.lora import check_target_modules  # torch: only for a config that uses lora

            check_target_modules(self.lora, self.model)
        return self

    def training_strategy(self) -> StrategyConfig:
        """The strategy as training uses it: with lora, the learning rate scaled by lora.lr_scale."""
        if self.lora is None:
            return self.strategy
        optim = self.strategy.optim.model_copy(update={"lr": self.strategy.optim.lr * self.lora.lr_scale})
        return self.strategy.model_copy(update={"optim": optim})
