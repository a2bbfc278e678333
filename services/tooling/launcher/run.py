"""`zerobubble up`: every service its own process on loopback, started in order and health-checked, a live
progress line, and a run folder (configs, logs, metrics, rollouts' evals, checkpoints, a plot).

Order: reward, the environment service (when the run lists environments), buffer, trainer (it hosts the
weight-sync store), rollout workers. The run ends when the trainer finishes (exit 0). A service that dies is
restarted (the trainer from its checkpoint) until its restarts are used up, which stops everything with an error.
The services hold the run folder with the launcher and stop when it is gone, however it ended (tether.py).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from zerobubble.buffer.config import BufferServiceConfig
from zerobubble.common.config import TOKEN_ENV, ClientConfig, ConfigError, load_config
from zerobubble.common.run_spec import RunSpec, model_identity, require_agreement
from zerobubble.environment.config import EnvironmentServiceConfig
from zerobubble.reward.config import RewardServiceConfig
from zerobubble.rollout.config import RolloutServiceConfig
from zerobubble.teacher.config import TeacherServiceConfig
from zerobubble.tooling.launcher.assets import RunAssets, prepare_assets
from zerobubble.tooling.launcher.config import UpConfig, merge, validated, write_yaml
from zerobubble.tooling.launcher.failures import FAILURE_LOG, EnvironmentsFailed, FailureFollower
from zerobubble.tooling.launcher.processes import ServiceFailed, ServiceProcess
from zerobubble.tooling.launcher.progress import ProgressLine, last_row
from zerobubble.tooling.launcher.ready import read_announcement
from zerobubble.tooling.launcher.run_folder import SUMMARY_FILE, forget_failed_start
from zerobubble.tooling.launcher.run_folder import clear as clear_run_folder
from zerobubble.tooling.launcher.supervisor import Supervisor
from zerobubble.tooling.launcher.tether import RunFolderBusy, Tether
from zerobubble.trainer.config import BatchConfig, TrainerServiceConfig

log = logging.getLogger(__name__)
LOOPBACK = "127.0.0.1:0"
# Other users of this machine reach loopback ports too: every service of a run requires the run's token, which
# the services (processes started by this one) read from the environment.
TOKEN = {"auth_token_env": TOKEN_ENV}
SERVER = {"listen": LOOPBACK, **TOKEN}
# The run's token when `up` made it: for the user's own calls (an agent on the OpenAI endpoint, grpcurl), readable
# by its owner only. A token the user gave in $ZEROBUBBLE_AUTH_TOKEN is theirs and written nowhere.
TOKEN_FILE = "auth-token"


class Interrupted(Exception):
    """Ctrl-C or SIGTERM reached the launcher."""


@dataclass
class Run:
    config: UpConfig
    resume: bool = False
    tether: Tether | None = None
    services: list[ServiceProcess] = field(default_factory=list)

    @property
    def run_dir(self) -> Path:
        return self.config.run_dir

    def start(self, name: str, service: str, schema, tree: dict, restart_overrides: tuple[str, ...] = (),
              processes: int = 1) -> ServiceProcess:
        validated(schema, tree, f"{service} section")
        path = write_yaml(self.run_dir / "configs" / f"{name}.yaml", tree)
        log.info("starting %s", name)
        process = ServiceProcess(name, service, path, self.run_dir / "logs", tether=self.tether,
                                 restart_overrides=restart_overrides, processes=processes)
        self.services.append(process)
        return process.start(self.config.startup_timeout_seconds)

    def client_config(self, process: ServiceProcess) -> ClientConfig:
        """How this process calls one of the run's services."""
        return ClientConfig(address=process.address, **TOKEN)

    def launch(self, assets: RunAssets) -> ServiceProcess:
        """Start every service in order; returns the trainer. The run's token is $ZEROBUBBLE_AUTH_TOKEN when set
        (so other tools can call the services), else a new random one, written to TOKEN_FILE."""
        self.issue_token()
        config, pipeline = self.config, self.config.pipeline
        reward = self.start("reward", "reward", RewardServiceConfig, merge(
            {"server": SERVER, "math": {"workers": 1}}, config.reward))
        environment = None
        if config.runs_environments:
            environment = self.start("environment", "environment", EnvironmentServiceConfig,
                                     merge({"server": SERVER}, config.environment))
        teacher = None
        if config.runs_teacher:
            made = {"model": {"path": assets.teacher}} if assets.teacher is not None else {}
            teacher = self.start("teacher", "teacher", TeacherServiceConfig,
                                 merge(merge({"server": SERVER}, made), config.teacher))
        routed = {source: self.start(f"teacher-{source}", "teacher", TeacherServiceConfig,
                                     merge({"server": SERVER}, section))
                  for source, section in config.teachers_by_data_source.items()}
        spec = build_run_spec(config, assets.model)
        buffer_config = validated(BufferServiceConfig, merge({"prompts": {"path": assets.train}}, config.buffer),
                                  "buffer section")
        trainer_tree = merge({
            "server": SERVER, "model": assets.model, "run_dir": self.run_dir / "trainer",
            "resume": self.resume, "torch_threads": pipeline.torch_threads,
            # Where the rollout's evaluations land, for the trainer's dashboards (when it has any).
            "tracking": {"eval_summary": self.run_dir / "eval" / "summary.jsonl"},
            "algorithm": {"preset": spec.algorithm},
            **({"teacher": {"address": teacher.address, **TOKEN}} if teacher is not None else {}),
            **({"teachers_by_data_source": {source: {"address": process.address, **TOKEN}
                                            for source, process in routed.items()}} if routed else {}),
        }, config.trainer)
        trainer_tree = with_schedule_length(trainer_tree, lambda: self.train_rows(assets),
                                            buffer_config.prompts.epochs)
        trainer_config = validated(TrainerServiceConfig, trainer_tree, "trainer section")
        try:
            trainer_config.batch.groups_per_rank(config.trainer_processes)
        except ConfigError as exc:
            raise ConfigError(f"trainer section: {exc} (trainer_processes)") from None
        # What the rollout section makes of the run is checked now, not when the workers start.
        rollout_config = validated(RolloutServiceConfig, merge({"model": {"path": assets.model}}, config.rollout),
                                   "rollout section")
        for section in (trainer_config, rollout_config):
            require_agreement(spec, section.expectations(), source="the run section")
        queued_steps = 1 if spec.max_staleness == 0 else 2
        buffer = self.start("buffer", "buffer", BufferServiceConfig, merge({
            "server": SERVER, "prompts": {"path": assets.train},
            # Workers stop leasing when two steps of groups wait (one, strictly on-policy): generating further
            # ahead would only make samples the staleness bound throws away.
            "capacity": {"max_groups": queued_steps * trainer_config.batch.groups_per_step},
            "wal": {"directory": self.run_dir / "buffer-wal"},
        }, {**config.buffer, "run_spec": spec.model_dump(mode="json")}))
        trainer = self.start("trainer", "trainer", TrainerServiceConfig,
                             merge(trainer_tree, {"buffer": {"address": buffer.address, **TOKEN}}),
                             restart_overrides=("resume=true",), processes=config.trainer_processes)
        for i in range(pipeline.rollout_workers):
            tree = {
                "server": SERVER, "worker_id": f"rollout-{i}", "model": {"path": assets.model},
                "generation": {"seed": 1000 * i},
                "buffer": {"address": buffer.address, **TOKEN}, "reward_service": {"address": reward.address, **TOKEN},
                "trainer": {"address": trainer.address, **TOKEN}, "torch_threads": pipeline.torch_threads,
                "failure_log": self.run_dir / FAILURE_LOG,
            }
            if environment is not None:
                tree["environment"] = {"address": environment.address, **TOKEN}
            if i == 0 and assets.eval is not None:
                # A resumed run has its before-training evaluation; the worker's first weights are the base model's.
                tree["eval"] = {"datasets": {"heldout": self.heldout_spec(assets.eval)},
                                "output_dir": self.run_dir / "eval", "at_start": not self.resume}
            self.start(f"rollout-{i}", "rollout", RolloutServiceConfig, merge(tree, config.rollout))
        return trainer

    def issue_token(self) -> None:
        if not os.environ.get(TOKEN_ENV):
            os.environ[TOKEN_ENV] = secrets.token_urlsafe(32)
            write_token(self.run_dir / TOKEN_FILE, os.environ[TOKEN_ENV])

    def train_rows(self, assets: RunAssets) -> int:
        """Rows of the training set, read as the buffer reads them (only asked for when the schedule's length must
        be derived); before the task is made (a dry run), its size."""
        if not assets.train.exists():
            return self.config.task.train_size
        from zerobubble.common.data import DataSpec, load_data

        reading = self.config.prompts_reading("split", "columns", "skip_bad_rows")
        return len(load_data(DataSpec(path=assets.train, **reading), field="buffer.prompts", default_split="train"))

    def heldout_spec(self, path: Path) -> dict:
        """The held-out set is read as the training prompts are (the same column mapping and bad-row rule); a
        folder's split is its own (test by default)."""
        return {"path": path, **self.config.prompts_reading("columns", "skip_bad_rows")}

    def evaluation_size(self, *, at_start: bool) -> str | None:
        """What the first worker's evaluation of the held-out set covers ("50 prompts x 4 samples"), when it has
        one (at_start: only when it evaluates the starting weights too)."""
        path = self.run_dir / "configs" / "rollout-0.yaml"
        if not path.exists():
            return None
        evaluation = load_config(RolloutServiceConfig, path).eval
        heldout = evaluation.datasets.get("heldout")
        if heldout is None or (at_start and not evaluation.at_start):
            return None
        from zerobubble.common.data import load_data

        prompts = len(load_data(heldout, field="eval.datasets.heldout", default_split="test"))
        if evaluation.max_prompts is not None:
            prompts = min(prompts, evaluation.max_prompts)
        return f"{prompts} prompts x {evaluation.samples_per_prompt} samples"

    def watch(self, trainer: ServiceProcess, progress: ProgressLine, until: Callable[[], bool] | None = None) -> bool:
        """Until the trainer finishes, or `until()` is true first (then False), restarting what dies; raises
        ServiceFailed when a service dies with its restarts used up, EnvironmentsFailed when a worker stopped the
        run because its environments fail every episode."""
        supervisor = Supervisor(self.services, trainer, self.config.restarts, self.config.startup_timeout_seconds)
        # Printed above the progress line; the benches' stand-ins for it have no line, and print plainly.
        say = getattr(progress, "say", lambda text: print(text, flush=True))
        failures = FailureFollower(self.run_dir / FAILURE_LOG, say)
        while True:
            failures.poll()
            try:
                if supervisor.check():
                    return True
            except ServiceFailed:
                failures.poll()   # a worker that stopped the run says why better than its exit code
                raise
            if until is not None and until():
                return False
            progress.refresh()
            time.sleep(0.5)

    def waiting_for(self) -> str:
        """" (...)": what the first step waits for besides the workers' own generation, for the progress line."""
        path = self.run_dir / "configs" / "rollout-0.yaml"
        if path.exists() and load_config(RolloutServiceConfig, path).openai.exclusive:
            return (" (rollout.openai.exclusive: the workers generate nothing themselves; training waits for an "
                    "agent's groups, POST /v1/groups on the OpenAI endpoint above)")
        return ""

    def endpoints(self) -> list[str]:
        """What a user reaches of the run, for the console: the OpenAI endpoints, the run's token, the viewer."""
        lines = []
        for process in self.services:
            ready = read_announcement(process.ready_path) if process.ready_path.exists() else None
            if ready and ready.get("openai_url"):
                lines.append(f"OpenAI endpoint of {process.name}: {ready['openai_url']} (base_url for the openai SDK)")
        token_file = self.run_dir / TOKEN_FILE
        if token_file.exists():
            lines.append(f"the run's token (every service and endpoint asks for it as 'Authorization: Bearer "
                         f"TOKEN'): {token_file}")
        else:
            lines.append(f"the run's token (every service and endpoint asks for it as 'Authorization: Bearer "
                         f"TOKEN'): ${TOKEN_ENV}, as you set it")
        lines.append(f"watch the run: zerobubble view {self.run_dir}")
        return lines

    def stop_all(self) -> None:
        """Every service in reverse order, then the run folder is free."""
        for process in reversed(self.services):
            process.stop()
        if self.tether is not None:
            self.tether.release()
            self.tether = None


def write_token(path: Path, token: str) -> None:
    """`token` in a file only its owner reads, made so before the token is in it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(token + "\n")


def build_run_spec(config: UpConfig, model: Path) -> RunSpec:
    """The run's spec: the `run` section, with the model's identity read from its folder unless the section pins
    it."""
    spec = config.run
    # Checking a run before `up` makes its model (the dry run of preflight) leaves the identity unpinned.
    if (model / "config.json").is_file() and "model" not in spec.model_fields_set:
        spec = spec.model_copy(update={"model": model_identity(model)})
    return spec


def with_schedule_length(trainer: dict, train_rows, epochs: int) -> dict:
    """The trainer's tree with the learning-rate schedule's length derived, unless set: the optimizer steps of
    the whole run, (train rows x epochs) // groups per step full steps (capped at max_steps) times the updates of
    a step. `train_rows` is called only when the length must be derived."""
    optim = trainer.get("strategy", {}).get("optim", {})
    if optim.get("schedule", "constant") == "constant" or optim.get("total_steps") is not None:
        return trainer
    batch = validated(BatchConfig, trainer.get("batch", {}), "trainer section: batch")
    rows = train_rows()
    by_data = rows * epochs // batch.groups_per_step
    max_steps = trainer.get("max_steps")
    steps = by_data if max_steps is None else min(by_data, max_steps)
    total = max(1, steps) * batch.mini_batches
    warmup = optim.get("warmup_steps", 0)
    if total <= warmup:
        raise ConfigError(warm_up_refusal(total, warmup, rows, epochs, batch, max_steps))
    return merge(trainer, {"strategy": {"optim": {"total_steps": total}}})


# What the warm-up refusal offers for a run of a few steps.
SMOKE_FLAG = "--set trainer.strategy.optim.warmup_steps=0"


def warm_up_refusal(total: int, warmup: int, rows: int, epochs: int, batch: BatchConfig, max_steps: int | None) -> str:
    """Why the schedule is shorter than its warm-up, naming the setting that made it so."""
    by_data = rows * epochs // batch.groups_per_step
    updates = f" x {batch.mini_batches} updates a step" if batch.mini_batches > 1 else ""
    data = f"{rows} rows x {epochs} epochs // {batch.groups_per_step} groups a step = {by_data} steps"
    if max_steps is not None and max_steps < by_data:
        return (f"trainer.max_steps: the run makes {total} optimizer steps (trainer.max_steps={max_steps}{updates}; "
                f"the data alone gives {data}), no more than its {warmup} warm-up steps "
                f"(trainer.strategy.optim.warmup_steps): for a smoke test of a few steps add {SMOKE_FLAG}; for a "
                f"real run raise trainer.max_steps, to more than {warmup} optimizer steps")
    return (f"trainer.strategy.optim.warmup_steps: the run makes {total} optimizer steps ({data}{updates}), no more "
            f"than its {warmup} warm-up steps: lower warmup_steps ({SMOKE_FLAG} for none) or "
            f"trainer.batch.groups_per_step, or set trainer.strategy.optim.total_steps")


def _interrupt(signum, _frame):
    raise Interrupted(signal.Signals(signum).name)


def up(config: UpConfig, *, resume: bool = False, overwrite: bool = False, cache: Path | None = None) -> int:
    """Run the pipeline to the end; returns the exit code (0 done, 1 a service failed or the run folder is in use,
    130 interrupted). `overwrite` first clears what an earlier run left in the folder."""
    try:
        run = Run(config, resume=resume, tether=Tether.hold(config.run_dir))
    except RunFolderBusy as exc:
        print(f"zerobubble up: {exc}", flush=True)
        return 1
    if overwrite:
        log.info("--overwrite: removing the earlier run in %s", config.run_dir)
        clear_run_folder(config.run_dir)
    write_yaml(config.run_dir / "configs" / "up.yaml", config.model_dump(mode="json"))
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    started = time.monotonic()
    progress = ProgressLine(config.run_dir)
    launched = False
    try:
        assets = prepare_assets(config, cache or config.run_dir.parent / ".assets")
        trainer = run.launch(assets)
        launched = True
        for line in run.endpoints():
            print(line, flush=True)
        progress.waiting_for = run.waiting_for()
        progress.evaluation = run.evaluation_size(at_start=True)
        progress.start()
        run.watch(trainer, progress)
        progress.close()
        if config.final_eval and assets.eval is not None:
            final_eval(run, assets)
        track_evaluations(run)
    except Interrupted as exc:
        progress.close()
        print(f"zerobubble up: {exc} received, stopping the services; the run did not finish (zerobubble up "
              f"--resume {config.run_dir} goes on)", flush=True)
        run.stop_all()
        return 130
    except (ServiceFailed, ConfigError, EnvironmentsFailed) as exc:
        progress.close()
        print(f"zerobubble up: {exc}", flush=True)
        run.stop_all()
        if not launched and not resume and forget_failed_start(config.run_dir):
            print(f"zerobubble up: the run did not start; {config.run_dir} is free for the next try (its logs "
                  "stay)", flush=True)
        return 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    run.stop_all()
    summary = finish(config.run_dir, time.monotonic() - started, assets.teacher)
    print(json.dumps(summary), flush=True)
    return 0


def final_eval(run: Run, assets: RunAssets) -> None:
    """The held-out set on the last checkpoint, through the running reward service, into eval/."""
    from zerobubble.tooling.launcher.final_eval import evaluate_checkpoint

    reward = next(p for p in run.services if p.service == "reward")
    before = last_row(run.run_dir / "eval" / "summary.jsonl")
    estimate = f", about {before['seconds']:.0f} s as the last one took" if before and "seconds" in before else ""
    print(f"evaluating the last checkpoint on the held-out set ({run.evaluation_size(at_start=False)}{estimate})",
          flush=True)
    started = time.monotonic()
    result = evaluate_checkpoint(run.run_dir, assets.eval, run.client_config(reward))
    if result is None:
        print("the last checkpoint was evaluated during the run", flush=True)
    else:
        print(f"after training: pass@1 {result['pass@1']:.3f} (version {result['version']}, "
              f"{time.monotonic() - started:.0f} s)", flush=True)


def track_evaluations(run: Run) -> None:
    """Evaluations written once the trainer had stopped (the final one above all) reach its dashboards too."""
    from zerobubble.trainer.tracking import log_new_evaluations

    log_new_evaluations(load_config(TrainerServiceConfig, run.run_dir / "configs" / "trainer.yaml"))


def finish(run_dir: Path, seconds: float, teacher: Path | None = None) -> dict:
    """The run's headline figures (first and last evaluation), what making its teacher took (a teacher made
    here: made for this run or by an earlier one, its cost either way) and its plot."""
    from zerobubble.tooling.plot import plot_run

    summary: dict = {"run_dir": str(run_dir), "wall_seconds": round(seconds, 1)}
    made = teacher / "ready.json" if teacher is not None else None
    if made is not None and made.is_file():
        summary["teacher_preparation_seconds"] = json.loads(made.read_text()).get("seconds")
    evals_path = run_dir / "eval" / "summary.jsonl"
    if evals_path.exists():
        evals = [json.loads(line) for line in evals_path.read_text().splitlines() if line.strip()]
        if evals:
            first, last = min(evals, key=lambda e: e["version"]), max(evals, key=lambda e: e["version"])
            summary.update({"eval_before": first["pass@1"], "version_before": first["version"]})
            # An "after" only of weights that trained: without the final evaluation (final_eval: false) the last
            # one may be the start's.
            if last["version"] > first["version"]:
                summary.update({"eval_after": last["pass@1"], "version_after": last["version"]})
    try:
        summary["plot"] = str(plot_run(run_dir))
    except (OSError, ValueError) as exc:
        log.warning("no plot: %s", exc)
    # Also a file, for scripts and the Python API.
    (run_dir / SUMMARY_FILE).write_text(json.dumps(summary) + "\n")
    return summary
