"""The calculator (exact big-number arithmetic, bounded, errors as strings), the python tool and the registry."""

import json
import sys

import pytest

from hybridrl.tools.builtin import TOOL_SPECS, TOOLS, calculator, call_tool, python_executor


@pytest.mark.parametrize("expr, expected", [
    ("123456789123456789 * 987654321987654321", str(123456789123456789 * 987654321987654321)),
    ("2 ** 200 - 1", str(2 ** 200 - 1)),
    ("-(3 + 4) * 2", "-14"),
    ("7 // 2 + 7 % 2", "4"),
    ("10 / 4", "2.5"),
    ("10 ** 30 / 10 ** 10", str(10 ** 20)),  # exact integer division stays exact
    ("2^10", "1024"),
    ("1,000,000 * 3", "3000000"),
    ("0.1 + 0.2", repr(0.1 + 0.2)),
    ("2 ** -1", "0.5"),
])
def test_calculator_values(expr, expected):
    assert calculator(expr) == expected


def test_calculator_big_results_beyond_the_str_limit():
    out = calculator("7 ** 10000")  # 8451 digits: above Python's 4300-digit str() limit
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        assert out == str(7 ** 10000) and len(out) == 8451
    finally:
        sys.set_int_max_str_digits(limit)


@pytest.mark.parametrize("expr, fragment", [
    ("9 ** 9 ** 9", "too large"),
    ("10 ** 20000", "too large"),
    ("1 / 0", "division by zero"),
    ("5 % 0", "division by zero"),
    ("__import__('os').system('ls')", "function call"),
    ("x + 1", "name 'x'"),
    ("2 +", "invalid expression"),
    ("", "empty"),
    ("'a' * 3", "only numbers"),
    ("(-8) ** 0.5", "not a real number"),
    ("10.0 ** 400", "too large"),
    ("-" * 150 + "1", "nested too deeply"),
])
def test_calculator_errors(expr, fragment):
    out = calculator(expr)
    assert out.startswith("Error:") and fragment in out, out


def test_python_tool_and_registry():
    assert python_executor("print(6 * 7)").strip() == "42"
    assert python_executor("import socket; socket.socket()").startswith("Error: operation not allowed")
    assert "ZeroDivisionError" in python_executor("1/0")
    assert python_executor("x = 1") .startswith("(no output")
    assert set(TOOLS) == {"calculator", "python"} == {s["function"]["name"] for s in TOOL_SPECS}
    json.dumps(TOOL_SPECS)
    assert call_tool("calculator", '{"expression": "2**64"}') == str(2 ** 64)
    assert call_tool("python", {"code": "print('hi')"}).strip() == "hi"
    assert call_tool("search", {}).startswith("Error: unknown tool")
    assert call_tool("calculator", "{bad json").startswith("Error: tool arguments are not valid JSON")
    assert "missing ['expression']" in call_tool("calculator", {"expr": "1"})
