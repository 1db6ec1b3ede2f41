"""A verl-style tool class gets each sample's `create_kwargs` (verl's extra_info.tools_kwargs.<tool>.create_kwargs,
e.g. its ground truth) from the batch the multi-turn agent begins with."""

import sys
import types

import numpy as np
import yaml
from transformers import AutoTokenizer

from hybridrl.rollout.multi_turn import MultiTurnSettings, ToolAgent
from hybridrl.tools.registry import load_tool_config

SCHEMA = {"type": "function", "function": {
    "name": "check_answer", "description": "Checks an answer",
    "parameters": {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}}}


class CheckAnswer:   # verl's BaseTool shape
    def __init__(self, config, tool_schema):
        self.truth = {}

    async def create(self, instance_id=None, **kwargs):
        self.truth[instance_id] = kwargs.get("create_kwargs", {}).get("ground_truth")
        return instance_id

    async def execute(self, instance_id, parameters, **kwargs):
        right = parameters["answer"] == self.truth[instance_id]
        return f"correct={right}", float(right), {}

    async def release(self, instance_id, **kwargs):
        del self.truth[instance_id]


class _Seq:
    def __init__(self, tok, prompt, request_id):
        self.token_ids = tok.encode(prompt, add_special_tokens=False)
        self.num_prompt_tokens = self.turn_start = len(self.token_ids)
        self.request_id, self.seq_id, self.agent_state = request_id, 500 + request_id, None


def test_each_sample_checks_against_its_own_create_kwargs(tiny_model_dir, tmp_path, monkeypatch):
    module = types.ModuleType("hybridrl_test_create_kwargs")
    module.CheckAnswer = CheckAnswer
    monkeypatch.setitem(sys.modules, module.__name__, module)
    path = tmp_path / "tools.yaml"
    path.write_text(yaml.safe_dump({"tools": [{"class_name": f"{module.__name__}.CheckAnswer",
                                               "config": {"type": "native"}, "tool_schema": SCHEMA}]}))
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    agent = ToolAgent(tok, load_tool_config(path), MultiTurnSettings(max_assistant_turns=3),
                      eos_token_ids=[tok.eos_token_id])
    extra = np.array([{"tools_kwargs": {"check_answer": {"create_kwargs": {"ground_truth": "7"}}}},
                      {"tools_kwargs": {"check_answer": {"create_kwargs": {"ground_truth": "8"}}}}, {"index": 2}],
                     dtype=object)
    agent.begin_batch({"extra_info": extra})
    call = '<tool_call>\n{"name": "check_answer", "arguments": {"answer": "7"}}\n</tool_call><|im_end|>'
    prompt = "<|im_start|>user\nWhat is 3+4?<|im_end|>\n<|im_start|>assistant\n"
    try:
        answers, rewards = [], []
        for request_id in range(3):
            seq = _Seq(tok, prompt, request_id)
            seq.token_ids += tok.encode(call, add_special_tokens=False)
            outcome = agent.on_turn_end(seq, budget=200).result(timeout=10)
            answers.append(tok.decode(outcome.token_ids))
            rewards.append(agent.trajectory_stats(seq)["tool_rewards"])
    finally:
        agent.close()
    assert "correct=True" in answers[0] and "correct=False" in answers[1]   # each sample's own ground truth
    assert rewards == [[1.0], [0.0], [0.0]]   # execute's step rewards, verl's tool_rewards
    assert "correct=False" in answers[2]   # no tools_kwargs: create gets {}
