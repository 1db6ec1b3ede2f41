"""Tool functions the multi-turn tests name in their tool configs (class_name multi_turn_tools.<name>)."""

import threading
import time

from hybridrl.tools.builtin import run_python_tool

_lock = threading.Lock()
active = {"now": 0, "max": 0}


def sandbox_loop(expression: str):
    """Runs an endless loop in the sandbox, which kills it after 1 s."""
    text, result = run_python_tool("while True:\n    pass", timeout_s=1.0)
    return text, "timeout" if result.killed_reason == "timeout" else "error"


def hang(expression: str) -> str:
    time.sleep(30)
    return "never seen"


def crash(expression: str) -> str:
    raise RuntimeError(f"cannot evaluate {expression}")


def long_answer(expression: str) -> str:
    return "0123456789" * 100


def slow_square(expression: str) -> str:
    """Answers after 0.3 s, recording how many calls ran at once."""
    with _lock:
        active["now"] += 1
        active["max"] = max(active["max"], active["now"])
    time.sleep(0.3)
    with _lock:
        active["now"] -= 1
    return "42"
