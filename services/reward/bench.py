"""`zerobubble bench reward`: math scores/s with 1 worker and with N, and sandboxed programs/s
against bare `python3 -c pass` spawns of the same interpreter at the same concurrency, all measured in one run."""

from __future__ import annotations

import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

from zerobubble.reward.client import score_request
from zerobubble.reward.config import SandboxConfig
from zerobubble.reward.local import reward_client
from zerobubble.reward.sandbox import CodeSandbox

# Answers in several notations so the measurement exercises real parsing, not one cached case.
_MATH = [
    ("\\frac{1}{2}", "0.5"), ("7425000", "7,425,000"), ("\\sqrt{2}", "\\sqrt{2}"), ("3", "4"),
    ("x^2+2x+1", "(x+1)^2"), ("\\pi", "3.14159"), ("(1,2)", "(1, 2)"), ("\\frac{3}{4}", "75\\%"),
]
_PROGRAM = "```python\nimport sys\nprint(sum(int(x) for x in sys.stdin.read().split()))\n```"


def _math_requests(count: int):
    return [
        score_request("boxed", f"Step {i}: so \\boxed{{{pred}}}", gold, id=str(i))
        for i, (gold, pred) in ((i, _MATH[i % len(_MATH)]) for i in range(count))
    ]


def _math_rate(workers: int, count: int) -> float:
    with reward_client(overrides=[f"math.workers={workers}", "sandbox.slots=1"]) as client:
        client.score_batch(_math_requests(len(_MATH)))
        start = time.perf_counter()
        client.score_batch(_math_requests(count))
        return count / (time.perf_counter() - start)


def _code_rate(slots: int, count: int) -> float:
    tests = {"inputs": ["1 2 3\n"], "outputs": ["6\n"]}
    requests = [score_request("code", _PROGRAM, test_cases=tests, id=str(i)) for i in range(count)]
    with reward_client(overrides=[f"sandbox.slots={slots}", "math.workers=1"]) as client:
        client.score_batch(requests[:slots])
        start = time.perf_counter()
        results = client.score_batch(requests)
        elapsed = time.perf_counter() - start
    if not all(r.answer_ok for r in results):
        raise RuntimeError(f"benchmark program failed in the sandbox: {results[0].reason}")
    return count / elapsed


def _spawn_rate(python: str, parallel: int, count: int) -> float:
    def spawn(_):
        subprocess.run([python, "-c", "pass"], check=True)

    with ThreadPoolExecutor(parallel) as pool:
        start = time.perf_counter()
        list(pool.map(spawn, range(count)))
        return count / (time.perf_counter() - start)


def bench_reward(items: int = 400, programs: int = 40) -> dict:
    cores = os.cpu_count() or 1
    one = _math_rate(1, items)
    many = _math_rate(cores, items)
    code = _code_rate(cores, programs)
    # The baseline spawns the interpreter the sandbox runs programs with, not a PATH shim.
    python = CodeSandbox(SandboxConfig()).python
    spawn = _spawn_rate(python, cores, programs)
    figures = {
        "cores": cores,
        "math_scores_per_s_1_worker": round(one, 1),
        f"math_scores_per_s_{cores}_workers": round(many, 1),
        "math_speedup": round(many / one, 2),
        "code_programs_per_s": round(code, 1),
        "bare_python_spawns_per_s": round(spawn, 1),
        "python": python,
        "code_vs_bare_spawn_ratio": round(code / spawn, 3),
    }
    from zerobubble.reward.bench_http import bench_http_vs_grpc  # it reuses _MATH from here

    figures.update(bench_http_vs_grpc(items))
    for name, value in figures.items():
        print(f"{name:>32}: {value}")
    return figures
