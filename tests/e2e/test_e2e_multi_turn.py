"""One GRPO step through Ray (2 CPU workers, gloo) with multi-turn tool use on: the tool model (tests/conftest.py)
calls the calculator on the bignum prompts, the tool answers are appended and masked, and the step trains;
validation before it reports the same tool use."""

import math

import pytest
from tool_model_data import TOOL_MODEL_PROMPTS

from hybridrl.config.loader import load_config
from hybridrl.trainer.launch import run_ppo

pytestmark = pytest.mark.slow
MT = "actor_rollout_ref.rollout.multi_turn"


def test_grpo_step_with_tool_calls(ray_local, tool_model_dir, tmp_path):
    from hybridrl.data.tasks import make_dataset

    n_rows, seed = TOOL_MODEL_PROMPTS
    make_dataset("bignum", tmp_path / "data", n_train=n_rows, n_test=0, seed=seed)
    tools = tmp_path / "tools.yaml"
    tools.write_text("tools:\n  - class_name: hybridrl.tools.builtin.calculator\n    config: {type: native}\n")
    cfg = load_config(overrides=[
        f"actor_rollout_ref.model.path={tool_model_dir}", f"data.train_files={tmp_path / 'data' / 'train.parquet'}",
        f"data.val_files={tmp_path / 'data' / 'train.parquet'}",  # the prompts the tool model answers with a call
        "data.max_prompt_length=768", "data.max_response_length=128", "data.train_batch_size=2",
        "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.rollout.temperature=0.5",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2", "actor_rollout_ref.actor.use_kl_loss=true",
        f"{MT}.enable=true", f"{MT}.tool_config_path={tools}", f"{MT}.max_assistant_turns=3",
        "trainer.n_gpus_per_node=2", "trainer.device=cpu", "trainer.logger=[console]", "trainer.val_before_train=true",
        "trainer.test_freq=-1", "trainer.total_training_steps=1", f"trainer.default_local_dir={tmp_path / 'run'}"])
    history = run_ppo(cfg)["history"]
    val, step = history[0], [h for h in history if "actor/pg_loss" in h][0]
    # every trajectory called the calculator once and read its answer: 2 assistant turns + 1 tool turn + prompt
    assert step["tool_call_counts/mean"] == 1.0 and step["num_turns/mean"] == 4.0
    assert step["multi_turn/tool_use_rate"] == 1.0
    # validation (greedy, the 4 prompts once each) reports the same under val-aux/
    assert val["val-aux/multi_turn/tool_use_rate"] == 1.0 and val["val-aux/multi_turn/tool_calls"] == 4
    assert val["val-aux/tool_call_counts/mean"] == 1.0 and val["val-aux/num_turns/max"] == 4.0
    assert val["val-core/bignum/acc/mean@1"] == 0.0  # '#### 42' is not the product
    assert step["multi_turn/tool_calls"] == 4 and step["multi_turn/tool_errors"] == 0
    assert step["multi_turn/cut_by_turns"] == 0 and step["multi_turn/cut_by_length"] == 0
    assert step["multi_turn/masked_tokens"] >= 4 * 20  # each tool message (~25 tokens) kept out of the loss
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "training/rollout_probs_diff_max"):
        assert math.isfinite(step[key]), key
    assert step["training/rollout_probs_diff_max"] < 1e-3  # engine and actor agree on the model's tokens
    assert step["critic/score/mean"] == 0.0  # '#### 42' is not the product
