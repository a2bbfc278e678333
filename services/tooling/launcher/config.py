"""`zerobubble up`: one run of the whole pipeline on this machine, and the service configs it derives.

Each fact of a run has one home. The facts several services must agree on (the algorithm, group size, response
and prompt limits, the staleness bound, dynamic sampling, sampling temperature, verifier routing) are the `run`
section, the run spec the buffer serves; each service section takes any other field of that service's schema and
is checked against it on load. A key that states a run fact anywhere else is refused, naming its home.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from zerobubble.common.config import ConfigError, Schema, describe_errors, key_tree, load_config
from zerobubble.common.run_spec import RunSpec
from zerobubble.tooling.tiny.shapes import SIZES

# A routed data source names its teacher's process, config and log files.
TEACHER_SOURCE = re.compile(r"[A-Za-z0-9._-]{1,64}")

# Keys that once stated a run fact outside `run`, and the key that is its home now. The services' own configs keep
# their optional expectations of the spec (checked against the buffer's when they start on separate hosts); in a
# run of `up` the spec is written once and handed to every service.
MOVED_KEYS = {
    "pipeline.num_generations": "run.num_generations",
    "pipeline.max_new_tokens": "run.max_new_tokens",
    "pipeline.max_staleness": "run.max_staleness",
    "trainer.algorithm.preset": "run.algorithm",
    "trainer.batch.max_new_tokens": "run.max_new_tokens",
    "rollout.generation.num_generations": "run.num_generations",
    "rollout.generation.max_new_tokens": "run.max_new_tokens",
    "rollout.generation.max_prompt_tokens": "run.max_prompt_tokens",
    "rollout.reward.verifier": "run.verifier",
    "buffer.run_spec": "run",
}


class ToolUseWarmStart(Schema):
    fraction: float = Field(gt=0, le=1, description="the share of warm-start examples that call the tool and box "
                            "its answer; the others answer directly")
    call: str = Field("@calculator({expression})", description="how the model writes the call (in the tool "
                      "format its environment parses); {expression} stands for the question without its '='")
    tool_name: str = Field("calculator", description="the tool whose answer the transcripts show")


class TinyModel(Schema):
    size: str = Field("1m", description="preset of `zerobubble make-tiny-model`: " + ", ".join(SIZES))
    seed: int = 0
    warm_start_steps: int = Field(300, ge=0, description="supervised steps before RL (0: none)")
    warm_start_label_smoothing: float = Field(
        0.1, ge=0, lt=1, description="label smoothing of the warm start: leaves the model unsure, for RL to sharpen")
    warm_start_tool_use: ToolUseWarmStart | None = Field(
        None, description="some warm-start examples call a tool and box its answer (null: none): a model that "
        "sometimes uses the tool, for RL to teach using it")
    response_filler: int = Field(0, ge=0, description="warm-start answers start with up to this many dots, lengths "
                                 "spread as real answers' are: long, uneven responses (`zerobubble bench in-flight`)")

    @field_validator("size")
    @classmethod
    def _known_size(cls, value: str) -> str:
        if value not in SIZES:
            raise ValueError(f"unknown preset {value!r}; known: {', '.join(SIZES)}")
        return value


class ArithmeticTask(Schema):
    train_size: int = Field(150, gt=0)
    eval_size: int = Field(50, gt=0)
    seed: int = 0
    max_operand: int = Field(9, ge=1, description="operands are 0..max_operand")
    operations: str = Field("+-", pattern=r"^[+-]+$", description="the operators questions use: +, - or both")
    operands: int = Field(2, ge=2, le=6, description="numbers per question, worked left to right")

    @model_validator(mode="after")
    def _enough_questions(self):
        distinct = (self.max_operand + 1) ** self.operands * len(set(self.operations)) ** (self.operands - 1)
        if self.train_size + self.eval_size > distinct:
            raise ValueError(f"train_size + eval_size = {self.train_size + self.eval_size} exceeds the {distinct} "
                             f"distinct questions of {self.operands} operands with max_operand {self.max_operand} "
                             f"and operations {self.operations!r}")
        return self


class PipelineConfig(Schema):
    """How this machine runs the services (the run's facts are `run`)."""

    rollout_workers: int = Field(1, gt=0)
    torch_threads: int | None = Field(1, gt=0, description="torch CPU threads of each process (warm start, "
                                      "trainer, workers); null: torch's default. Several processes share the "
                                      "cores, and oversubscribed torch threads slow each other down many times")


class RestartsConfig(Schema):
    max_per_service: int = Field(3, ge=0, description="times a service that dies is started again before the run "
                                 "stops (0: the first death stops it)")
    backoff_seconds: float = Field(1.0, gt=0, description="pause before a service's first restart; it doubles "
                                   "with each further one")
    max_backoff_seconds: float = Field(30.0, gt=0, description="the longest pause before a restart")

    def pause_before(self, restart: int) -> float:
        """Seconds to wait before a service's `restart`-th restart (1 is the first)."""
        return min(self.max_backoff_seconds, self.backoff_seconds * 2 ** (restart - 1))


class UpConfig(Schema):
    run_dir: Path = Field(Path("runs/demo"), description="everything the run writes")
    model: Path | None = Field(None, description="an HF model folder; null: make the tiny model (cached)")
    tiny_model: TinyModel = TinyModel()
    tiny_teacher: TinyModel | None = Field(
        None, description="a teacher the run makes here, as it makes the tiny model (warm-started further than the "
        "student, for distillation on the arithmetic task); the teacher service serves it unless teacher.model.path "
        "names a model of your own")
    train_data: Path | None = Field(None, description="training data (JSONL, JSON, parquet or a datasets folder; "
                                    "buffer.prompts sets its split and columns); null: make the arithmetic task")
    eval_data: Path | None = Field(None, description="held-out data, read with the training data's columns; null: "
                                   "the arithmetic task's")
    task: ArithmeticTask = ArithmeticTask()
    run: RunSpec = Field(RunSpec(), description="the facts every service of the run agrees on (the buffer serves "
                         "them as the run spec); model.* is read from the model folder unless set")
    pipeline: PipelineConfig = PipelineConfig()
    trainer_processes: int = Field(1, gt=0, description="data-parallel trainer ranks on this machine, under "
                                   "torchrun (gloo on CPU, NCCL on GPUs); rank 0 serves the trainer's RPCs")
    startup_timeout_seconds: float = Field(300.0, gt=0)
    restarts: RestartsConfig = RestartsConfig()
    final_eval: bool = Field(True, description="evaluate the last checkpoint after training")
    reward: dict[str, Any] = Field(default_factory=dict, description="fields of the reward service config")
    buffer: dict[str, Any] = Field(default_factory=dict, description="fields of the buffer service config")
    trainer: dict[str, Any] = Field(default_factory=dict, description="fields of the trainer service config")
    rollout: dict[str, Any] = Field(default_factory=dict, description="fields of every rollout worker's config")
    environment: dict[str, Any] = Field(default_factory=dict, description="fields of the environment service "
                                        "config; the service is started (and restarted like the others) only when "
                                        "this section lists `environments`")
    teacher: dict[str, Any] = Field(default_factory=dict, description="fields of the teacher service config; the "
                                    "service is started (and restarted like the others) only when this section "
                                    "gives model.path, and the trainer scores its steps with it (on-policy "
                                    "distillation: run.algorithm DISTILL, or trainer.algorithm.distillation_coef)")
    teachers_by_data_source: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="data_source -> fields of a teacher service config (model.path at least) "
        "for that source's samples: the run starts one more teacher service for each (teacher-SOURCE) and the trainer "
        "scores that source's samples with it (trainer.teachers_by_data_source); every other source's samples go to "
        "the run's teacher")

    @model_validator(mode="before")
    @classmethod
    def _one_home_per_fact(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for old, new in MOVED_KEYS.items():
                if _has_key(data, old):
                    raise ValueError(f"{old} states a fact of the whole run: set {new} instead")
        return data

    @model_validator(mode="after")
    def _sections_fit_their_services(self):
        problems = []
        for name, (schema, required) in _service_schemas().items():
            try:
                schema.model_validate(merge(required, getattr(self, name)))
            except ValidationError as exc:
                problems += describe_errors(exc, schema, prefix=f"{name}.")
        from zerobubble.teacher.config import TeacherServiceConfig

        for source, section in self.teachers_by_data_source.items():
            if not TEACHER_SOURCE.fullmatch(source):
                problems.append(f"teachers_by_data_source.{source}: a data source routed to a teacher of its own names "
                                "its service (teacher-SOURCE): letters, digits, '.', '_' and '-' only")
                continue
            try:
                TeacherServiceConfig.model_validate(section)
            except ValidationError as exc:
                problems += describe_errors(exc, TeacherServiceConfig, prefix=f"teachers_by_data_source.{source}.")
        if problems:
            raise ValueError("\n".join(problems))
        return self

    @model_validator(mode="after")
    def _episodes_have_their_environments(self):
        wanted = self.run.episodes.environments()
        listed = [entry.get("name") for entry in self.environment.get("environments") or [] if isinstance(entry, dict)]
        if missing := [name for name in wanted if name not in listed]:
            raise ValueError(f"run.episodes plays rows in {', '.join(map(repr, missing))}, which environment."
                             f"environments does not list (it lists: {', '.join(map(str, listed)) or 'nothing'})")
        return self

    @model_validator(mode="after")
    def _distillation_has_a_teacher(self):
        from zerobubble.trainer.algorithms.presets import AlgorithmConfig  # torch-free

        algorithm = AlgorithmConfig.model_validate({"preset": self.run.algorithm, **self.trainer.get("algorithm", {})})
        if self.teachers_by_data_source and not self.runs_teacher and "teacher" not in self.trainer:
            raise ValueError("teachers_by_data_source: the samples of every other data source need the run's teacher "
                             "too: set teacher.model.path, tiny_teacher, or trainer.teacher.address")
        if algorithm.distillation_coef and not self.runs_teacher and "teacher" not in self.trainer:
            raise ValueError(f"run.algorithm {self.run.algorithm} with distillation_coef "
                             f"{algorithm.distillation_coef:g} distils from a teacher: set teacher.model.path (a "
                             "model folder whose tokenizer is the student's), tiny_teacher (one made here), or "
                             "trainer.teacher.address for a teacher already serving")
        if both := sorted(set(self.teachers_by_data_source) & set(self.trainer.get("teachers_by_data_source") or {})):
            raise ValueError(f"teachers_by_data_source.{both[0]}: the run starts this source's teacher and "
                             f"trainer.teachers_by_data_source.{both[0]} names another: keep one")
        if self.teachers_by_data_source and not algorithm.distillation_coef:
            raise ValueError("teachers_by_data_source: teachers score only a run that distils: set run.algorithm "
                             "DISTILL or trainer.algorithm.distillation_coef")
        return self

    @property
    def runs_environments(self) -> bool:
        """Whether the run starts the environment service: its section lists environments."""
        return bool(self.environment.get("environments"))

    @property
    def runs_teacher(self) -> bool:
        """Whether the run starts the teacher service: its section names the teacher's model, or the run makes one."""
        return bool((self.teacher.get("model") or {}).get("path")) or self.tiny_teacher is not None

    def prompts_reading(self, *keys: str) -> dict[str, Any]:
        """How the training set is read (of buffer.prompts: split, columns, skip_bad_rows), for other readers of
        the user's data."""
        prompts = self.buffer.get("prompts", {})
        return {key: prompts[key] for key in keys if key in prompts}


def _has_key(tree: dict[str, Any], dotted: str) -> bool:
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _service_schemas() -> dict[str, tuple[type, dict[str, Any]]]:
    """Each service section's schema, with what `up` fills in itself for the fields the schema requires (checking
    a section must not need the model or the data made first)."""
    from zerobubble.buffer.config import BufferServiceConfig
    from zerobubble.environment.config import EnvironmentServiceConfig
    from zerobubble.reward.config import RewardServiceConfig
    from zerobubble.rollout.config import RolloutServiceConfig
    from zerobubble.teacher.config import TeacherServiceConfig
    from zerobubble.trainer.config import TrainerServiceConfig

    made = "(made by up)"
    # The schedule's length is derived from the data when the run starts (run.py, with_schedule_length).
    trainer = {"model": made, "strategy": {"optim": {"total_steps": 1_000_000}},
               # The teacher's address, when the run starts one, is known once it listens.
               "teacher": {"address": "127.0.0.1:1"}}
    return {"reward": (RewardServiceConfig, {}), "buffer": (BufferServiceConfig, {"prompts": {"path": made}}),
            "trainer": (TrainerServiceConfig, trainer), "rollout": (RolloutServiceConfig, {"model": {"path": made}}),
            "environment": (EnvironmentServiceConfig, {}),
            "teacher": (TeacherServiceConfig, {"model": {"path": made}})}


def up_key_tree() -> dict[str, Any]:
    """UpConfig's keys as plain data (config_tree), each service's section as that service's schema checks it."""
    keys = key_tree(UpConfig)
    for name, (schema, _) in _service_schemas().items():
        keys["fields"][name] = {"nest": "section", "model": key_tree(schema), "choices": None, "scoped": True}
    return keys


def merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Nested dicts merged key by key; anything else in `overrides` replaces what `base` had."""
    out = dict(base)
    for key, value in overrides.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def write_yaml(path: Path, tree: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(_plain(tree), sort_keys=False))
    return path


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def validated(schema, tree: dict[str, Any], where: str):
    """The service config a section gives, checked before any process starts; errors name the section."""
    try:
        return load_config(schema, None, tree)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
