"""The Python API beside `zerobubble up`: `zerobubble.run(config)` runs the same checks and the same run, printing
the same progress, and returns the outcome instead of an exit code."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zerobubble.common.config import load_config
from zerobubble.tooling.configs import DEMO
from zerobubble.tooling.launcher.commands import launch, resumed_config
from zerobubble.tooling.launcher.config import UpConfig
from zerobubble.tooling.launcher.run_folder import SUMMARY_FILE


@dataclass(frozen=True)
class RunResult:
    exit_code: int  # as `up`'s: 0 done (or nothing left to do), 1 a service failed or the folder is in use, 130
    run_dir: Path
    summary: dict | None  # eval_before, eval_after, version_before, version_after, wall_seconds, plot; None: none

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def run(config: UpConfig | dict[str, Any] | str | Path | None = None, *, overrides: dict[str, Any] | None = None,
        resume: str | Path | None = None, overwrite: bool = False) -> RunResult:
    """Run the pipeline to its end, as `zerobubble up` does.

    config: an UpConfig, its fields as a dict, or a YAML file (None: the demo's); overrides: dotted keys, as
    `--set` takes them (`{"trainer.max_steps": 20}`); resume: a run folder to continue (its own config, with
    `overrides`); overwrite: replace the run the folder holds. Bad input raises ConfigError, naming the field,
    before anything starts."""
    overrides = dict(overrides or {})
    if resume is not None:
        config = resumed_config(Path(resume), overrides)
    elif isinstance(config, UpConfig | dict):
        tree = config.model_dump(mode="json", exclude_unset=True) if isinstance(config, UpConfig) else config
        config = load_config(UpConfig, None, {**copy.deepcopy(tree), **overrides})
    else:
        # A missing file (the demo's included) is a ConfigError naming it.
        config = load_config(UpConfig, config or DEMO, overrides)
    code = launch(config, resume=resume is not None, overwrite=overwrite)
    summary_path = config.run_dir / SUMMARY_FILE
    summary = json.loads(summary_path.read_text()) if code == 0 and summary_path.exists() else None
    return RunResult(code, config.run_dir, summary)

