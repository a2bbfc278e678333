"""Built-in examples of each verifier, scored by `zerobubble demo` (and checked in the tests)."""

from __future__ import annotations

from zerobubble.common.clients.reward import score_request

SQUARES = {"inputs": ["3\n", "12\n"], "outputs": ["9\n", "144\n"]}
_PROGRAM = "```python\nn = int(input())\nprint({expr})\n```"

# (what it shows, expected answer_ok, request)
EXAMPLES = [
    ("boxed fraction equals decimal", True,
     score_request("boxed", "Half of one is \\boxed{\\frac{1}{2}}.", "0.5")),
    ("boxed thousands separator", True,
     score_request("boxed", "So the total is \\boxed{7,425,000}", "7425000")),
    ("boxed wrong number", False, score_request("boxed", "I get \\boxed{41}.", "42")),
    ("boxed missing", False, score_request("boxed", "The answer is 42.", "42")),
    ("tags correct", True,
     score_request("think_answer_tags", "<think>2+2 is 4</think><answer>4</answer>", "4")),
    ("tags answer right, format broken", True,
     score_request("think_answer_tags", "<answer>4</answer> because <think>2+2</think>", "4")),
    ("tags wrong answer", False,
     score_request("think_answer_tags", "<think>guess</think><answer>5</answer>", "4")),
    ("code correct", True, score_request("code", _PROGRAM.format(expr="n * n"), test_cases=SQUARES)),
    ("code wrong", False, score_request("code", _PROGRAM.format(expr="n + n"), test_cases=SQUARES)),
    ("code endless loop", False,
     score_request("code", "```python\nwhile True:\n    pass\n```", test_cases=SQUARES)),
]
