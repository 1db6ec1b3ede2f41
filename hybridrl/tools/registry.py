"""Tools for multi-turn rollouts, loaded from the YAML file `actor_rollout_ref.rollout.multi_turn.tool_config_path`.

The file follows verl's tool config (a `tools:` list of `class_name`, `config`, `tool_schema`), minus what needs
services hybridrl does not run:

    tools:
      - class_name: hybridrl.tools.builtin.calculator     # a built-in, by name: its schema is TOOL_SPECS'
        config: {type: native, timeout_s: 5}
      - class_name: hybridrl.tools.builtin.python         # code in the sandbox (tools/sandbox.py)
        config: {type: native, timeout_s: 10, memory_mb: 512, required_layers: all}
      - class_name: my_package.my_module.lookup           # any function taking the arguments as keywords -> str
        config: {type: native, timeout_s: 5}
        tool_schema: {type: function, function: {name: lookup, description: ..., parameters: {...}}}
      - class_name: my_package.my_tools.Gsm8kTool         # a class with verl's BaseTool interface
        config: {type: native, timeout_s: 5}              # (the whole mapping goes to the class, as verl passes it)
        tool_schema: {type: function, function: {name: calc_gsm8k_reward, ...}}

Choices:
- `class_name` names a function or a class. A function is called with the arguments as keywords and returns the
  answer (a str). A class must have verl's BaseTool interface (`create` and `execute` methods; duck-typed, verl
  need not be installed; tools/class_tools.py): one instance is built at load with `(config, tool_schema)`, and
  each call is a create/execute/release session on it, with the sample's `create_kwargs` (verl's
  `extra_info.tools_kwargs.<tool name>.create_kwargs`, e.g. the ground truth; {} when the caller has none); the
  step reward execute returns is kept in `ToolOutcome.reward`. Any other class is refused at load. `config.type`
  must be `native` (verl's `mcp` needs MCP servers: refused, named).
- Each call is checked against the tool's schema (required and unknown arguments) before it runs, and always
  yields a `ToolOutcome`, never an exception: `ok`, `error` (bad arguments, or the tool answered "Error: ..."),
  `crash` (the function, or a class's create/execute/release, raised; a release that raises keeps execute's
  answer) or `timeout`. A call still running after `timeout_s` is abandoned: its thread cannot be killed and
  finishes in the background (the rollout goes on with an error message); an async execute is cancelled and its
  instance released; the python tool's sandbox kills its process itself, so its timeouts leave nothing behind.
- The python tool's `required_layers` (sandbox layer names, or `all`; default none) is checked when the file is
  loaded: a machine lacking one raises SandboxUnavailableError naming the entry, the layers and why, before any
  rollout; every call then asks the sandbox for them again.
- Every bad entry is a ValueError naming the file, the entry and the rule.
"""

from __future__ import annotations

import importlib
import inspect
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from hybridrl.tools import builtin, class_tools, sandbox

__all__ = ["Tool", "ToolOutcome", "load_tool_config"]

BUILTIN_PREFIX = "hybridrl.tools.builtin."
DEFAULT_TIMEOUT_S = 30.0
# extra wall time the thread guard of a sandboxed tool allows beyond the sandbox's own limit
_SANDBOX_GRACE_S = 5.0


@dataclass(frozen=True)
class ToolOutcome:
    text: str
    status: str  # ok | error | crash | timeout
    seconds: float = 0.0
    reward: float | None = None  # the step reward a verl-style class's execute returned (None: none, or a function)


@dataclass(frozen=True)
class Tool:
    name: str
    schema: dict  # OpenAI/Hermes style {"type": "function", "function": {...}}: what the chat template renders
    fn: Callable[..., str | tuple[str, str]] | None  # -> text, or (text, status) for tools that know their status
    timeout_s: float
    instance: object | None = None  # a verl-style tool object (class_tools.py), used instead of fn

    def run(self, arguments: dict, create_kwargs: dict | None = None) -> ToolOutcome:
        """Check `arguments` against the schema, call the tool with a time limit; never raises. `create_kwargs`
        (the sample's, for a verl-style class's create) is ignored by function tools."""
        problem = _argument_problem(self.name, self.schema, arguments)
        if problem:
            return ToolOutcome(problem, "error")
        if self.instance is not None:
            def call():
                return class_tools.run_session(self.instance, self.name, arguments, create_kwargs, self.timeout_s)
        else:
            def call():
                return (*_function_answer(self.fn(**arguments)), None)
        t0 = time.perf_counter()
        text, status, reward = _call_with_timeout(call, self.timeout_s)
        return ToolOutcome(text, status, time.perf_counter() - t0, reward)


def _argument_problem(name: str, schema: dict, arguments) -> str | None:
    if not isinstance(arguments, dict):
        return f"Error: the arguments of tool {name!r} must be a JSON object, got {type(arguments).__name__}"
    params = schema["function"].get("parameters") or {}
    required, known = params.get("required") or [], params.get("properties") or {}
    missing = [k for k in required if k not in arguments]
    unknown = [k for k in arguments if k not in known]
    if missing or unknown:
        return f"Error: tool {name!r} takes {sorted(known)} (required {required}); missing {missing}, unknown {unknown}"
    return None


def _function_answer(result) -> tuple[str, str]:
    return result if isinstance(result, tuple) else (str(result), _status_of(str(result)))


def _call_with_timeout(call: Callable[[], tuple], timeout_s: float) -> tuple[str, str, float | None]:
    box: list = []

    def target():
        try:
            box.append(call())
        except Exception as e:  # a crashing tool is a message to the model, not a failed rollout
            box.append((f"Error: the tool raised {type(e).__name__}: {e}"[:2000], "crash", None))

    thread = threading.Thread(target=target, name="hybridrl-tool-call", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if not box:
        return f"Error: the tool did not answer within {timeout_s:g}s", "timeout", None
    return box[0]


def _status_of(text: str) -> str:
    return "error" if text.startswith("Error:") else "ok"


def _python_tool(timeout_s: float, memory_mb: int, required: tuple[str, ...]):
    def run(code: str) -> tuple[str, str]:
        text, result = builtin.run_python_tool(code, timeout_s=timeout_s, memory_mb=memory_mb, require=required)
        if result is not None and result.killed_reason == "timeout":
            return text, "timeout"
        return text, "ok" if result is not None and result.ok else "error"
    return run


def _import_tool(class_name: str, where: str):
    module_name, _, attr = class_name.rpartition(".")
    if not module_name:
        raise ValueError(f"{where}: class_name={class_name!r} must be a dotted path 'package.module.function' "
                         "(or 'package.module.Class')")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"{where}: class_name={class_name!r}: cannot import module {module_name!r} ({e})") from e
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"{where}: class_name={class_name!r}: {module_name} has no function or class {attr!r}")
    return fn


def _check_schema(schema, where: str) -> dict:
    fn = schema.get("function") if isinstance(schema, dict) else None
    if not (isinstance(schema, dict) and schema.get("type") == "function" and isinstance(fn, dict)
            and isinstance(fn.get("name"), str) and fn["name"]):
        raise ValueError(f"{where}: tool_schema must be {{type: function, function: {{name, description, "
                         f"parameters}}}}, got {schema!r}")
    params = fn.get("parameters", {"type": "object", "properties": {}, "required": []})
    if not (isinstance(params, dict) and isinstance(params.get("properties", {}), dict)
            and isinstance(params.get("required", []), list)):
        raise ValueError(f"{where}: tool_schema.function.parameters must hold a 'properties' mapping and a "
                         f"'required' list, got {params!r}")
    return schema


def _positive(config: dict, key: str, default, where: str):
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"{where}: config.{key}={value!r} must be a number > 0")
    return value


def _build(entry, where: str) -> Tool:
    if not isinstance(entry, dict) or not isinstance(entry.get("class_name"), str):
        raise ValueError(f"{where}: each entry needs a 'class_name' string, got {entry!r}")
    unknown = sorted(set(entry) - {"class_name", "config", "tool_schema"})
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {unknown}; an entry has class_name, config, tool_schema")
    config = entry.get("config") or {}
    if not isinstance(config, dict):
        raise ValueError(f"{where}: config must be a mapping, got {config!r}")
    kind = config.get("type", "native")
    if kind != "native":
        raise ValueError(f"{where}: config.type={kind!r}: only 'native' tools (Python functions or classes) are supported; "
                         "MCP tools need MCP servers, which hybridrl does not run")
    timeout_s = float(_positive(config, "timeout_s", DEFAULT_TIMEOUT_S, where))
    class_name = entry["class_name"]
    schema = entry.get("tool_schema")
    instance = None
    if class_name.startswith(BUILTIN_PREFIX):
        name = class_name[len(BUILTIN_PREFIX):]
        if name not in builtin.TOOLS:
            raise ValueError(f"{where}: class_name={class_name!r}: no built-in tool {name!r}; built-ins: "
                             f"{[BUILTIN_PREFIX + n for n in builtin.TOOLS]}")
        schema = schema or next(s for s in builtin.TOOL_SPECS if s["function"]["name"] == name)
        fn = builtin.TOOLS[name]
        if name == "python":
            memory_mb = int(_positive(config, "memory_mb", 512, where))
            key = f"{where}: config.required_layers"
            required = sandbox.parse_required_layers(config.get("required_layers"), key)
            sandbox.check_required_layers(required, key)  # at load: a rollout never starts without them
            fn, timeout_s = _python_tool(timeout_s, memory_mb, required), timeout_s + _SANDBOX_GRACE_S
    else:
        if schema is None:
            raise ValueError(f"{where}: class_name={class_name!r} is not a built-in, so it needs a tool_schema")
        fn = _import_tool(class_name, where)
    schema = _check_schema(schema, where)
    if inspect.isclass(fn):   # a verl-style tool class, built once with the checked schema
        instance, fn = class_tools.build_instance(fn, config, schema, where, class_name), None
    return Tool(schema["function"]["name"], schema, fn, timeout_s, instance)


def yaml_entries(path: Path, key: str, list_name: str) -> list:
    """The non-empty list under `list_name` of the YAML file at `path` (config key `key`); errors name both."""
    if not path.is_file():
        raise FileNotFoundError(f"{key}={str(path)!r}: no such file")
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ValueError(f"{key}={str(path)!r}: not valid YAML ({e})") from e
    entries = doc.get(list_name) if isinstance(doc, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{key}={str(path)!r}: must hold a non-empty '{list_name}:' list")
    return entries


def load_tool_config(path: str | Path) -> dict[str, Tool]:
    """{tool name: Tool} from a tool config YAML (module docstring); ValueError naming the problem."""
    path = Path(path).expanduser()
    entries = yaml_entries(path, "actor_rollout_ref.rollout.multi_turn.tool_config_path", "tools")
    tools: dict[str, Tool] = {}
    for i, entry in enumerate(entries):
        tool = _build(entry, f"{path}: tools[{i}]")
        if tool.name in tools:
            raise ValueError(f"{path}: tools[{i}]: tool name {tool.name!r} is used twice")
        tools[tool.name] = tool
    return tools
