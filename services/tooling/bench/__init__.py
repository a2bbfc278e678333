"""The benchmarks behind `zerobubble bench ...`: they sit above the services and start them as a user would."""

import subprocess


def stop_service(process: subprocess.Popen, grace: float = 30.0) -> None:
    """SIGTERM, as a user stops a service, then SIGKILL if it has not gone within `grace`."""
    process.terminate()
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
