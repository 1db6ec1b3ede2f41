"""Multi-turn at TP = 2 on two gloo ranks equals TP = 1: the tool model (tests/conftest.py) calls the calculator,
reads its answer, and its plain answers go to an interaction that asks again once; tokens, response masks, finish
reasons, per-trajectory counts, turn scores and the rewards made from them are the same on both ranks as on one
engine, greedy and sampled with the same seed. The tool runs on the group's rank 0 only."""

import json
import os
from concurrent.futures import Future

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import yaml
from gloo_ranks import end_process_group
from test_rollout_tp import free_port
from tool_model_data import TOOL_MODEL_PROMPTS, bignum_prompts, tool_conversation

from hybridrl.rollout.config import EngineConfig
from hybridrl.rollout.sampling_params import SamplingParams

pytestmark = pytest.mark.slow
PARAMS = {"greedy": SamplingParams(n=2, temperature=0, max_tokens=200),
          "sampled": SamplingParams(n=3, temperature=1.0, max_tokens=200, seed=7)}
ASK_AGAIN = [{"name": "count"}, {}]   # prompt 0's plain answers go to the interaction; prompt 1's end the trajectory


class _Inline:
    """An executor that runs each task at once: the tool answers are known at the step they were asked in, so
    sampled TP = 1 runs are reproducible (with threads the step a turn resumes at depends on the tool's timing)."""

    def submit(self, fn, *args):
        future = Future()
        future.set_result(fn(*args))
        return future

    def shutdown(self, **kwargs):
        pass


def _run(model_dir, tmp_dir, tp_group):
    """{params name: per sample (tokens, mask, finish reason, counts, reward)} and this process's tool calls."""
    import multi_turn_tools
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hybridrl.rollout.engine import LLMEngine
    from hybridrl.rollout.interactions import load_interactions
    from hybridrl.rollout.multi_turn import MultiTurnSettings, ToolAgent
    from hybridrl.tools.builtin import TOOL_SPECS
    from hybridrl.tools.registry import load_tool_config

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    engine = LLMEngine(model.config, EngineConfig(dtype=torch.float32, block_size=16, num_kv_blocks=256,
                                                  max_num_seqs=16, max_num_batched_tokens=2048, max_model_len=1024,
                                                  enforce_eager=True), tp_group=tp_group, device="cpu")
    engine.wake_up(("weights",))
    engine.load_weights(model.state_dict().items())
    tools = os.path.join(tmp_dir, "tools.yaml")
    with open(tools, "w") as f:
        yaml.safe_dump({"tools": [{"class_name": "multi_turn_tools.counted_calculator", "config": {"type": "native"},
                                   "tool_schema": TOOL_SPECS[0]}]}, f)
    interactions = os.path.join(tmp_dir, "interactions.yaml")
    with open(interactions, "w") as f:
        yaml.safe_dump({"interaction": [{"name": "count", "class_name": "multi_turn_tools.CountdownInteraction",
                                         "config": {"tries": 2}}]}, f)
    prompts = [tool_conversation(tok, q, TOOL_SPECS[:1])[0] for q in bignum_prompts(*TOOL_MODEL_PROMPTS)[:2]]
    results = {}
    for name, params in PARAMS.items():
        agent = ToolAgent(tok, load_tool_config(tools), MultiTurnSettings(max_assistant_turns=4),
                          eos_token_ids=[tok.eos_token_id], interactions=load_interactions(interactions))
        agent.pool = agent.call_pool = _Inline()
        agent.begin(ASK_AGAIN)
        outs = engine.generate(prompts, params, agent=agent)
        results[name] = [_sample(tok, c) for o in outs for c in o.outputs]
    return results, multi_turn_tools.calls["count"]


def _sample(tok, c):
    stats = {k: v for k, v in c.turn_stats.items() if k != "tool_time_s"}
    model_text = tok.decode([t for t, m in zip(c.token_ids, c.response_mask) if m], skip_special_tokens=True)
    reward = float("#### 42" in model_text) + sum(stats["turn_scores"])  # a rule score plus the interaction's
    return [c.token_ids, c.response_mask, c.finish_reason, stats, reward]


def _worker(rank, port, model_dir, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    group = dist.new_group([0, 1])
    results, calls = _run(model_dir, out_dir, group)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"results": results, "tool_calls": calls}, f)
    end_process_group()


def test_tp2_multi_turn_equals_tp1(tool_model_dir, tmp_path):
    import multi_turn_tools

    mp.spawn(_worker, args=(free_port(), str(tool_model_dir), str(tmp_path)), nprocs=2, join=True)
    multi_turn_tools.calls["count"] = 0
    ref, ref_calls = _run(str(tool_model_dir), str(tmp_path), None)
    ref = json.loads(json.dumps(ref))  # tuples -> lists, as the workers' files hold them
    got = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for name in PARAMS:
        for r in range(2):
            assert got[r]["results"][name] == ref[name], (name, r)
    # the trajectories did what the test is about: tool calls answered, masked tool tokens, interaction turns
    greedy = ref["greedy"]
    assert all(s[3]["tool_calls"] >= 1 and 0 in s[1] for s in greedy)
    assert [s[3]["interaction_turns"] for s in greedy] == [1, 1, 0, 0]
    assert ref_calls > 0 and got[0]["tool_calls"] == ref_calls and got[1]["tool_calls"] == 0
