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


class CountdownInteraction:
    """An async interaction (verl's method shape) that asks for another try until the third answer; it records
    the messages it was shown and which instances are still open."""

    def __init__(self, config):
        self.tries = int(config.get("tries", 3))
        self.open, self.seen = {}, []

    async def start_interaction(self, instance_id, **kwargs):
        self.open[instance_id] = 0
        return instance_id

    async def generate_response(self, instance_id, messages, **kwargs):
        self.open[instance_id] += 1
        self.seen.append(messages)
        done = self.open[instance_id] >= self.tries
        return done, "again" if not done else "done", float(self.open[instance_id]), {}

    async def finalize_interaction(self, instance_id, **kwargs):
        del self.open[instance_id]


calls = {"count": 0}


def counted_calculator(expression: str) -> str:
    """The calculator, counting its calls in this process (the TP test checks that only the group's rank 0 runs
    tools)."""
    from hybridrl.tools.builtin import calculator

    calls["count"] += 1
    return calculator(expression)
