"""Tools written as classes with verl's BaseTool interface (duck-typed: verl is not installed here)."""

import asyncio
import sys
import time
import types
from uuid import uuid4

import pytest
import yaml

from hybridrl.tools.registry import load_tool_config

MODULE = "hybridrl_test_verl_tools"
SCHEMA = {"type": "function", "function": {
    "name": "calc_gsm8k_reward", "description": "A tool for calculating the reward of gsm8k",
    "parameters": {"type": "object", "properties": {"answer": {"type": "string", "description": "The answer"}},
                   "required": ["answer"]}}}


class ToolResponse:  # stand-in for verl.tools.schemas.ToolResponse
    def __init__(self, text=None, image=None, video=None):
        self.text, self.image, self.video = text, image, video


class Gsm8kLikeTool:
    """The shape of verl's gsm8k_tool.Gsm8kTool (BaseTool's __init__ inlined)."""
    created_kwargs: list = []

    def __init__(self, config: dict, tool_schema):
        self.config, self.tool_schema = config, tool_schema
        self.name = tool_schema.function.name
        self.dumped = tool_schema.model_dump(exclude_unset=True, exclude_none=True)
        self._instance_dict = {}

    async def create(self, instance_id=None, ground_truth=None, **kwargs):
        if instance_id is None:
            instance_id = str(uuid4())
        if ground_truth is None:
            ground_truth = kwargs.get("create_kwargs", {}).get("ground_truth", None)
        self.created_kwargs.append(kwargs)
        self._instance_dict[instance_id] = {"response": "", "ground_truth": ground_truth, "reward": 0.0}
        return instance_id, ToolResponse()

    async def execute(self, instance_id, parameters, **kwargs):
        answer = str(parameters.get("answer", ""))
        self._instance_dict[instance_id]["response"] = answer
        reward = await self.calc_reward(instance_id)
        tool_reward = 0.0 if reward > self._instance_dict[instance_id]["reward"] else -0.05
        return ToolResponse(text=f"Current parsed answer={answer} reward={reward}"), tool_reward, {}

    async def calc_reward(self, instance_id, **kwargs):
        d = self._instance_dict[instance_id]
        return 1.0 if d["response"] == str(d["ground_truth"]) else 0.0

    async def release(self, instance_id, **kwargs):
        del self._instance_dict[instance_id]


class RaisingTool(Gsm8kLikeTool):
    async def execute(self, instance_id, parameters, **kwargs):
        raise RuntimeError("sandbox unreachable")


class SlowTool(Gsm8kLikeTool):
    async def execute(self, instance_id, parameters, **kwargs):
        await asyncio.sleep(30)


class SyncTool:
    """Plain methods, create returning just the id (older verl), execute a bare str."""

    def __init__(self, config, tool_schema):
        self.config, self.live = config, set()

    def create(self, instance_id=None, **kwargs):
        self.live.add(instance_id)
        return instance_id

    def execute(self, instance_id, parameters, **kwargs):
        assert instance_id in self.live
        return f"echo {parameters['answer']} x{self.config['factor']}"

    def release(self, instance_id, **kwargs):
        self.live.remove(instance_id)


class NoneTextTool(Gsm8kLikeTool):
    async def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse(image=["img"]), None, None


class NotATool:
    def __init__(self, config, tool_schema):
        pass

    def __call__(self, answer):
        return answer


@pytest.fixture(autouse=True)
def tool_module(monkeypatch):
    module = types.ModuleType(MODULE)
    for cls in (Gsm8kLikeTool, RaisingTool, SlowTool, SyncTool, NoneTextTool, NotATool):
        setattr(module, cls.__name__, cls)
    monkeypatch.setitem(sys.modules, MODULE, module)
    Gsm8kLikeTool.created_kwargs = []


def load(tmp_path, cls_name, **config):
    path = tmp_path / "tools.yaml"
    path.write_text(yaml.safe_dump({"tools": [{"class_name": f"{MODULE}.{cls_name}",
                                               "config": {"type": "native", **config}, "tool_schema": SCHEMA}]}))
    return load_tool_config(path)["calc_gsm8k_reward"]


def test_verl_style_class_is_driven_create_execute_release(tmp_path):
    tool = load(tmp_path, "Gsm8kLikeTool", timeout_s=5, extra="kept")
    instance = tool.instance
    assert isinstance(instance, Gsm8kLikeTool) and tool.fn is None
    assert instance.config == {"type": "native", "timeout_s": 5, "extra": "kept"}  # the YAML's config, as verl
    assert instance.name == "calc_gsm8k_reward" and instance.dumped == SCHEMA
    assert instance.tool_schema.function.parameters.properties["answer"].type == "string"
    assert instance.tool_schema.function.strict is False  # pydantic's default in verl's schema

    out = tool.run({"answer": "42"}, create_kwargs={"ground_truth": "42"})
    assert (out.text, out.status, out.reward) == ("Current parsed answer=42 reward=1.0", "ok", 0.0)
    assert Gsm8kLikeTool.created_kwargs == [{"create_kwargs": {"ground_truth": "42"}}]
    wrong = tool.run({"answer": "41"}, create_kwargs={"ground_truth": "42"})
    assert (wrong.text, wrong.reward) == ("Current parsed answer=41 reward=0.0", -0.05)
    assert tool.run({"answer": "41"}).text.endswith("reward=0.0")  # no create kwargs: {}
    assert Gsm8kLikeTool.created_kwargs[-1] == {"create_kwargs": {}}
    assert instance._instance_dict == {}  # every instance released
    bad = tool.run({"ans": "41"})  # the schema check comes first: no session
    assert bad.status == "error" and bad.reward is None and len(Gsm8kLikeTool.created_kwargs) == 3


def test_concurrent_calls_get_their_own_instances(tmp_path):
    from concurrent.futures import ThreadPoolExecutor
    tool = load(tmp_path, "Gsm8kLikeTool")
    with ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(lambda i: tool.run({"answer": str(i)}, {"ground_truth": str(i % 2)}), range(16)))
    assert [o.text.endswith("reward=1.0") for o in outs] == [i < 2 for i in range(16)]
    assert tool.instance._instance_dict == {}


def test_a_raising_execute_is_a_crash_and_still_released(tmp_path):
    tool = load(tmp_path, "RaisingTool")
    out = tool.run({"answer": "1"})
    assert out.status == "crash" and out.text == "Error: the tool raised RuntimeError: sandbox unreachable"
    assert out.reward is None and tool.instance._instance_dict == {}


def test_a_slow_execute_times_out_and_is_cancelled_and_released(tmp_path):
    tool = load(tmp_path, "SlowTool", timeout_s=0.3)
    t0 = time.perf_counter()
    out = tool.run({"answer": "1"})
    assert out.status == "timeout" and out.text == "Error: the tool did not answer within 0.3s"
    assert time.perf_counter() - t0 < 5
    deadline = time.perf_counter() + 5
    while tool.instance._instance_dict and time.perf_counter() < deadline:
        time.sleep(0.02)
    assert tool.instance._instance_dict == {}  # cancelled in the background, then released


def test_a_sync_class_works(tmp_path):
    tool = load(tmp_path, "SyncTool", factor=3)
    out = tool.run({"answer": "7"})
    assert (out.text, out.status, out.reward) == ("echo 7 x3", "ok", None)
    assert tool.instance.live == set()


def test_a_response_without_text_is_empty(tmp_path):
    out = load(tmp_path, "NoneTextTool").run({"answer": "7"})
    assert (out.text, out.status, out.reward) == ("", "ok", None)


def test_a_class_without_verls_interface_is_refused_at_load(tmp_path):
    with pytest.raises(ValueError) as e:
        load(tmp_path, "NotATool")
    message = str(e.value)
    assert "tools.yaml: tools[0]" in message and f"class_name='{MODULE}.NotATool'" in message
    assert "NotATool, which has no create and no execute method" in message
    assert "verl's BaseTool interface" in message


def test_a_class_whose_constructor_raises_is_refused_at_load(tmp_path):
    class Broken(Gsm8kLikeTool):
        def __init__(self, config, tool_schema):
            raise ValueError("sandbox_fusion_url is not set")

    sys.modules[MODULE].Broken = Broken
    with pytest.raises(ValueError, match=r"tools\[0\]: .*Broken\(config, tool_schema\) raised ValueError: "
                                         "sandbox_fusion_url is not set"):
        load(tmp_path, "Broken")


def test_a_raising_release_keeps_the_answer_and_counts_a_crash(tmp_path):
    class LeakyRelease(Gsm8kLikeTool):
        async def release(self, instance_id, **kwargs):
            raise KeyError(instance_id)

    sys.modules[MODULE].LeakyRelease = LeakyRelease
    out = load(tmp_path, "LeakyRelease").run({"answer": "3"}, {"ground_truth": "3"})
    assert (out.text, out.status, out.reward) == ("Current parsed answer=3 reward=1.0", "crash", 0.0)
