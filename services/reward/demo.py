"""`zerobubble demo`: start the reward service on loopback and score the built-in examples."""

from __future__ import annotations

from zerobubble.reward.cli_score import as_dict, print_table
from zerobubble.reward.examples import EXAMPLES
from zerobubble.reward.local import reward_client


def run_demo() -> int:
    # A short time limit so the endless-loop example does not hold the table up.
    with reward_client(overrides=["sandbox.wall_seconds=2", "sandbox.cpu_seconds=2"]) as client:
        listing = client.list_verifiers()
        results = client.score_batch([request for _, _, request in EXAMPLES])
    rows = [{"verifier": r.verifier, "response": r.response} for _, _, r in EXAMPLES]
    names = ", ".join(v.name + ("" if v.available else f" (off: {v.unavailable_reason})") for v in listing.verifiers)
    print_table(rows, [as_dict(r) for r in results], title=f"reward service demo - verifiers: {names}",
                notes=[what for what, _, _ in EXAMPLES])
    unexpected = [what for (what, expected, _), r in zip(EXAMPLES, results, strict=True) if r.answer_ok != expected]
    if unexpected:
        print(f"unexpected verdicts: {', '.join(unexpected)}")
        return 1
    return 0
