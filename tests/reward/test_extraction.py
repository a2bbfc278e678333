import pytest

from zerobubble.reward.extraction import extract_boxed, extract_python, extract_think_answer, last_boxed


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{42}.", "42"),
        ("\\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{\\left\\{1,2\\right\\}}", "\\left\\{1,2\\right\\}"),
        ("\\fbox{7}", "7"),
        ("\\boxed {x+1}", "x+1"),
        ("\\boxed{ 3 }", "3"),
        ("no box here", None),
        ("\\boxed{unclosed", None),
        ("\\boxed{5} and a broken \\boxed{6", "5"),
    ],
)
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


def test_boxed_format_is_presence_of_a_complete_box():
    assert extract_boxed("\\boxed{1}").format_ok
    assert not extract_boxed("answer: 1").format_ok


@pytest.mark.parametrize(
    ("text", "format_ok", "answer"),
    [
        ("<think>a</think><answer>4</answer>", True, "4"),
        ("<think>\na\n</think>\n<answer>\n4\n</answer>\n", True, "4"),
        ("<think>a</think><answer>4</answer> trailing words", False, "4"),
        ("<answer>4</answer><think>a</think>", False, "4"),
        ("<think>a</think><answer>3</answer><answer>4</answer>", False, "4"),
        ("<think>a</think><think>b</think><answer>4</answer>", False, "4"),
        ("<think>a</think>4", False, None),
        ("<think>a</think><answer>4", False, None),
    ],
)
def test_think_answer_tags(text, format_ok, answer):
    extraction = extract_think_answer(text)
    assert (extraction.format_ok, extraction.answer) == (format_ok, answer)


def test_python_block_is_the_last_one():
    text = "```python\nprint(1)\n```\nbetter:\n```python3\nprint(2)\n```\n```text\nnot code\n```"
    assert extract_python(text).answer == "print(2)\n"
    assert extract_python("```\nprint(1)\n```").answer is None


def test_format_cases_file(shared_data):
    """Labelled format cases. The labels come from a stricter rule (newlines around tag contents);
    ours accepts the tags without newlines, so it may only differ by accepting more positives."""
    import json

    rows = [json.loads(line) for line in (shared_data / "reward" / "format_cases.jsonl").read_text().splitlines()]
    disagreements = [
        row["response"] for row in rows if extract_think_answer(row["response"]).format_ok != row["expected_format_ok"]
    ]
    assert not [r for r in rows if not r["expected_format_ok"] and extract_think_answer(r["response"]).format_ok]
    assert not disagreements, disagreements
