"""examples/smollm2_interaction on CPU: the recipe's config validates; its data rows select its interaction; and its
multi-turn rollout path — the recipe's own arguments through load_config, build_tool_agent (the worker's) and the
native engine — runs the simulated user on a tiny model taught two conversations: the feedback comes back as a
user turn masked out of the loss, a right retry ends the trajectory (interaction done), wrong ones end at
max_user_turns; the reward (examples/smollm2_arith/reward.py) scores the model's own last answer."""

import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "examples" / "smollm2_interaction"
MT = "actor_rollout_ref.rollout.multi_turn"


def _env(tmp_path, **extra):
    """PATH with this interpreter's bin (hybridrl, python) and PYTHONPATH with this checkout."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])
    return {**os.environ, "PATH": path, "PYTHONPATH": str(ROOT), "DATA": str(tmp_path / "data"), **extra}


def test_interaction_recipe_config_validates(tmp_path):
    out = subprocess.run(["bash", str(RECIPE / "run.sh")], env=_env(tmp_path, HYBRIDRL_DRY_RUN="1"),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr + out.stdout
    assert ": valid" in out.stdout and "64 prompts x n=8 = 512 samples" in out.stdout
    assert not (tmp_path / "data").exists()   # a dry run writes no data


@pytest.fixture(scope="module")
def recipe_run(tmp_path_factory):
    """(the arguments the recipe hands to `hybridrl train`, later ones winning; the data folder): the model present,
    the data made by the recipe, `hybridrl` a stand-in first on PATH that prints its arguments."""
    tmp = tmp_path_factory.mktemp("interaction_recipe")
    (tmp / "model").mkdir()
    (tmp / "model" / "model.safetensors").touch()
    (tmp / "bin").mkdir()
    (tmp / "bin" / "hybridrl").write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    (tmp / "bin" / "hybridrl").chmod(0o755)
    env = _env(tmp, MODEL=str(tmp / "model"))
    env["PATH"] = f"{tmp / 'bin'}:{env['PATH']}"
    out = subprocess.run(["bash", str(RECIPE / "run.sh"), "trainer.total_training_steps=20"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()   # make_data.py's "wrote ..." lines, then the stand-in's
    assert [line for line in lines if line.startswith("wrote ")] == [
        f"wrote {split}: {tmp / 'data' / split}.parquet" for split in ("train", "test")]
    return lines[lines.index("train") + 1:], tmp / "data"


def test_interaction_recipe_makes_rows_that_select_its_interaction(recipe_run):
    from hybridrl.rollout.interactions import load_interactions

    args, data = recipe_run
    last = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in args}
    assert last[f"{MT}.enable"] == "true" and last[f"{MT}.max_user_turns"] == "2"
    assert last[f"{MT}.interaction_config_path"] == str(RECIPE / "interaction_config.yaml")
    assert last["custom_reward_function.path"] == str(ROOT / "examples" / "smollm2_arith" / "reward.py")
    assert last["data.max_response_length"] == "256" and last["trainer.total_training_steps"] == "20"
    assert last["data.train_files"] == f"{data}/train.parquet"
    interactions = load_interactions(last[f"{MT}.interaction_config_path"])
    for split, n in (("train", 3000), ("test", 200)):
        rows = pq.read_table(data / f"{split}.parquet").to_pylist()
        assert len(rows) == n
        for row in rows[:50]:
            kwargs = row["extra_info"]["interaction_kwargs"]
            assert kwargs == {"name": "add", "ground_truth": row["reward_model"]["ground_truth"]}
            a, b = map(int, row["prompt"][-1]["content"].removeprefix("What is ").removesuffix("?").split(" + "))
            assert int(kwargs["ground_truth"]) == a + b and kwargs["name"] in interactions


def _teach(model_dir, conversations, out_dir):
    """The tiny model fine-tuned to reproduce `conversations` ((token ids, loss mask) each) greedily."""
    import shutil

    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    width = max(len(ids) for ids, _ in conversations)
    ids = torch.tensor([i + [0] * (width - len(i)) for i, _ in conversations])
    mask = torch.tensor([m + [0] * (width - len(m)) for _, m in conversations])[:, 1:].bool()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(400):
        logp = torch.log_softmax(model(ids).logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])[..., 0][mask]
        if logp.min().item() > -0.02:
            break
        opt.zero_grad()
        (-logp.mean()).backward()
        opt.step()
    else:
        raise RuntimeError(f"the tiny model did not learn its conversations (min log-prob {logp.min().item():.3f})")
    shutil.copytree(model_dir, out_dir)
    model.save_pretrained(out_dir)
    return model


def test_interaction_recipe_rollout_feedback_turns_retries_and_limits(recipe_run, tiny_model_dir, tmp_path):
    import numpy as np
    from transformers import AutoTokenizer

    from hybridrl.config.loader import load_config
    from hybridrl.data.rl_dataset import RLHFDataset
    from hybridrl.rewards.custom import import_from_file
    from hybridrl.rollout.config import EngineConfig
    from hybridrl.rollout.engine import LLMEngine
    from hybridrl.rollout.interactions import load_interactions
    from hybridrl.rollout.multi_turn import message_ids
    from hybridrl.rollout.sampling_params import SamplingParams
    from hybridrl.workers.actor_rollout_ref import build_tool_agent

    args, data = recipe_run
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    feedback = load_interactions(RECIPE / "interaction_config.yaml")["add"].feedback
    rows = RLHFDataset([str(data / "train.parquet")], tok, {"max_prompt_length": 128})
    prompts = [rows[i]["raw_prompt_ids"] for i in (0, 1)]
    kwargs = [rows[i]["interaction_kwargs"] for i in (0, 1)]
    truth = [int(k["ground_truth"]) for k in kwargs]
    say = lambda n: tok.encode(f"It is {n}.", add_special_tokens=False) + [eos]  # noqa: E731
    fb = message_ids(tok, [{"role": "user", "content": feedback}], ended_on_text="<|im_end|>")
    # prompt 0: wrong, then right after the feedback; prompt 1: wrong three times
    turns = [[say(truth[0] + 1), say(truth[0])], [say(truth[1] + 1), say(truth[1] - 1), say(truth[1] + 2)]]
    convos = []
    for prompt, said in zip(prompts, turns):
        ids, mask = list(prompt), [0] * len(prompt)
        for i, turn in enumerate(said):
            ids, mask = ids + ([] if i == 0 else fb) + turn, mask + ([] if i == 0 else [0] * len(fb)) + [1] * len(turn)
        convos.append((ids, mask))
    model = _teach(tiny_model_dir, convos, tmp_path / "taught").eval()

    cfg = load_config(overrides=[*args, f"actor_rollout_ref.model.path={tmp_path / 'taught'}"])
    engine_config = EngineConfig(dtype=torch.float32, block_size=16, num_kv_blocks=256, max_num_seqs=8,
                                 max_num_batched_tokens=1024, max_model_len=512, enforce_eager=True)
    agent = build_tool_agent(cfg, [eos], max_running_seqs=engine_config.max_num_seqs)
    interaction = agent.interactions["add"]
    engine = LLMEngine(model.config, engine_config, device="cpu")
    engine.wake_up(("weights",))
    engine.load_weights(model.state_dict().items())
    engine.wake_up(("kv_cache",))
    params = SamplingParams(n=2, temperature=0, max_tokens=cfg.data.max_response_length)
    try:
        agent.begin_batch({"interaction_kwargs": np.array(kwargs, dtype=object)})
        outs = engine.generate(prompts, params, agent=agent)
    finally:
        agent.close()
    reward = import_from_file(ROOT / "examples" / "smollm2_arith" / "reward.py", "compute_score", key="test")
    expected = [  # (turn scores, cut, num_turns (verl's: assistant + user + 1), reward)
        ([0.0, 1.0], "", 4, 1.0), ([0.0, 0.0], "turns", 6, 0.0)]
    for out, said, convo, right, (scores, cut, num_turns, score) in zip(outs, turns, convos, truth, expected):
        ids, mask = convo[0][len(out.prompt_token_ids):], convo[1][len(out.prompt_token_ids):]
        for c in out.outputs:
            assert c.token_ids == ids and c.response_mask == mask   # each feedback turn in, out of the loss
            masked = tok.decode([t for t, m in zip(c.token_ids, c.response_mask) if not m])
            assert masked.count(feedback) == len(said) - 1 and "<|im_start|>user" in masked
            st = c.turn_stats
            assert (st["turn_scores"], st["cut"], st["num_turns"]) == (scores, cut, num_turns)
            assert st["interaction_turns"] == len(said) - 1 and c.finish_reason == "stop"
            own = tok.decode([t for t, m in zip(c.token_ids, c.response_mask) if m], skip_special_tokens=True)
            assert reward("smollm2_add", own, str(right)) == score
    # 2 prompts x 2 samples x 2 answers judged (the third of prompt 1 is cut by max_user_turns before it is shown)
    assert interaction.calls == 8 and interaction._truth == {}   # every started interaction finalized
