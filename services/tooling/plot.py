"""`zerobubble plot RUN_DIR`: one PNG of a run's training curves, with its evaluations when it has any.

Reads RUN_DIR/trainer/metrics.jsonl (one object per training step) and, when present,
RUN_DIR/eval/summary.jsonl (one object per evaluation: version, dataset, pass@1, ...).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

METRICS_FILE = Path("trainer") / "metrics.jsonl"
EVAL_FILE = Path("eval") / "summary.jsonl"
DEFAULT_OUT = "plot.png"
SUMMARY_FILE = "summary.json"   # what `zerobubble up` writes at the end of a run
MINUTES = "minutes"             # the x of a step row on a wall-clock axis (set by _place_in_minutes)
X_LABELS = {"step": "training step", MINUTES: "minutes (from the start of training, after the teacher's making)"}


class RunDataError(ValueError):
    """The run folder has no usable training metrics; the message names the file."""


@dataclass(frozen=True)
class Panel:
    title: str
    ylabel: str
    series: tuple[tuple[str, str], ...]  # (key in metrics.jsonl, legend label)


PANELS = (
    Panel("reward", "mean reward", (("reward_mean", "reward"),)),
    # Tool calls per sample: the share of samples that call a tool, when episodes call one at most.
    Panel("accuracy", "fraction", (("answer_accuracy", "answer"), ("format_accuracy", "format"),
                                   ("tool_calls_mean", "tool calls per sample"))),
    Panel("KL to the reference", "k3 KL", (("kl", "kl"),)),
    Panel("entropy", "nats per token", (("entropy", "entropy"),)),
    Panel("response length", "tokens", (("response_length_mean", "mean"), ("response_length_max", "max"))),
    Panel("staleness", "policy versions", (("staleness_mean", "mean"), ("staleness_max", "max"))),
)
ACCURACY_PANEL = 1


def read_jsonl(path: Path) -> list[dict]:
    """The objects of a JSONL file. A last line without its newline is a write in progress and is left out."""
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    if not text.endswith("\n"):
        lines = lines[:-1]
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise RunDataError(f"{path}:{number} is not valid JSON: {exc.msg}") from None
        if not isinstance(row, dict):
            raise RunDataError(f"{path}:{number}: expected a JSON object")
        rows.append(row)
    return rows


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def series(rows: list[dict], key: str, x_key: str = "step") -> tuple[list[float], list[float]]:
    """(x, y) of the rows that have a finite number under both keys."""
    points = [(_number(row.get(x_key)), _number(row.get(key))) for row in rows]
    kept = [(x, y) for x, y in points if x is not None and y is not None]
    return [x for x, _ in kept], [y for _, y in kept]


def trailing_mean(values: list[float], window: int) -> np.ndarray:
    """Mean of each value and up to window-1 before it (the first points average what exists)."""
    sums = np.cumsum(np.asarray(values, dtype=float))
    counts = np.minimum(np.arange(1, len(values) + 1), window)
    shifted = np.concatenate([np.zeros(window), sums])[: len(values)]
    return (sums - shifted) / counts


def eval_curves(summary: list[dict], steps: list[dict], x_key: str = "step",
                start: float = 0.0) -> dict[str, tuple[list[float], list[float]]]:
    """pass@1 per dataset, placed at the x (`x_key` of the step rows) of the step that produced each evaluated
    policy version (version 0 is the starting weights, at `start`; a version that no step row names is placed at
    its own number)."""
    step_of = {0.0: start}
    for row in steps:
        version, step = _number(row.get("policy_version")), _number(row.get(x_key))
        if version is not None and step is not None:
            step_of.setdefault(version, step)
    curves: dict[str, tuple[list[float], list[float]]] = {}
    for row in summary:
        version, score = _number(row.get("version")), _number(row.get("pass@1"))
        if version is None or score is None:
            continue
        xs, ys = curves.setdefault(str(row.get("dataset", "eval")), ([], []))
        xs.append(step_of.get(version, version))
        ys.append(score)
    for xs, ys in curves.values():
        order = sorted(range(len(xs)), key=xs.__getitem__)
        xs[:], ys[:] = [xs[i] for i in order], [ys[i] for i in order]
    return curves


def _draw_series(ax, xs: list[float], ys: list[float], label: str, color: str) -> None:
    window = max(2, len(ys) // 20)
    if len(ys) >= 10:
        # Per-step figures of RL runs are noisy: the raw line stays faint, the trend is drawn over it.
        ax.plot(xs, ys, color=color, alpha=0.3, linewidth=0.8)
        ax.plot(xs, trailing_mean(ys, window), color=color, linewidth=1.8, label=f"{label} (mean of {window})")
    else:
        ax.plot(xs, ys, color=color, marker="o", markersize=3, linewidth=1.5, label=label)


def _draw(run_dir: Path, steps: list[dict], evals: dict[str, tuple[list[float], list[float]]], out: Path,
          x_key: str = "step") -> None:
    # Imported here: every `zerobubble` command imports this module, and only plotting needs matplotlib.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(16, 9), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(2, 3, sharex=True).ravel()
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"]
    for index, (ax, panel) in enumerate(zip(axes, PANELS, strict=True)):
        ax.set_title(panel.title)
        ax.set_ylabel(panel.ylabel)
        ax.grid(alpha=0.3)
        drawn = 0
        for (key, label), color in zip(panel.series, colors, strict=False):
            xs, ys = series(steps, key, x_key)
            if xs:
                _draw_series(ax, xs, ys, label, color)
                drawn += 1
        if index == ACCURACY_PANEL:
            for (dataset, (xs, ys)), color in zip(evals.items(), colors[len(panel.series):], strict=False):
                ax.plot(xs, ys, color=color, marker="s", markersize=4, linestyle="--", label=f"eval pass@1 {dataset}")
                drawn += 1
        if drawn:
            ax.legend(fontsize="small", loc="best")
        else:
            ax.text(0.5, 0.5, "not recorded", transform=ax.transAxes, ha="center", va="center", color="gray")
    for ax in axes[3:]:
        ax.set_xlabel(X_LABELS[x_key])
    last = steps[-1]
    figure.suptitle(f"{run_dir.resolve().name}: {len(steps)} steps, last step {last.get('step')}, "
                    f"policy version {last.get('policy_version')}")
    partial = out.with_name(out.name + ".partial")
    figure.savefig(partial, format="png", dpi=100)
    # A viewer or dashboard reading plot.png never sees a half-written file.
    os.replace(partial, out)


def plot_run(run_dir: Path, out: Path | None = None, beside: Path | None = None, minutes: bool = False) -> Path:
    """Draws the run's curves into one PNG (default RUN_DIR/plot.png) and returns its path; with `beside`, another
    run's evaluations on the accuracy panel too (a baseline: the same model without a tool, another algorithm).
    With `minutes` the x axis is wall-clock minutes from the start of training, each run's curves starting after
    its teacher's preparation (summary.json's teacher_preparation_seconds), so runs compare at equal time.

    Raises RunDataError when RUN_DIR/trainer/metrics.jsonl is missing, unreadable or holds no step."""
    run_dir = Path(run_dir)
    x_key = MINUTES if minutes else "step"
    steps, evals = _run_curves(run_dir, x_key)
    if beside is not None:
        beside = Path(beside)
        for dataset, curve in _run_curves(beside, x_key)[1].items():
            evals[f"{dataset}, {beside.resolve().name}"] = curve
    out = Path(out) if out is not None else run_dir / DEFAULT_OUT
    out.parent.mkdir(parents=True, exist_ok=True)
    _draw(run_dir, steps, evals, out, x_key)
    return out


def _run_curves(run_dir: Path, x_key: str = "step") -> tuple[list[dict], dict[str, tuple[list[float], list[float]]]]:
    metrics_path = run_dir / METRICS_FILE
    if not metrics_path.is_file():
        raise RunDataError(f"no training metrics: {metrics_path} does not exist")
    # A trainer restarted from its checkpoint trains the steps after it again: the later row of a step wins.
    latest = {row["step"]: row for row in read_jsonl(metrics_path) if _number(row.get("step")) is not None}
    steps = sorted(latest.values(), key=lambda row: row["step"])
    if not steps:
        raise RunDataError(f"no training step in {metrics_path}")
    start = 0.0
    if x_key == MINUTES:
        start = _place_in_minutes(run_dir, steps, metrics_path)
    eval_path = run_dir / EVAL_FILE
    return steps, eval_curves(read_jsonl(eval_path), steps, x_key, start) if eval_path.is_file() else {}


def _place_in_minutes(run_dir: Path, steps: list[dict], metrics_path: Path) -> float:
    """Sets each step row's MINUTES: its end in minutes from the first step's start, after the teacher's
    preparation; returns where training starts on that axis."""
    first = steps[0]
    began, took = _number(first.get("time")), _number(first.get("step_seconds"))
    if began is None or took is None:
        raise RunDataError(f"{metrics_path}: the first step has no time and step_seconds to place it in minutes")
    summary = run_dir / SUMMARY_FILE
    preparation = None
    if summary.is_file():
        try:
            preparation = _number(json.loads(summary.read_text()).get("teacher_preparation_seconds"))
        except (json.JSONDecodeError, AttributeError):
            raise RunDataError(f"{summary} is not the JSON object `zerobubble up` writes") from None
    start = (preparation or 0.0) / 60
    for row in steps:
        at = _number(row.get("time"))
        if at is not None:
            row[MINUTES] = start + (at - began + took) / 60
    return start


def _cmd_plot(args) -> int:
    try:
        path = plot_run(args.run_dir, args.out, args.beside, args.minutes)
    except RunDataError as exc:
        raise SystemExit(f"zerobubble plot: {exc}") from None
    print(path)
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser("plot", help="draw a run's training curves (and evaluations) into one PNG")
    parser.add_argument("run_dir", type=Path, help="the run folder (holds trainer/metrics.jsonl)")
    parser.add_argument("--out", type=Path, help=f"the PNG to write (default RUN_DIR/{DEFAULT_OUT})")
    parser.add_argument("--beside", type=Path, help="another run folder whose evaluations are drawn beside this "
                        "run's (e.g. the same model without a tool)")
    parser.add_argument("--minutes", action="store_true", help="x axis in wall-clock minutes from the start of "
                        "training, after a teacher's preparation (compares runs at equal time)")
    parser.set_defaults(run=_cmd_plot)
