"""Agent loops in the native engine (rollout/agent_loop.py) with the tiny model: the example's number-guessing game
(examples/agent_loop_guess) and a loop that forks branches. The trajectory is exactly the model's turns and the
environment's token ids in order, the response mask is 1 on the model's tokens only, rewards and turn scores are
what the loop computed from the model's turns; branches share the history up to their fork, come out as more
samples of their prompt, and GRPO groups them with it."""

import asyncio
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hybridrl.algorithms.advantages import compute_advantage
from hybridrl.protocol import DataProto
from hybridrl.rollout.agent_loop import AgentLoop, AgentLoopAgent
from hybridrl.rollout.config import EngineConfig
from hybridrl.rollout.engine import LLMEngine
from hybridrl.rollout.multi_turn import MultiTurnSettings
from hybridrl.rollout.sampling_params import SamplingParams
from hybridrl.rollout.to_dataproto import outputs_to_dataproto

ROOT = Path(__file__).resolve().parents[2]
SECRETS = [3, 7]


def _example():
    spec = importlib.util.spec_from_file_location("guess_loop", ROOT / "examples" / "agent_loop_guess" / "guess_loop.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.GuessNumber


@pytest.fixture(scope="module")
def setup(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    engine = LLMEngine(model.config, EngineConfig(dtype=torch.float32, block_size=4, num_kv_blocks=512,
                                                  max_num_seqs=16, max_num_batched_tokens=1024, max_model_len=512,
                                                  enforce_eager=True), device="cpu")
    engine.wake_up(("weights",))
    engine.load_weights(model.state_dict().items())
    prompts = [tok.apply_chat_template([{"role": "user", "content": f"Guess a number ({i})."}],
                                       add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
               for i in range(len(SECRETS))]
    rows = {"reward_model": np.array([{"ground_truth": str(s)} for s in SECRETS], dtype=object)}
    return tok, engine, prompts, rows


class Recorder(AgentLoop):
    """Wraps a loop, recording each trajectory's turns and appended ids as the loop saw them."""

    def __init__(self, tokenizer, inner):
        super().__init__(tokenizer)
        self.inner, self.seen = inner, []

    def ends_turn(self, turn_ids):
        return self.inner.ends_turn(turn_ids)

    async def run(self, traj):
        record = {"pieces": [], "prompt": traj.prompt_ids}
        self.seen.append(record)
        generate = traj.generate

        async def recording(token_ids=None):
            if token_ids:
                record["pieces"].append(("env", list(token_ids)))
            turn = await generate(token_ids)
            record["pieces"].append(("model", turn.token_ids))
            return turn
        traj.generate = recording
        record["reward"] = await self.inner.run(traj)
        return record["reward"]


def _generate(setup, loop, params, settings=None):
    tok, engine, prompts, rows = setup
    agent = AgentLoopAgent(loop, tok, settings or MultiTurnSettings(), eos_token_ids=[tok.eos_token_id])
    try:
        agent.begin_batch(rows)
        return engine.generate(prompts, params, agent=agent)
    finally:
        agent.close()


def test_guess_game_trajectories_are_the_turns_and_the_games_answers(setup):
    tok = setup[0]
    loop = Recorder(tok, _example()(tok, max_tries=3, max_guess_tokens=8))
    outs = _generate(setup, loop, SamplingParams(n=3, temperature=1.0, max_tokens=120, seed=1),
                     MultiTurnSettings(max_tokens_per_turn=24))
    by_prompt = {}
    for rec in loop.seen:
        by_prompt.setdefault(tuple(rec["prompt"]), []).append(rec)
    answered = 0
    for prompt_ids, out in zip(setup[2], outs):
        recs = by_prompt[tuple(prompt_ids)]
        assert len(out.outputs) == 3 == len(recs)
        for c in out.outputs:
            # the recorded pieces of one of this prompt's loops, concatenated, are the completion; mask by source
            match = [r for r in recs if sum((p for _, p in r["pieces"]), []) == c.token_ids]
            assert match, "no loop saw this trajectory"
            rec = match[0]
            assert c.response_mask == sum(([int(src == "model")] * len(p) for src, p in rec["pieces"]), [])
            s = c.turn_stats
            assert s["reward"] == rec["reward"] and s["assistant_turns"] == sum(src == "model" for src, _ in
                                                                                  rec["pieces"])
            assert s["user_turns"] == s["assistant_turns"] - 1 and len(s["turn_scores"]) >= 1
            answered += s["user_turns"] > 0
            for src, ids in rec["pieces"]:
                if src == "env":
                    assert "Wrong, try again" in tok.decode(ids) or "one number" in tok.decode(ids)
    assert answered == 6   # the game answered every first guess (a random model writes no number: "one number")


class Branching(AgentLoop):
    """At the first turn end: two branches with different user messages; the root ends there (reward 0), each branch
    generates one more turn and gets a reward of 1 + its index. A turn is 6 tokens."""

    def ends_turn(self, turn_ids):
        return len(turn_ids) >= 6

    async def run(self, traj):
        await traj.generate()
        branches = [traj.fork(traj.user_message(f"Branch {i}, continue.")) for i in range(2)]
        traj.finish()   # the root ends here; the engine starts the branches

        async def finish(i, branch):
            await branch.generate()
            branch.reward = 1.0 + i
        await asyncio.gather(*(finish(i, b) for i, b in enumerate(branches)))
        return 0.0


def test_branches_share_the_history_and_group_under_their_prompt(setup):
    tok = setup[0]
    outs = _generate(setup, Branching(tok), SamplingParams(n=2, temperature=1.0, max_tokens=80, seed=3))
    for out in outs:
        assert len(out.outputs) == 2 + 4   # n roots and two branches each
        roots, branches = out.outputs[:2], out.outputs[2:]
        assert sorted(c.turn_stats["reward"] for c in out.outputs) == [0.0, 0.0, 1.0, 1.0, 2.0, 2.0]
        for c in branches:
            parent = [r for r in roots if c.token_ids[:len(r.token_ids)] == r.token_ids]
            assert len(parent) == 1   # the branch starts with its root's whole (first-turn) trajectory
            n = len(parent[0].token_ids)
            env = tok.decode([t for t, m in zip(c.token_ids[n:], c.response_mask[n:]) if not m])
            assert "continue." in env and c.response_mask[:n] == parent[0].response_mask
            assert c.response_mask[-1] == 1 and c.turn_stats["assistant_turns"] == 1
    # a DataProto with the branches as rows of their prompt; GRPO normalises within each prompt's 6 rows
    P = max(map(len, setup[2]))
    ids = torch.tensor([[0] * (P - len(p)) + p for p in setup[2]])
    mask = (ids != 0).long()
    batch = DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": mask.cumsum(1) - 1},
                                {"uid": np.array(["a", "b"], dtype=object)})
    data = outputs_to_dataproto(batch, outs, response_length=80, pad_token_id=0)
    assert len(data) == 12 and data.non_tensor_batch["uid"].tolist() == ["a"] * 6 + ["b"] * 6
    assert data.non_tensor_batch["agent_reward"].tolist() == [c.turn_stats["reward"] for o in outs for c in o.outputs]
    scores = torch.zeros(12, 80)
    last = data.batch["response_mask"].cumsum(1).argmax(1)
    scores[torch.arange(12), last] = torch.tensor(data.non_tensor_batch["agent_reward"].astype(np.float32))
    data.batch["token_level_rewards"] = scores
    adv = compute_advantage(data, "grpo").batch["advantages"]
    per_row = adv[torch.arange(12), last]
    for g in (slice(0, 6), slice(6, 12)):
        r = scores.sum(1)[g]
        torch.testing.assert_close(per_row[g], (r - r.mean()) / (r.std() + 1e-6), atol=1e-5, rtol=0)


class Chatty(AgentLoop):
    """Turns of 5 tokens; after each the environment appends `size` copies of token 7, forever."""

    def __init__(self, tokenizer, size):
        super().__init__(tokenizer)
        self.size = size

    def ends_turn(self, turn_ids):
        return len(turn_ids) >= 5

    async def run(self, traj):
        turn = await traj.generate()
        while not turn.finished:
            turn = await traj.generate([7] * self.size)


@pytest.mark.parametrize("max_model_len,max_tokens,size,cut", [
    (40, 200, 1, "max_model_len"),   # the trajectory grows to the model length the KV was sized for
    (512, 33, 1, "max_tokens"),      # ... to the response budget (mid-turn: 5 turns of 5 + 5 tokens appended + 3)
    (512, 30, 40, "length"),         # the environment's message does not fit what is left
])
def test_trajectories_never_outgrow_their_limits_and_each_cut_is_counted(setup, tiny_model_dir, max_model_len,
                                                                         max_tokens, size, cut):
    from hybridrl.trainer.metrics import multi_turn_stats_metrics

    tok, engine, prompts, rows = setup
    small = LLMEngine(engine.hf_config, EngineConfig(dtype=torch.float32, block_size=4, num_kv_blocks=64,
                                                     max_num_batched_tokens=512, max_model_len=max_model_len,
                                                     enforce_eager=True), device="cpu")
    small.wake_up(("weights",))
    small.load_weights(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).state_dict().items())
    outs = _generate((tok, small, prompts, rows), Chatty(tok, size),
                     SamplingParams(n=2, temperature=1.0, max_tokens=max_tokens, seed=0))
    stats = [c.turn_stats for o in outs for c in o.outputs]
    for prompt, out in zip(prompts, outs):
        for c in out.outputs:
            assert len(prompt) + len(c.token_ids) <= max_model_len and len(c.token_ids) <= max_tokens
            assert c.finish_reason == "length" and c.turn_stats["cut"] == cut
    assert multi_turn_stats_metrics(stats)[f"multi_turn/cut_by_{cut}"] == 4
