"""A run folder belongs to one run. `up` on a folder that holds a run refuses (it would replay the old run's
write-ahead log into a fresh model and append to its metrics) unless told to continue it (`--resume`) or to
replace it (`--overwrite`); a resume refuses a changed model before anything is written.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from zerobubble.common.config import ConfigError
from zerobubble.tooling.launcher.config import UpConfig
from zerobubble.tooling.launcher.tether import in_use
from zerobubble.tooling.plot import SUMMARY_FILE

CONFIG = Path("configs") / "up.yaml"
# Everything a run writes into its folder (up.lock stays: the launcher that replaces a run holds it).
RUN_ENTRIES = ("configs", "logs", "eval", "trainer", "buffer-wal", "plot.png", SUMMARY_FILE)
# Logs alone are no run: a start that failed leaves them for the user to read, and the next try appends to them.
LOGS = "logs"


def holds_run(run_dir: Path) -> bool:
    return any((run_dir / entry).exists() for entry in RUN_ENTRIES if entry != LOGS)


def check_fresh(config: UpConfig, *, overwrite: bool) -> None:
    """A new run needs a folder without a run in it, unless it is to replace that run."""
    run_dir = config.run_dir
    # A live run in the folder is reported when up claims it (naming its processes), as for a resume.
    if overwrite or in_use(run_dir) is not None or not holds_run(run_dir):
        return
    raise ConfigError(f"run_dir: {run_dir} holds a run already: continue it with --resume {run_dir}, start a new "
                      f"one in a fresh folder (--set run_dir=NEW_FOLDER), or replace it with --overwrite")


def clear(run_dir: Path, keep: tuple[str, ...] = ()) -> None:
    """What an earlier run left in `run_dir`, for `--overwrite` (called with the folder held), but `keep`."""
    for entry in RUN_ENTRIES:
        if entry in keep:
            continue
        path = run_dir / entry
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def forget_failed_start(run_dir: Path) -> bool:
    """After a new run's start failed: unless a step was trained, what it wrote goes but its logs, so that trying
    again needs no --overwrite. Whether the folder is free."""
    if (run_dir / "trainer" / "metrics.jsonl").exists() or steps_done(run_dir):
        return False
    clear(run_dir, keep=(LOGS,))
    return True


def saved_config(run_dir: Path) -> Path:
    path = run_dir / CONFIG
    if not path.exists():
        raise ConfigError(f"--resume {run_dir}: no run there ({path} is missing)")
    return path


def check_resume(config: UpConfig, saved: UpConfig) -> None:
    """A resume continues the same policy: its weights are the saved run's checkpoints, which another model (or
    another tiny model) cannot load."""
    if config.model != saved.model:
        raise ConfigError(f"model: the run in {saved.run_dir} trained {saved.model or 'the tiny model'}, and its "
                          f"checkpoints cannot be loaded into {config.model or 'the tiny model'}: resume it with "
                          "its own model, or start the new model in a fresh folder")
    if config.model is None and config.tiny_model != saved.tiny_model:
        raise ConfigError(f"tiny_model: the run in {saved.run_dir} trained another tiny model "
                          f"({saved.tiny_model.model_dump()}): resume it with its own settings, or start the new "
                          "one in a fresh folder")


def steps_done(run_dir: Path) -> int:
    """Training steps of the run's newest complete checkpoint (0: none)."""
    from zerobubble.trainer.checkpoints import latest_checkpoint, step_of

    newest = latest_checkpoint(run_dir / "trainer" / "checkpoints")
    return (step_of(newest) or 0) if newest is not None else 0


def nothing_left(config: UpConfig) -> str | None:
    """Why resuming the run would train nothing, when it would not."""
    max_steps = config.trainer.get("max_steps")
    if max_steps is None:
        return None
    done = steps_done(config.run_dir)
    if done < max_steps:
        return None
    return (f"the run in {config.run_dir} has trained its {done} steps (trainer.max_steps={max_steps}): nothing "
            f"left to do; to train further, resume with a higher limit (--set trainer.max_steps={done + max_steps})")
