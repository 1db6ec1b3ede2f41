"""docs/your-own-run.md end to end on CPU: a JSONL file of question/answer pairs is converted with `hybridrl data
convert`, and GRPO runs on it with the worked custom reward (examples/my_task/reward.py) on the tiny model."""

import importlib.util
import json
import math
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from hybridrl import cli
from hybridrl.config.loader import load_config
from hybridrl.trainer.launch import run_ppo

ROOT = Path(__file__).resolve().parents[2]
REWARD = ROOT / "examples" / "my_task" / "reward.py"


def _reward_module():
    spec = importlib.util.spec_from_file_location("my_task_reward", REWARD)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_worked_reward_scores_the_answer_after_the_marker():
    score = _reward_module().compute_score
    assert score("my_task", "3 + 4 = 7\n#### 7", "7") == 1.0
    assert score("my_task", "#### 1,000", "1000") == 1.0
    assert score("my_task", "#### 8", "7") == 0.1   # the format without the right number
    assert score("my_task", "it is 7", "7") == 0.0


@pytest.mark.slow
def test_convert_a_jsonl_file_then_grpo_on_it_with_a_custom_reward(ray_local, tiny_model_dir, tmp_path, capsys):
    src = tmp_path / "questions.jsonl"
    src.write_text("".join(json.dumps({"question": f"What is {a} + {b}?", "answer": f"{a} + {b} = {a + b}\n#### {a + b}"})
                           + "\n" for a in range(4) for b in range(2)))
    out = tmp_path / "data" / "train.parquet"
    assert cli.main(["data", "convert", str(src), "--out", str(out), "--prompt-key", "question", "--answer-key",
                     "answer", "--answer-after", "####", "--data-source", "my_task"]) == 0
    assert f"wrote 8 rows to {out}" in capsys.readouterr().out
    rows = pq.read_table(out).to_pylist()
    assert rows[5]["prompt"] == [{"role": "user", "content": "What is 2 + 1?"}]
    assert rows[5]["reward_model"]["ground_truth"] == "3" and rows[5]["data_source"] == "my_task"

    cfg = load_config(overrides=[
        f"actor_rollout_ref.model.path={tiny_model_dir}", f"data.train_files={out}", "data.val_files=null",
        f"custom_reward_function.path={REWARD}", "custom_reward_function.name=compute_score",
        "data.max_prompt_length=32", "data.max_response_length=8", "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.rollout.n=4",
        "trainer.n_gpus_per_node=1", "trainer.device=cpu", "trainer.total_training_steps=2",
        f"trainer.default_local_dir={tmp_path / 'run'}"])
    history = run_ppo(cfg)["history"]
    steps = [h for h in history if "critic/score/mean" in h]
    assert [h["training/global_step"] for h in steps] == [1, 2]
    for h in steps:  # my_task has no built-in scorer: every sample was scored by reward.py, none failed
        assert math.isfinite(h["critic/score/mean"]) and h["reward/errors"] == 0
    assert (tmp_path / "run" / "logs" / "metrics.jsonl").is_file()  # the packaged default logs every metric there
