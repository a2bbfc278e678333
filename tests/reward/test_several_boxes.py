"""Answers written as several boxes, judged as math_verify judges them on its own.

math_verify_boxed_cases.jsonl holds every case of Math-Verify 0.9.0's own test suite (its sdist's tests/)
whose prediction contains a \\boxed: gold, prediction and the label its tests assert.
"""

import json
from pathlib import Path

import pytest
from math_verify import parse, verify

from zerobubble.common.clients.reward import score_request
from zerobubble.reward.extraction import extract_boxed, final_boxes

CASES_FILE = Path(__file__).parent / "math_verify_boxed_cases.jsonl"
CASES = [json.loads(line) for line in CASES_FILE.read_text().splitlines()]


@pytest.mark.parametrize(
    ("text", "boxes"),
    [
        ("so \\boxed{(1,2)}, \\boxed{(2,1)}", ["(1,2)", "(2,1)"]),
        ("\\boxed{1} and \\boxed{-2}", ["1", "-2"]),
        ("\\boxed{1}, \\boxed{2}, or \\boxed{3}.", ["1", "2", "3"]),
        ("\\(\\boxed{1}\\) and \\(\\boxed{-2}\\).", ["1", "-2"]),
        ("$$\\boxed{(3, 3)} \\text{ for part (a) and } \\boxed{(1, 1)}$$", ["(3, 3)", "(1, 1)"]),
        ("\\( y_1 = \\boxed{2x} \\) and \\( y_2 = \\boxed{3x} \\)", ["2x", "3x"]),
        ("\\boxed{-2} \\quad \\text{and} \\quad \\boxed{1}", ["-2", "1"]),
        # Words between boxes outside math end the answer: only the boxes after them count.
        ("\\boxed{1} no no no \\boxed{2}", ["2"]),
        ("first \\boxed{3}. Checking again, \\boxed{4} and \\boxed{5}", ["4", "5"]),
        ("\\boxed{a \\boxed{b}}", ["b"]),
        ("\\boxed{7} and a broken \\boxed{8", ["7"]),
        ("none", []),
    ],
)
def test_final_boxes(text, boxes):
    assert final_boxes(text) == boxes


def test_several_boxes_are_handed_on_together():
    assert extract_boxed("\\boxed{1} and \\boxed{-2}").answer == "\\boxed{1}, \\boxed{-2}"
    assert extract_boxed("thus \\boxed{\\frac{1}{2}}").answer == "\\frac{1}{2}"


def test_unclosed_boxes_cost_one_pass():
    text = "\\boxed{" * 50_000 + "\\boxed{1}"
    assert final_boxes(text) == ["1"]


@pytest.mark.parametrize(
    ("response", "gold", "answer_ok"),
    [
        ("The solutions are \\boxed{(1,2)}, \\boxed{(2,1)}.", "(1,2), (2,1)", True),
        ("So $x = \\boxed{1}$ and $x = \\boxed{-2}$.", "1, -2", True),
        ("\\boxed{1} and \\boxed{-2}", "-2, 1", True),
        ("\\boxed{1} and \\boxed{-2}", "1, -2, 3", False),
        # Hedging over several boxes is a set, not the right answer among wrong ones.
        ("\\boxed{3}, \\boxed{5}", "5", False),
        ("\\boxed{3}. No wait: \\boxed{5}", "5", True),
    ],
)
def test_several_boxes_through_the_service(reward, response, gold, answer_ok):
    result = reward.score("boxed", response, gold)
    assert result.answer_ok is answer_ok, result


def _direct(gold: str, pred: str) -> bool:
    """math_verify used directly, as its README shows."""
    return bool(verify(parse(gold), parse(pred)))


def test_agrees_with_math_verify_tests_at_least_as_well_as_math_verify(reward):
    results = reward.score_batch([score_request("boxed", case["pred"], case["gold"], id=str(i))
                                  for i, case in enumerate(CASES)], timeout=600)
    service = [result.answer_ok == case["expected"] for case, result in zip(CASES, results, strict=True)]
    direct = [_direct(case["gold"], case["pred"]) == case["expected"] for case in CASES]
    several = [i for i, case in enumerate(CASES) if len(final_boxes(case["pred"])) > 1]
    print(f"\nMath-Verify 0.9.0 cases with boxed predictions: service agrees on {sum(service)}/{len(CASES)}, "
          f"math_verify directly on {sum(direct)}/{len(CASES)}; several boxes: "
          f"{sum(service[i] for i in several)}/{len(several)} and {sum(direct[i] for i in several)}/{len(several)}")
    assert len(several) >= 10
    assert all(service[i] for i in several), [CASES[i]["pred"][-120:] for i in several if not service[i]]
    # Where math_verify agrees and the service does not, the answer is outside any box (the case says why).
    behind = [case for case, mine, theirs in zip(CASES, service, direct, strict=True) if theirs and not mine]
    assert all("note" in case for case in behind), [case["pred"][-120:] for case in behind]
