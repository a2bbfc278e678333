"""The calculator tool: arithmetic on integers and floats, read with `ast` and evaluated node by node (never
eval), with bounds on what one expression may cost: its length, its exponents and the size of the integers it
makes (`2**10**10` is refused before it is computed, not after minutes of it)."""

from __future__ import annotations

import ast
import math
import operator
import threading

MAX_EXPRESSION_CHARS = 1000
MAX_EXPONENT = 10_000
MAX_INTEGER_BITS = 4096
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
# CPython 3.11 keeps the depth counter of ast.parse's tree building in one place for all threads: two parses that
# interleave (a garbage collection in one lets the other run) fail with "SystemError: AST constructor recursion
# depth mismatch" (python/cpython#106905). The service calls the calculator from many threads: one parse at a time.
_PARSE = threading.Lock()


class CalculatorError(ValueError):
    pass


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression with + - * / // % ** and parentheses on integers and decimals.

    Args:
        expression: the expression, e.g. "(12 + 30) * 4"
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        with _PARSE:
            tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise CalculatorError(f"not an arithmetic expression: {expression[:80]!r}") from None
    return repr(_evaluate(tree.body))


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        elif isinstance(node.op, ast.Mult) and isinstance(left, int) and isinstance(right, int):
            _check_bits(left.bit_length() + right.bit_length())
        try:
            value = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
        except OverflowError:
            raise CalculatorError("the result is too large") from None
        if isinstance(value, complex):
            raise CalculatorError("the result is not a real number")
        if isinstance(value, float) and not math.isfinite(value):
            raise CalculatorError("the result is too large")
        if isinstance(value, int):
            _check_bits(value.bit_length())
        return value
    raise CalculatorError(f"only numbers and + - * / // % ** are allowed, not {type(node).__name__}")


def _check_power(base: int | float, exponent: int | float) -> None:
    if abs(exponent) > MAX_EXPONENT:
        raise CalculatorError(f"exponents are at most {MAX_EXPONENT}")
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0:
        _check_bits(base.bit_length() * exponent)


def _check_bits(bits: int) -> None:
    if bits > MAX_INTEGER_BITS:
        raise CalculatorError(f"the result would have more than {MAX_INTEGER_BITS} bits")
