"""What `zerobubble up` checks before it starts a service or makes a model, so that a mistake costs seconds, not a
warm start and half a pipeline: the model folder, the data files and their rows, and every service's config as the
run would write it. Each failure is a ConfigError naming the field.
"""

from __future__ import annotations

from pathlib import Path

from zerobubble.common.config import ConfigError
from zerobubble.common.data_spec import DataSpec
from zerobubble.common.local_paths import check_model, looks_like_hub_id, missing_path
from zerobubble.rollout.batches_in_flight import check_batches_in_flight
from zerobubble.tooling.launcher.assets import RunAssets
from zerobubble.tooling.launcher.config import UpConfig, validated
from zerobubble.tooling.launcher.effective import Setting, derived_settings

# Rows of each data file checked before the start: all of a small file, the first part of a big one (the services
# read the rest, with the same checks, when they start).
DATA_CHECK_SECONDS = 1.5


def preflight(config: UpConfig, *, environments: bool = False) -> list[Setting]:
    """The cheap checks first: a mistyped path is reported before torch is imported. With `environments` (the dry
    run) the environments are loaded too, as their service will, and what each offers is printed. Returns what the
    run derives (the schedule's length, the model's identity)."""
    if config.model is not None:
        check_model(config.model)
    for field, path in teacher_models(config):
        check_model(path, field)
    check_verifiers(config)
    check_run_data(config)
    trees = check_services(config)
    if environments and "environment" in trees:
        from zerobubble.tooling.launcher.environment_check import check_environments

        for line in check_environments(trees["environment"]):
            print(line, flush=True)
    return derived_settings(trees.get("trainer", {}), trees.get("buffer", {}).get("run_spec", {}))


def check_service(service: str, config) -> None:
    """What `zerobubble serve` checks before the service's code loads: the model folder it starts from (a hub id is
    left to the loader, which may find it in the local cache) and the prompts it serves."""
    served = {"trainer": ("model", getattr(config, "model", None)),
              "rollout": ("model.path", getattr(getattr(config, "model", None), "path", None)),
              "teacher": ("model.path", getattr(getattr(config, "model", None), "path", None))}
    if service in served:
        field, path = served[service]
        if not looks_like_hub_id(path):
            check_model(path, field)
    if service == "buffer":
        inspect(config.prompts, field="prompts", default_split="train")


def teacher_models(config: UpConfig) -> list[tuple[str, Path]]:
    """The model folders the run's teacher services are given (not the one a run makes, tiny_teacher), by field."""
    sections = [("teacher", config.teacher), *((f"teachers_by_data_source.{source}", section)
                                               for source, section in config.teachers_by_data_source.items())]
    return [(f"{name}.model.path", Path(section["model"]["path"])) for name, section in sections
            if (section.get("model") or {}).get("path")]


def check_verifiers(config: UpConfig) -> None:
    """Every verifier the run routes rows to is one the reward service has (else every group fails to score)."""
    from zerobubble.reward.config import RewardServiceConfig

    known = validated(RewardServiceConfig, config.reward, "reward section").ground_truths()
    for field, name in [("run.verifier", config.run.verifier),
                        *((f"run.by_data_source.{source}", name) for source, name in
                          config.run.by_data_source.items())]:
        if name not in known:
            raise ConfigError(f"{field}: unknown verifier {name!r} (known: {', '.join(sorted(known))}; "
                              "reward.custom_verifiers adds others)")


def check_run_data(config: UpConfig) -> None:
    """The user's training and held-out sets, read as the buffer and the evaluation will read them."""
    sets = (("train_data", config.train_data, config.prompts_reading("split", "columns", "skip_bad_rows"), "train"),
            ("eval_data", config.eval_data, config.prompts_reading("columns", "skip_bad_rows"), "test"))
    for name, path, reading, default_split in sets:
        if path is None:
            continue
        spec = validated(DataSpec, {"path": path, **reading}, "buffer.prompts")
        found = inspect(spec, field="buffer.prompts", default_split=default_split, name=f"{name}: ")
        # Which file, read how: a wrong guess (a column, a format, a split) shows before the run, not after it.
        print(f"{name}: {found.describe()}", flush=True)


def inspect(spec: DataSpec, *, field: str, default_split: str, name: str = ""):
    """The data set's first rows read (all of a small one); a set that cannot be used is a ConfigError."""
    if missing := missing_path(spec.path, field):
        raise ConfigError(f"{name}{missing}")
    # Imported here: the reader brings numpy and pyarrow, which a config's mistake need not wait for.
    from zerobubble.common.data import DataError, inspect_data

    try:
        return inspect_data(spec, field=field, default_split=default_split, seconds=DATA_CHECK_SECONDS)
    except DataError as exc:
        raise ConfigError(f"{name}{exc}") from None


def check_services(config: UpConfig) -> dict[str, dict]:
    """Every service's config, as the run would write it (the trainer's schema brings torch: checked last); the
    trees by service."""
    from zerobubble.tooling.launcher.dry_run import DryRun

    made_here = Path("(made by up)")
    train = config.train_data or made_here / "train.jsonl"
    held_out = config.eval_data or (made_here / "eval.jsonl" if config.train_data is None else None)
    dry = DryRun(config)
    dry.launch(RunAssets(model=config.model or made_here, train=train, eval=held_out,
                         teacher=made_here / "teacher" if config.tiny_teacher is not None else None))
    check_batches_in_flight(config.rollout.get("generation", {}).get("batches_in_flight", 1),
                            config.run.weight_updates, field="rollout.generation.batches_in_flight")
    return dry.trees
