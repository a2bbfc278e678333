"""The run as the user's dashboards read it: TensorBoard event files, a Weights & Biases run (online or offline),
and the rollout log (every N steps a sample of prompts, responses, rewards and policy versions).

Called where the trainer writes metrics.jsonl, with the same row: figures of the training go under `train/`, the
pipeline's timing (idle fraction, staleness, weight sync) under `pipeline/`, and the evaluations, followed from
their summary.jsonl, under `eval/<dataset>/` at their policy version (in TensorBoard a run of their own beside the
training's, `eval` and `train`). With nothing configured it does nothing.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zerobubble.common.codec import decode_array
from zerobubble.common.config import ConfigError
from zerobubble.common.episodes import ENVIRONMENT_FAILURES
from zerobubble.trainer.config import RolloutLogConfig, TrainerServiceConfig, WandbConfig
from zerobubble.trainer.figures import BY_NAME
from zerobubble.v1 import common_pb2

log = logging.getLogger(__name__)

# Row keys that are the x axis or a timestamp, not figures.
NOT_FIGURES = ("step", "time")
TENSORBOARD_DIR = "tensorboard"
ROLLOUT_LOG = "rollouts.jsonl"
WANDB_ID_FILE = "wandb-run-id"
# How much of the evaluations' summary the dashboards have had, so a resumed trainer, or the launcher after the
# evaluation that follows training, logs only what is new.
EVAL_OFFSET_FILE = "tracked-eval-bytes"
ROLLOUT_COLUMNS = ["step", "prompt_id", "prompt", "gt_answer", "response", "reward", "answer_ok", "policy_version"]


def step_scalars(row: dict[str, Any]) -> dict[str, float]:
    """A metrics.jsonl row as dashboard tags."""
    return {f"{BY_NAME[name].dashboard if name in BY_NAME else 'train'}/{name}": float(value)
            for name, value in row.items() if name not in NOT_FIGURES and isinstance(value, int | float)}


def eval_scalars(summary: dict[str, Any]) -> dict[str, float]:
    """One evaluation (a summary.jsonl row) as tags: pass@k of the set, and pass@1 of each data source in it."""
    prefix = f"eval/{summary['dataset']}"
    tags = {f"{prefix}/{name}": float(value) for name, value in summary.items() if name.startswith("pass@")
            and isinstance(value, int | float)}
    for source, value in summary.get("pass@1_by_source", {}).items():
        tags[f"{prefix}/{source}/pass@1"] = float(value)
    return tags


def episode_fields(trajectory: common_pb2.Trajectory) -> dict[str, Any]:
    """How a multi-turn response's episode went ({} for a single-turn one); its text is the whole transcript."""
    if not trajectory.HasField("episode"):
        return {}
    episode = trajectory.episode
    fields = {"environment": episode.environment, "turns": episode.turns, "tool_calls": episode.tool_calls,
              "step_rewards": [round(r, 6) for r in episode.step_rewards], "ended_reason": episode.ended_reason}
    if episode.error:
        fields["error"] = episode.error
    return {"episode": fields}


def episode_endings(groups: list[common_pb2.ExperienceGroup]) -> dict[str, int]:
    """How a step's episodes ended, as metrics.jsonl counts them: `episodes`, `episodes_failed` (ended by their
    environment failing) and `episodes_failed_<reason>` per failure reason; {} for a step without episodes."""
    endings: dict[str, int] = {}
    for trajectory in (t for group in groups for t in group.trajectories if t.HasField("episode")):
        endings["episodes"] = endings.get("episodes", 0) + 1
        endings.setdefault("episodes_failed", 0)
        if trajectory.episode.ended_reason in ENVIRONMENT_FAILURES:
            key = f"episodes_failed_{trajectory.episode.ended_reason}"
            endings["episodes_failed"] += 1
            endings[key] = endings.get(key, 0) + 1
    return endings


def add_counts(shares: list[dict[str, int]]) -> dict[str, int]:
    """The counts of data-parallel ranks' shares of one step, summed."""
    total: dict[str, int] = {}
    for share in shares:
        for key, value in share.items():
            total[key] = total.get(key, 0) + value
    return total


def token_versions(trajectory: common_pb2.Trajectory, count: int) -> list[int] | None:
    """The policy version of each of the first `count` tokens, from the trajectory's version spans where the
    contract has them and the response has any (None: every token is policy_version's)."""
    if "version_spans" not in trajectory.DESCRIPTOR.fields_by_name or not trajectory.version_spans:
        return None
    spans = list(trajectory.version_spans)
    ends = [span.start for span in spans[1:]] + [count]
    versions: list[int] = []
    for span, end in zip(spans, ends, strict=True):
        versions += [span.version] * max(0, min(end, count) - len(versions))
    return versions + [spans[-1].version] * (count - len(versions))


def _token_fields(trajectory: common_pb2.Trajectory, limit: int,
                  token_text: Callable[[list[int]], list[str]] | None) -> dict[str, Any]:
    """A response's tokens for the viewer: ids, their text, behaviour log-probs and, when the trajectory has them,
    its loss mask (observation tokens of an episode) and per-token policy versions; the first `limit` of each."""
    ids = decode_array(trajectory.response_ids, "response_ids").tolist()
    logprobs = decode_array(trajectory.behaviour_logprobs, "behaviour_logprobs").tolist()
    kept = ids[:limit]
    fields: dict[str, Any] = {"token_ids": kept, "logprobs": [round(v, 4) for v in logprobs[:limit]]}
    if trajectory.HasField("loss_mask"):
        fields["loss_mask"] = decode_array(trajectory.loss_mask, "loss_mask").tolist()[:limit]
    versions = token_versions(trajectory, len(kept))
    if versions is not None:
        fields["token_versions"] = versions
    if token_text is not None:
        fields["tokens"] = token_text(kept)
    if len(ids) > limit:
        fields["tokens_cut"] = True
    return fields


def rollout_sample(groups: list[common_pb2.ExperienceGroup], step: int, policy_version: int, config: RolloutLogConfig,
                   advantages: list[float] | None = None,
                   token_text: Callable[[list[int]], list[str]] | None = None) -> list[dict[str, Any]]:
    """`config.groups` groups of the step, drawn with the step as the seed, each with every response, its score,
    how its episode went (multi-turn) and (given the step's advantages, in the order of its groups' responses) its
    advantage."""
    size = len(groups[0].trajectories) if groups else 0
    chosen = random.Random(step).sample(range(len(groups)), min(config.groups, len(groups)))
    rows = []
    for index in chosen:
        group = groups[index]
        prompt = group.prompt
        truth = ({"gt_answer": prompt.gt_answer} if prompt.WhichOneof("ground_truth") == "gt_answer" else
                 {"test_cases": {"inputs": list(prompt.test_cases.inputs), "outputs": list(prompt.test_cases.outputs)}})
        responses = []
        for j, t in enumerate(group.trajectories):
            response = {"text": t.response_text, "reward": t.reward, "answer_ok": t.answer_ok,
                        "format_ok": t.format_ok, "policy_version": t.policy_version,
                        "finish_reason": common_pb2.FinishReason.Name(t.finish_reason),
                        "length": t.response_ids.shape[0] if t.response_ids.shape else 0, **episode_fields(t)}
            if advantages is not None:
                response["advantage"] = round(advantages[index * size + j], 6)
            if config.tokens:
                response.update(_token_fields(t, config.max_tokens, token_text))
            responses.append(response)
        source = {"data_source": prompt.data_source} if prompt.HasField("data_source") else {}
        rows.append({"step": step, "trained_policy_version": policy_version, "prompt_id": prompt.prompt_id,
                     "epoch": prompt.epoch, **source, "messages": json.loads(prompt.messages_json), **truth,
                     "responses": responses})
    return rows


class EvalFollower:
    """New complete lines of the evaluations' summary.jsonl since the last call, in this process or an earlier one."""

    def __init__(self, path: Path, offset_file: Path):
        self.path = path
        self.offset_file = offset_file
        self.offset = int(offset_file.read_text()) if offset_file.exists() else 0

    def new_rows(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        complete = data[: data.rfind(b"\n") + 1]
        if not complete:
            return []
        self.offset += len(complete)
        self.offset_file.write_text(str(self.offset))
        return [json.loads(line) for line in complete.splitlines() if line.strip()]


def _start_wandb(config: WandbConfig, run_dir: Path, run_config: dict[str, Any]):
    import wandb

    # A resumed trainer continues the same wandb run.
    id_file = run_dir / WANDB_ID_FILE
    run_id = id_file.read_text().strip() if id_file.exists() else None
    run_dir.mkdir(parents=True, exist_ok=True)
    settings = wandb.Settings(console="off", x_disable_stats=True, **({"mode": config.mode} if config.mode else {}))
    try:
        # The process-wide settings too: offline there keeps wandb's own usage telemetry (export threads that try the
        # network at exit) from starting.
        wandb.setup(settings=settings)
        run = wandb.init(project=config.project, entity=config.entity, name=config.name, dir=run_dir, id=run_id,
                         resume="allow", config=run_config, settings=settings)
    except Exception as exc:  # wandb raises its own errors, and plain ones, for a login or network it cannot have
        raise ConfigError(f"tracking.wandb: no wandb run could be started: {exc}") from None
    id_file.write_text(run.id)
    run.define_metric("trainer/step")
    for prefix in ("train", "pipeline", "rollouts"):
        run.define_metric(f"{prefix}/*", step_metric="trainer/step")
    run.define_metric("eval/policy_version")
    run.define_metric("eval/*", step_metric="eval/policy_version")
    return run


class Tracker:
    """The trainer's dashboards; `active` is false on every data-parallel rank but the first."""

    def __init__(self, config: TrainerServiceConfig, *, active: bool = True):
        self.config = config.tracking
        self.run_dir = config.run_dir
        self.active = active
        self.tensorboard = None
        self.eval_tensorboard = None
        self.wandb = None
        self.model = config.model
        self.tokenizer = None
        follow = active and self.config.eval_summary is not None and (
            self.config.tensorboard or self.config.wandb is not None)
        self.evals = EvalFollower(self.config.eval_summary, self.run_dir / EVAL_OFFSET_FILE) if follow else None
        if active and self.config.wandb is not None:
            self.wandb = _start_wandb(self.config.wandb, self.run_dir, config.model_dump(mode="json"))

    def _tensorboard(self, step: int):
        if self.tensorboard is None:
            from torch.utils.tensorboard import SummaryWriter

            # A resumed run trains again from its checkpoint: purge_step hides what the stopped one logged from
            # there on, so each step appears once.
            self.tensorboard = SummaryWriter(str(self.run_dir / TENSORBOARD_DIR / "train"), purge_step=step)
        return self.tensorboard

    def _eval_tensorboard(self):
        if self.eval_tensorboard is None:
            from torch.utils.tensorboard import SummaryWriter

            self.eval_tensorboard = SummaryWriter(str(self.run_dir / TENSORBOARD_DIR / "eval"))
        return self.eval_tensorboard

    def log_step(self, row: dict[str, Any], groups: list[common_pb2.ExperienceGroup],
                 advantages: Callable[[], list[float]] | None = None) -> None:
        """One training step: the metrics.jsonl row, the groups it trained on and, asked for only on a step whose
        rollouts are logged, each of their responses' advantage."""
        if not self.active:
            return
        step = row["step"]
        scalars = step_scalars(row)
        if self.config.tensorboard:
            writer = self._tensorboard(step)
            for tag, value in scalars.items():
                writer.add_scalar(tag, value, step)
        if self.wandb is not None:
            self.wandb.log({"trainer/step": step, **scalars})
        rollout_log = self.config.rollout_log
        if rollout_log is not None and step % rollout_log.interval_steps == 0:
            rows = rollout_sample(groups, step, row["policy_version"], rollout_log,
                                  advantages() if advantages is not None else None, self._token_text())
            self._log_rollouts(rows, step)
        self._log_evals()
        if self.tensorboard is not None:
            self.tensorboard.flush()

    def _token_text(self) -> Callable[[list[int]], list[str]] | None:
        """Each token's own text, from the model's tokenizer (loaded on the first logged step)."""
        if not self.config.rollout_log.tokens:
            return None
        if self.tokenizer is None:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(self.model)
        return lambda ids: self.tokenizer.batch_decode([[i] for i in ids])

    def _log_rollouts(self, rows: list[dict[str, Any]], step: int) -> None:
        with open(self.run_dir / ROLLOUT_LOG, "a", encoding="utf-8") as out:
            out.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        if self.wandb is not None:
            import wandb

            table = wandb.Table(columns=ROLLOUT_COLUMNS, data=[
                [step, row["prompt_id"], json.dumps(row["messages"], ensure_ascii=False), row.get("gt_answer"),
                 response["text"], response["reward"], response["answer_ok"], response["policy_version"]]
                for row in rows for response in row["responses"]])
            self.wandb.log({"trainer/step": step, "rollouts/samples": table})

    def _log_evals(self) -> None:
        if self.evals is None:
            return
        for summary in self.evals.new_rows():
            version = summary["version"]
            scalars = eval_scalars(summary)
            if self.config.tensorboard:
                writer = self._eval_tensorboard()
                for tag, value in scalars.items():
                    writer.add_scalar(tag, value, version)
                writer.flush()
            if self.wandb is not None:
                self.wandb.log({"eval/policy_version": version, **scalars})

    def close(self) -> None:
        """Takes the evaluations written since the last step, then closes the files and the wandb run."""
        self._log_evals()
        for writer in (self.tensorboard, self.eval_tensorboard):
            if writer is not None:
                writer.close()
        if self.wandb is not None:
            import wandb

            self.wandb.finish()
            # Now rather than in wandb's exit hook, beside the trainer's own teardown at interpreter exit.
            wandb.teardown()


def log_new_evaluations(config: TrainerServiceConfig) -> None:
    """The evaluations the trainer's dashboards have not had, such as the one `zerobubble up` runs after training."""
    Tracker(config).close()
