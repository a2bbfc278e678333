"""The verification pool with real math_verify: verdicts, a real hang, a real crash."""

import os
import signal
import threading
import time

import pytest

from zerobubble.reward.math_judge import judge, wrap_gold
from zerobubble.reward.math_pool import VerifierPool

# Deep power towers make sympy evaluate for a very long time: a genuine hang of the verifier.
HANGS = ("9^{9^{9^{9}}}-9^{9^{9^{9}}}", "0")


@pytest.fixture(scope="module")
def pool():
    pool = VerifierPool(workers=2, timeout_seconds=2.0)
    pool.wait_ready()
    yield pool
    pool.close()


def test_wrap_gold():
    assert wrap_gold("7425000") == "$7425000$"
    assert wrap_gold("$28\\%$") == "$28\\%$"
    assert wrap_gold("so \\boxed{3}") == "so \\boxed{3}"


@pytest.mark.parametrize(
    ("gold", "answer", "ok"),
    [("0.5", "\\frac{1}{2}", True), ("7425000", "7,425,000", True), ("42", "41", False),
     ("x^2+2x+1", "(x+1)^2", True), ("$\\boxed{2,3}$", "$\\boxed{2,3}$", True)],
)
def test_judge_in_process(gold, answer, ok):
    assert judge(gold, answer)[0] is ok


def test_unparseable_gold_is_a_parse_error():
    assert judge("\\frac{", "1") == (False, "parse_error")


def test_verdicts_through_the_pool(pool):
    assert pool.verify("0.5", "\\frac{1}{2}").answer_ok
    assert not pool.verify("42", "41").answer_ok


def test_hang_is_timed_out_and_worker_replaced(pool):
    before = set(pool.worker_pids())
    started = time.monotonic()
    verdict = pool.verify(*HANGS)
    assert verdict.reason == "timeout" and not verdict.answer_ok
    assert time.monotonic() - started < pool.timeout_seconds + 2
    assert set(pool.worker_pids()) != before
    assert pool.verify("2", "2").answer_ok


def test_crashed_worker_is_answered_and_replaced(pool):
    replaced = pool.replaced
    outcome = {}
    caller = threading.Thread(target=lambda: outcome.setdefault("v", pool.verify(*HANGS)))
    before = set(pool.worker_pids())
    caller.start()
    time.sleep(0.5)
    # Kill every worker: whichever took the item dies mid-verification.
    for pid in before:
        os.kill(pid, signal.SIGKILL)
    caller.join(60)
    assert outcome["v"].reason == "worker_crash"
    assert pool.replaced > replaced
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        verdict = pool.verify("3", "3")
        if verdict.answer_ok:
            break
    assert verdict.answer_ok


def test_parallel_items_all_answered(pool):
    results = []
    threads = [threading.Thread(target=lambda i=i: results.append(pool.verify(str(i), str(i)))) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(results) == 8 and all(r.answer_ok for r in results)
