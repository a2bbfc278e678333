"""`zerobubble bench refusals`: how long `zerobubble up` and `zerobubble serve` take to refuse bad input (a mistyped
key, an unknown preset, a missing model folder or data file, a warm-up longer than the run) on a loaded machine.

Each refusal is the real command in a fresh interpreter, timed from its start to its exit, `--repeats` times. The
load is the bench's own: `--load` processes spinning on the CPU, started before the first measurement and stopped
after the last (the machine's 1-minute load average while it ran is reported; other work on the machine adds to it).
The baseline, under the same load in the same run, is a bare interpreter's start (`python -c pass`): a refusal's
ratio to it is what the command adds. Each command's CPU seconds are reported too: on a machine shared with other
work the wall time follows that work's load, the CPU time does not.

The commands keep their schemas' keys in a cache of the bench's own (see launcher/early_refusal.py): each case runs
once before it is timed, and that first run, which may have made the cache, is reported apart (`first_run_s`).
A warm-up longer than the run is found from the data's rows, which are read, and is outside the 1-second goal.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from zerobubble.tooling.launcher.early_refusal import CACHE_ENV

# Each case: the command line after `zerobubble` ({tmp}: the bench's folder, with rows.jsonl of 400 rows), and what
# its refusal must name.
WARM_UP = "up: warm-up longer than the run"
CASES = {
    "up: mistyped key": (["up", "--set", "trainer.max_stpes=3"], "max_stpes"),
    "up: unknown preset": (["up", "--set", "run.algorithm=GRPPO"], "run.algorithm"),
    "up: missing model": (["up", "-m", "{tmp}/no-model", "-d", "{tmp}/rows.jsonl", "--set", "run_dir={tmp}/run"],
                          "model: no such folder"),
    "up: missing data": (["up", "-d", "{tmp}/no.jsonl", "--set", "run_dir={tmp}/run"], "train_data"),
    WARM_UP: (["up", "-d", "{tmp}/rows.jsonl", "--set", "trainer.max_steps=1", "--set",
                                         "run_dir={tmp}/run"], "trainer.max_steps"),
    "serve trainer: missing model": (["serve", "trainer", "--set", "model={tmp}/no-model"], "model: no such folder"),
    "serve buffer: missing data": (["serve", "buffer", "--set", "prompts.path={tmp}/no.jsonl"], "prompts.path"),
}
BASELINE = "python -c pass"
SPIN = "while True: pass"
# The bound on one command: a refusal that takes longer is reported as such, not waited for.
COMMAND_TIMEOUT_S = 60.0


def timed(command: list[str], cwd: Path) -> tuple[float, float, subprocess.CompletedProcess]:
    """Wall seconds and CPU seconds (user + system) of the command. The CPU figure does not move with the machine's
    load: the spinners are children too, but count only once waited for, after the last measurement."""
    env = {**os.environ, CACHE_ENV: str(cwd / "cache")}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, result


def measure_case(argv: list[str], named: str, repeats: int, cwd: Path) -> dict:
    first, _, _ = timed([sys.executable, "-m", "zerobubble", *argv], cwd)
    seconds, cpu, refused, message = [], [], True, ""
    for _ in range(repeats):
        elapsed, used, result = timed([sys.executable, "-m", "zerobubble", *argv], cwd)
        seconds.append(elapsed)
        cpu.append(used)
        refused = refused and result.returncode == 2 and named in result.stderr
        message = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else ""
    return {"first_run_s": round(first, 3), "median_s": round(statistics.median(seconds), 3),
            "max_s": round(max(seconds), 3),
            "cpu_median_s": round(statistics.median(cpu), 3),
            "refused_naming_the_field": refused, "message": message[:200]}


def bench_refusals(*, load: int = 4, repeats: int = 5) -> dict:
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(load)]
    try:
        time.sleep(1.0 if load else 0.0)  # the spinners running before the first measurement
        with tempfile.TemporaryDirectory(prefix="zb-bench-refusals-") as tmp:
            folder = Path(tmp)
            (folder / "rows.jsonl").write_text((json.dumps({"prompt": "1+1?", "gt_answer": "2"}) + "\n") * 400)
            baseline = [timed([sys.executable, "-c", "pass"], folder)[:2] for _ in range(repeats)]
            cases = {name: measure_case([arg.format(tmp=folder) for arg in argv], named, repeats, folder)
                     for name, (argv, named) in CASES.items()}
        load_average = os.getloadavg()[0]
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    base = round(statistics.median(wall for wall, _ in baseline), 3)
    base_cpu = round(statistics.median(used for _, used in baseline), 3)
    for figures in cases.values():
        figures["vs_baseline"] = round(figures["median_s"] / base, 1)
    slowest = max(figures["max_s"] for name, figures in cases.items() if name != WARM_UP)
    return {"cores": os.cpu_count(), "load_processes": load, "load_average_1m": round(load_average, 2),
            "repeats": repeats, "baseline": {"command": BASELINE, "median_s": base, "cpu_median_s": base_cpu},
            "cases": cases, "slowest_s": slowest, "all_under_1s": slowest < 1.0,
            "goal": "every refusal but the warm-up's (which reads the data) under 1 s"}


def _count(least: int):
    def parse(text: str) -> int:
        value = int(text)
        if value < least:
            raise argparse.ArgumentTypeError(f"at least {least}")
        return value

    return parse


def register_bench(benches) -> None:
    parser = benches.add_parser("refusals", help="seconds for up and serve to refuse bad input on a loaded machine, "
                                "vs a bare interpreter's start")
    parser.add_argument("--load", type=_count(0), default=4, help="CPU-spinning processes started for the "
                        "measurement")
    parser.add_argument("--repeats", type=_count(1), default=5, help="runs of each command (median and max reported)")
    parser.set_defaults(measure=lambda args: bench_refusals(load=args.load, repeats=args.repeats))
