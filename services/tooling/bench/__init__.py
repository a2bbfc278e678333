"""The benchmarks behind `zerobubble bench ...`: they sit above the services and start them as a user would."""

import argparse
import subprocess
from pathlib import Path


def stop_service(process: subprocess.Popen, grace: float = 30.0) -> None:
    """SIGTERM, as a user stops a service, then SIGKILL if it has not gone within `grace`."""
    process.terminate()
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def add_run_folders(parser: argparse.ArgumentParser) -> None:
    """--cache and --workdir of the benches that run the pipeline as `zerobubble up` does."""
    parser.add_argument("--cache", type=Path, default=Path("runs/.assets"),
                        help="where the tiny model and task are kept between runs (as for `zerobubble up`)")
    parser.add_argument("--workdir", type=Path,
                        help="keep the runs' folders (logs, metrics) here (default: a temp dir, removed)")
