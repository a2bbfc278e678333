"""The pieces of the tool environment, in-process: parsing calls in both formats, the calculator's bounds, tool
schemas, the final-answer rules, and a turn of calls becoming tool messages."""

from __future__ import annotations

import pytest

from zerobubble.environment.calculator import CalculatorError, calculator
from zerobubble.environment.calls import parse
from zerobubble.environment.tools import ToolEnvironment, final_answer_rule, tool_schema


def test_hermes_calls_several_per_turn_and_malformed_ones_kept_with_a_reason():
    text = ('<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call> and '
            '<tool_call>{"name": "add", "arguments": "{\\"a\\": 3, \\"b\\": 4}"}</tool_call>'
            "<tool_call>{oops}</tool_call><tool_call>[1]</tool_call><tool_call>{\"name\": \"x\"")
    calls = parse(text, "hermes")
    assert [(c.name, c.arguments) for c in calls[:2]] == [("add", {"a": 1, "b": 2}), ("add", {"a": 3, "b": 4})]
    assert "not JSON" in calls[2].error
    assert "must be" in calls[3].error
    assert "not closed" in calls[4].error
    assert parse("no calls here, just 42", "hermes") == []


def test_compact_calls_take_balanced_parentheses_as_one_argument():
    calls = parse("first @calculator((2+3)*4) then @shout(hi) and @calculator(1+", "compact")
    assert [(c.name, c.text, c.error) for c in calls[:2]] == [("calculator", "(2+3)*4", ""), ("shout", "hi", "")]
    assert "no closing parenthesis" in calls[2].error
    assert parse("mail me at a@b.c", "compact") == []


@pytest.mark.parametrize(("expression", "value"), [("(12 + 30) * 4", "168"), ("7 / 2", "3.5"), ("-2 ** 3", "-8"),
                                                   ("17 // 5 + 17 % 5", "5"), ("1.5 * 2", "3.0")])
def test_the_calculator_computes(expression, value):
    assert calculator(expression) == value


@pytest.mark.parametrize(("expression", "why"), [
    ("2 ** 10 ** 10", "exponents are at most"), ("9 ** 9999", "bits"), ("10 ** 999 * 10 ** 999 * 10 ** 999", "bits"),
    ("1 / 0", "division by zero"), ("__import__('os')", "only numbers"), ("(-8) ** 0.5", "not a real number"),
    ("1e308 * 10", "too large"), ("1 +", "not an arithmetic expression"), ("1" * 2000, "longer than")])
def test_the_calculator_refuses_what_it_must_not_compute(expression, why):
    with pytest.raises(CalculatorError, match=why):
        calculator(expression)


def test_a_tool_schema_is_the_openai_function_shape_from_hints_and_docstring():
    schema = tool_schema(calculator)
    assert schema["type"] == "function"
    assert schema["function"]["name"] == "calculator"
    assert schema["function"]["parameters"]["properties"]["expression"]["type"] == "string"
    assert schema["function"]["parameters"]["required"] == ["expression"]

    def undocumented(x: int) -> int:
        return x

    with pytest.raises(ValueError, match="undocumented"):
        tool_schema(undocumented)


def test_final_answer_rules():
    row = {"ground_truth": "42"}
    assert final_answer_rule("exact")(" 42 ", row) == 1.0
    assert final_answer_rule("exact")("42.0", row) == 1.0
    assert final_answer_rule("exact")("the answer is 42", row) == 0.0
    assert final_answer_rule("last_number")("3 then 42", row) == 1.0
    assert final_answer_rule("last_number")("42 then 3", row) == 0.0
    assert final_answer_rule("boxed")("so \\boxed{42}", row) == 1.0
    assert final_answer_rule("boxed")("so \\boxed{{4}2}", row) == 0.0
    assert final_answer_rule("none")("42", row) == 0.0
    assert final_answer_rule("exact")("42", {}) == 0.0


def test_a_turn_of_calls_becomes_tool_messages_and_a_turn_without_is_the_final_answer():
    def count(text: str) -> int:
        """Count characters.

        Args:
            text: the text
        """
        return len(text)

    env = ToolEnvironment([calculator, count], [tool_schema(calculator), tool_schema(count)], "compact",
                          final_answer_rule("exact"), max_tool_calls=2, max_output_chars=10)
    assert env.reset({"ground_truth": "7"}) is None
    step = env.step("@calculator(3+4) @count(abcdefghijklmnop) @calculator(2**99999)")
    assert step["done"] is False and step["reward"] == 0.0
    assert step["observation"][0] == {"role": "tool", "name": "calculator", "content": "7"}
    assert step["observation"][1]["content"] == "16"
    assert "only 2 tool calls" in step["observation"][2]["content"]
    step = env.step("@calculator(2**99999)")
    assert step["observation"][0]["content"].startswith("error: Cal") and "more characters" in \
        step["observation"][0]["content"]
    final = env.step("7")
    assert final == {"observation": None, "reward": 1.0, "done": True, "info": {"final_answer": True}}
