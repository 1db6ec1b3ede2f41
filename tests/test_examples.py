"""The example launch scripts produce valid configs for every size × GPU count they document (dry-run mode)."""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "gsm8k" / "run_qwen2.5.sh"


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
@pytest.mark.parametrize("size,gpus", [("0.5b", 1), ("1.5b", 2), ("7b", 8)])
def test_example_config_validates(algo, size, gpus):
    env = {**os.environ, "HYBRIDRL_DRY_RUN": "1"}
    out = subprocess.run(["bash", str(SCRIPT), algo, size, str(gpus)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr + out.stdout
    assert ": valid" in out.stdout and f"world size      {gpus}" in out.stdout


def test_example_rejects_unknown_size():
    env = {**os.environ, "HYBRIDRL_DRY_RUN": "1"}
    out = subprocess.run(["bash", str(SCRIPT), "grpo", "3b", "1"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "size must be" in out.stderr


def test_example_with_ulysses_overrides_validates():
    env = {**os.environ, "HYBRIDRL_DRY_RUN": "1"}
    out = subprocess.run(["bash", str(SCRIPT), "grpo", "7b", "8", "actor_rollout_ref.model.use_remove_padding=true",
                          "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr + out.stdout
    assert "ulysses mesh" in out.stdout and "[[0, 1], [2, 3], [4, 5], [6, 7]]" in out.stdout


SMOLLM2_SCRIPT = SCRIPT.parent.parent / "smollm2_arith" / "run.sh"


def test_smollm2_recipe_config_validates():
    env = {**os.environ, "HYBRIDRL_DRY_RUN": "1"}
    out = subprocess.run(["bash", str(SMOLLM2_SCRIPT)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr + out.stdout
    assert ": valid" in out.stdout and "64 prompts x n=8 = 512 samples" in out.stdout


def test_smollm2_recipe_refuses_a_tp_degree_its_heads_do_not_allow(tmp_path):
    import transformers

    transformers.LlamaConfig(hidden_size=576, num_attention_heads=9, num_key_value_heads=3, intermediate_size=1536,
                             num_hidden_layers=30, vocab_size=49152, tie_word_embeddings=True).save_pretrained(tmp_path)
    env = {**os.environ, "HYBRIDRL_DRY_RUN": "1", "MODEL": str(tmp_path)}
    out = subprocess.run(["bash", str(SMOLLM2_SCRIPT), "trainer.n_gpus_per_node=2",
                          "actor_rollout_ref.rollout.tensor_model_parallel_size=2"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "9 attention heads, 3 KV heads" in out.stderr and "allowed: [1, 3]" in out.stderr


def test_smollm2_gsm8k_recipe_uses_verls_gsm8k_scorer_and_longer_sequences(tmp_path):
    """The harder recipe overrides the arith one: 256+256 tokens, no custom reward (so verl's GSM8K scorer scores
    data_source openai/gsm8k), and its own data directory; the resulting config validates."""
    script = SCRIPT.parent.parent / "smollm2_gsm8k" / "run.sh"
    env = {**os.environ, "HYBRIDRL_DRY_RUN": "1", "DATA": str(tmp_path / "gsm8k")}
    out = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr + out.stdout
    assert ": valid" in out.stdout and "64 prompts x n=8 = 512 samples" in out.stdout
    # the arguments the recipe hands to `hybridrl`, seen by a stand-in first on PATH (later overrides win)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "hybridrl").write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    (tmp_path / "bin" / "hybridrl").chmod(0o755)
    env["PATH"] = f"{tmp_path / 'bin'}:{env['PATH']}"
    args = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True,
                          timeout=60).stdout.splitlines()
    reward = [a for a in args if a.startswith("custom_reward_function.path=")]
    assert reward[-1] == "custom_reward_function.path=null" and len(reward) == 2
    assert [a for a in args if a.startswith("data.max_response_length=")][-1] == "data.max_response_length=256"
    assert f"data.train_files={tmp_path}/gsm8k/train.parquet" in args


RM_SCRIPT = SCRIPT.parent.parent / "smollm2_reward_model" / "run.sh"


def test_reward_model_recipe_validates_with_the_policy_standing_in_for_an_untrained_reward_model(tmp_path):
    import transformers

    transformers.LlamaConfig(hidden_size=576, num_attention_heads=9, num_key_value_heads=3, intermediate_size=1536,
                             num_hidden_layers=30, vocab_size=49152, tie_word_embeddings=True).save_pretrained(tmp_path)
    env = {**os.environ, "HYBRIDRL_DRY_RUN": "1", "MODEL": str(tmp_path), "RM": str(tmp_path / "no_rm")}
    out = subprocess.run(["bash", str(RM_SCRIPT)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr + out.stdout
    assert ": valid" in out.stdout and "reward model    micro-batch" in out.stdout
    assert f"checking with the policy {tmp_path} in its place" in out.stderr


def test_reward_model_recipe_trains_grpo_on_the_reward_model_with_the_arith_recipe_settings(tmp_path):
    """With model, data and reward model present, the recipe hands the arith recipe's arguments plus the reward-model
    ones to `hybridrl train` (seen by a stand-in first on PATH)."""
    for d in ("model", "rm"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "model.safetensors").touch()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.parquet").touch()
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "hybridrl").write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    (tmp_path / "bin" / "hybridrl").chmod(0o755)
    env = {**os.environ, "MODEL": str(tmp_path / "model"), "DATA": str(tmp_path / "data"), "RM": str(tmp_path / "rm"),
           "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    out = subprocess.run(["bash", str(RM_SCRIPT), "trainer.total_training_steps=2"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    args = out.stdout.splitlines()
    assert args[0] == "train" and "algorithm.adv_estimator=grpo" in args and "actor_rollout_ref.rollout.n=8" in args
    last = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in args[1:]}  # later overrides win
    assert last["reward_model.enable"] == "true" and last["reward_model.style"] == "model"
    assert last["reward_model.model.path"] == str(tmp_path / "rm")
    assert last["custom_reward_function.path"] == str(RM_SCRIPT.parent / "reward.py")
    assert last["actor_rollout_ref.model.path"] == str(tmp_path / "model")
    assert last["trainer.total_training_steps"] == "2"


TOOLS_SCRIPT = SCRIPT.parent.parent / "smollm2_tools" / "run.sh"


@pytest.mark.parametrize("sft_exists", [False, True])
def test_tools_recipe_validates_and_plans_the_grpo_stage(tmp_path, sft_exists):
    """Before the SFT stage has run (nothing to plan memory for) and after (a SmolLM2-shaped SFT output)."""
    import transformers

    if sft_exists:
        transformers.LlamaConfig(hidden_size=576, num_attention_heads=9, num_key_value_heads=3, intermediate_size=1536,
                                 num_hidden_layers=30, vocab_size=49152,
                                 tie_word_embeddings=True).save_pretrained(tmp_path / "sft" / "huggingface")
    env = {**os.environ, "HYBRIDRL_DRY_RUN": "1", "SFT": str(tmp_path / "sft"), "DATA": str(tmp_path / "data")}
    out = subprocess.run(["bash", str(TOOLS_SCRIPT)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr + out.stdout
    assert ": valid" in out.stdout and "64 prompts x n=8 = 512 samples" in out.stdout
    assert ("predicted peak per GPU" in out.stdout) == sft_exists


def test_tools_recipe_makes_sft_data_runs_sft_then_multi_turn_grpo_from_it(tmp_path):
    """With the model and the bignum data present and no SFT model yet, the recipe writes the tool-call
    conversations, runs `hybridrl sft` on them with the recipe's template, then `hybridrl train` from the SFT output
    with multi-turn on (both seen by a stand-in first on PATH that records its arguments)."""
    from hybridrl.data.tasks import make_dataset

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "model.safetensors").touch()
    make_dataset("bignum", tmp_path / "data", n_train=300, n_test=2, seed=0, min_digits=6, max_digits=9)
    (tmp_path / "bin").mkdir()
    sft_model = tmp_path / "sft" / "huggingface"  # what `hybridrl sft` writes
    (tmp_path / "bin" / "hybridrl").write_text(
        f'#!/bin/sh\nprintf "%s\\n" "$@" "--" >> {tmp_path / "calls"}\n'
        f'[ "$1" != sft ] || {{ mkdir -p {sft_model}; touch {sft_model}/model.safetensors; }}\n')
    (tmp_path / "bin" / "hybridrl").chmod(0o755)
    env = {**os.environ, "MODEL": str(tmp_path / "model"), "DATA": str(tmp_path / "data"), "SFT": str(tmp_path / "sft"),
           "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "SFT_ARGS": "optim.lr=1e-4"}
    out = subprocess.run(["bash", str(TOOLS_SCRIPT), "trainer.total_training_steps=2"], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    import pyarrow.parquet as pq

    assert pq.read_table(tmp_path / "data" / "sft_tool_calls.parquet").num_rows == 64   # SFT_ROWS default
    calls = [c.strip("\n").split("\n") for c in (tmp_path / "calls").read_text().split("--\n")[:-1]]
    assert [c[0] for c in calls] == ["sft", "train"]  # the model and the data exist: nothing else runs
    sft, train = calls
    template = str(TOOLS_SCRIPT.parent / "chat_template.jinja")
    sft_keys = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in sft[1:]}
    assert sft[0] == "sft" and sft_keys["data.multiturn.enable"] == "true"
    assert sft_keys["data.train_files"] == str(tmp_path / "data" / "sft_tool_calls.parquet")
    assert sft_keys["model.partial_pretrain"] == str(tmp_path / "model")
    assert sft_keys["model.custom_chat_template"] == template and sft_keys["optim.lr"] == "1e-4"
    assert sft_keys["trainer.default_local_dir"] == str(tmp_path / "sft")
    last = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in train[1:]}
    assert last["actor_rollout_ref.model.path"] == str(tmp_path / "sft" / "huggingface")
    assert last["actor_rollout_ref.model.custom_chat_template"] == template
    assert last["actor_rollout_ref.rollout.multi_turn.enable"] == "true"
    tools = last["actor_rollout_ref.rollout.multi_turn.tool_config_path"]
    assert tools.endswith("multiturn_calculator/tool_config.yaml")
    assert last["trainer.val_before_train"] == "true" and last["trainer.total_training_steps"] == "2"
    assert last["custom_reward_function.path"] == "null"  # the bignum scorer, not the arith recipe's reward
    assert last["data.train_files"] == str(tmp_path / "data" / "train.parquet")


def test_tools_first_turn_check_scores_the_sampled_first_turns(tmp_path, tiny_model_dir):
    import sys

    data = tmp_path / "bignum"
    subprocess.run(["hybridrl", "data", "make", "bignum", "--out", str(data), "--train", "4", "--test", "3",
                    "--seed", "0"], check=True, capture_output=True)
    sys.path.insert(0, str(ROOT / "examples" / "smollm2_tools"))
    try:
        from first_turn_tool_use import _value, main
    finally:
        sys.path.pop(0)
    assert _value("123456789 * 987654321") == 123456789 * 987654321 and _value("__import__('os')") is None
    out = tmp_path / "first_turn.json"
    result = main([str(tiny_model_dir), str(data / "test.parquet"), "--rows", "3", "--out", str(out)])
    assert result["rows"] == 3 and len(result["first_turns"]) == 3 and out.is_file()
    for key in ("opens_tool_call", "parsed_calculator_call", "right_expression", "answers_directly"):
        assert 0.0 <= result[key] <= 1.0
    assert result["right_expression"] <= result["parsed_calculator_call"] <= result["opens_tool_call"]


def test_my_task_recipe_converts_its_questions_and_plans_the_run(tmp_path, tiny_model_dir):
    env = {**os.environ, "HYBRIDRL_DRY_RUN": "1", "MODEL": str(tiny_model_dir), "OUT": str(tmp_path)}
    out = subprocess.run(["bash", str(ROOT / "examples" / "my_task" / "run.sh")], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr + out.stdout
    lines = out.stdout.splitlines()
    assert lines[0] == f"wrote 5 rows to {tmp_path / 'train.parquet'} (data_source 'my_task')"
    assert lines[1] == "defaults + overrides: valid" and lines[2].startswith("memory plan: peak ")
    assert "missing:" not in out.stdout  # model, data and reward file all exist


DAPO_SCRIPT = SCRIPT.parent.parent / "dapo_long" / "run.sh"


@pytest.mark.parametrize("gpus", [1, 8])
def test_dapo_long_recipe_with_verls_keys_validates_and_plans_token_budgets(tmp_path, gpus):
    import transformers

    transformers.Qwen2Config(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                             num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
                             max_position_embeddings=32768).save_pretrained(tmp_path)
    env = {**os.environ, "HYBRIDRL_DRY_RUN": "1", "MODEL": str(tmp_path)}
    out = subprocess.run(["bash", str(DAPO_SCRIPT), "1.5b", str(gpus)], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr + out.stdout
    assert ": valid" in out.stdout and f"{16 * gpus} prompts x n=8" in out.stdout
    assert "micro-batches   per GPU: update <= " in out.stdout and "1.544B params" in out.stdout
    # verl's spellings were read as ours, each said in a warning
    assert "overlong_buffer_cfg.len is read as reward_model.overlong_buffer.len" in out.stderr
    assert "checkpoint.save_contents is read as actor_rollout_ref.actor.checkpoint.contents" in out.stderr
