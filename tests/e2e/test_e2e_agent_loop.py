"""GRPO steps through Ray (one CPU worker) with the example's agent loop (examples/agent_loop_guess): the game
answers each guess, its messages are masked out of the loss, the loop's reward is the score (no reward function
knows the data source `guess_number`, so a score can only come from the loop), and the steps train."""

import importlib.util
import math
from pathlib import Path

import pytest

from hybridrl.config.loader import load_config
from hybridrl.trainer.launch import run_ppo

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "agent_loop_guess"
MT = "actor_rollout_ref.rollout.multi_turn"


def test_grpo_steps_with_the_guess_game_agent_loop(ray_local, tiny_model_dir, tmp_path):
    spec = importlib.util.spec_from_file_location("guess_make_data", EXAMPLE / "make_data.py")
    make_data = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_data)
    paths = make_data.write(tmp_path / "data", 4, 2)
    cfg = load_config(EXAMPLE / "config.yaml", overrides=[
        f"actor_rollout_ref.model.path={tiny_model_dir}", f"data.train_files={paths['train']}", "data.val_files=null",
        "data.max_prompt_length=96", "data.max_response_length=64", "data.train_batch_size=2",
        "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4", "actor_rollout_ref.actor.optim.lr=1e-4",
        f"{MT}.agent_loop.path={EXAMPLE / 'guess_loop.py'}", f"{MT}.agent_loop.kwargs.max_guess_tokens=8",
        "trainer.n_gpus_per_node=1", "trainer.device=cpu", "trainer.logger=[console]", "trainer.val_before_train=false",
        "trainer.test_freq=-1", "trainer.total_training_steps=2", "trainer.save_freq=-1",
        f"trainer.default_local_dir={tmp_path / 'run'}"])
    steps = [h for h in run_ppo(cfg)["history"] if "actor/pg_loss" in h]
    assert len(steps) == 2
    for step in steps:
        assert step["reward/errors"] == 0 and step["reward/samples"] == 8
        assert step["num_turns/mean"] > 2          # the game answered guesses: more than prompt + one turn
        assert step["multi_turn/masked_tokens"] > 0  # its messages are in the responses, out of the loss
        assert 0.0 <= step["critic/score/mean"] <= 1.0
        for key in ("actor/pg_loss", "actor/grad_norm", "training/rollout_probs_diff_max"):
            assert math.isfinite(step[key]), key
        assert step["training/rollout_probs_diff_max"] < 1e-3
