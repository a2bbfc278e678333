"""Labelled programs (correct and mutated solutions) run in the sandbox through the real service."""

import json
from fractions import Fraction

import pytest
from reward_helpers import start_reward

from zerobubble.common.clients.reward import RewardClient, score_request


@pytest.fixture(scope="module")
def roomy_reward():
    # One labelled solution needs ~5 s on a test; give programs room so only wrong ones fail.
    app = start_reward(**{"sandbox.wall_seconds": 30.0, "sandbox.cpu_seconds": 30, "math.workers": 1})
    with RewardClient(app.address) as client:
        yield client
    app.stop(grace=0)


def test_code_cases(shared_data, roomy_reward):
    rows = [json.loads(line) for line in (shared_data / "reward" / "code_cases.jsonl").read_text().splitlines()]
    requests = []
    for i, row in enumerate(rows):
        for kind in ("solution", "wrong_solution"):
            requests.append(score_request("code", f"```python\n{row[kind]}```", test_cases=row["test_cases"],
                                          id=f"{i}:{kind}", partial_credit=True))
    results = {r.id: r for r in roomy_reward.score_batch(requests, timeout=900)}
    failures = []
    for i, row in enumerate(rows):
        right, wrong = results[f"{i}:solution"], results[f"{i}:wrong_solution"]
        if right.reward != 1.0:
            failures.append(f"{row['source'][:60]}: correct solution scored {right.reward} ({right.reason})")
        if wrong.reward >= 1.0:
            failures.append(f"{row['source'][:60]}: wrong solution scored {wrong.reward}")
        expected = Fraction(row["wrong_solution_expected_pass_fraction"])
        if Fraction(wrong.tests_passed, wrong.tests_total) != expected:
            failures.append(f"{row['source'][:60]}: wrong solution passed {wrong.tests_passed}/{wrong.tests_total},"
                            f" labelled {expected}")
    assert not failures, "\n".join(failures)
