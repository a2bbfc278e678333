"""The trainer as several data-parallel processes on this host, under torch's elastic agent (torchrun).

`zerobubble up` with `trainer_processes: N` starts `python -m zerobubble.tooling.launcher.data_parallel N --config FILE
...` as the trainer. That process is torchrun's agent (`torch.distributed.run`: a standalone
rendezvous on loopback, gloo or NCCL ranks); it follows the launcher as every service does, and N ranks each run
`zerobubble serve trainer`. torch starts each rank in a session of its own with the launcher's descriptors
closed, so a rank cannot follow the launcher itself: it follows the agent (it is sent SIGTERM when the agent
goes). The agent restarts nothing: a rank that dies ends the whole trainer, which `up` restarts with resume, as
it would a single process.

Only rank 0 announces the trainer's address to the launcher (ready.py); the other ranks log warnings and errors
only, into the same log.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

from zerobubble.tooling.launcher.ready import READY_FILE
from zerobubble.tooling.launcher.tether import follow_launcher

RANK_COMMAND = "rank"
# torch's agent gives its ranks this long to stop after it passes them a SIGTERM, then kills them.
AGENT_SHUTDOWN_SECONDS = 30.0
AGENT_PID_ENV = "ZEROBUBBLE_TRAINER_AGENT_PID"
_PR_SET_PDEATHSIG = 1


def agent_command(processes: int, serve_args: list[str]) -> list[str]:
    """The command line of a trainer of `processes` ranks; `serve_args` follow `zerobubble serve trainer`."""
    return [sys.executable, "-m", "zerobubble.tooling.launcher.data_parallel", str(processes), *serve_args]


def torchrun_args(processes: int, serve_args: list[str]) -> list[str]:
    return ["--nproc-per-node", str(processes), "--standalone", "--max-restarts", "0", "--monitor-interval", "0.5",
            "-m", "zerobubble.tooling.launcher.data_parallel", RANK_COMMAND, "serve", "trainer", *serve_args]


def run_agent(processes: int, serve_args: list[str]) -> None:
    from torch.distributed import run

    follow_launcher(AGENT_SHUTDOWN_SECONDS)
    os.environ[AGENT_PID_ENV] = str(os.getpid())
    run.main(torchrun_args(processes, serve_args))


def run_rank(cli_args: list[str]) -> None:
    from zerobubble.tooling.cli import main

    # The kernel sends SIGTERM when the agent dies, however it dies (kill -9 included): the rank then stops as on
    # a launcher's SIGTERM. Set before the check, so an agent gone in between is seen by the check.
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if str(os.getppid()) != os.environ.get(AGENT_PID_ENV):
        sys.exit("the trainer's agent is gone")
    if os.environ.get("RANK", "0") != "0":
        os.environ.pop(READY_FILE, None)
        os.environ["ZEROBUBBLE_LOG"] = "WARNING"
        # Its stdout would only say its own address, which nobody calls.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(main(cli_args))


if __name__ == "__main__":
    if sys.argv[1] == RANK_COMMAND:
        run_rank(sys.argv[2:])
    else:
        run_agent(int(sys.argv[1]), sys.argv[2:])
