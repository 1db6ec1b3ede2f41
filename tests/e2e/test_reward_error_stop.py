"""A reward function that returns inf for every sample stops the run at the first step, naming the limit, instead
of training on NaN advantages (every update skipped) and exiting 0."""

import pytest
from test_e2e_runs import arith_dir, overrides  # noqa: F401  (arith_dir is a fixture)

from hybridrl.config.loader import load_config
from hybridrl.rewards.error_guard import RewardErrorLimitError
from hybridrl.trainer.launch import run_ppo

pytestmark = pytest.mark.slow


def test_all_infinite_rewards_stop_the_run(ray_local, tiny_model_dir, arith_dir, tmp_path):  # noqa: F811
    scorer = tmp_path / "inf_reward.py"
    scorer.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    return float('inf')\n")
    cfg = load_config(overrides=overrides(tiny_model_dir, arith_dir, tmp_path / "run",
                                          f"custom_reward_function.path={scorer}", "trainer.total_training_steps=2",
                                          "trainer.logger=[console,file]"))
    with pytest.raises(RewardErrorLimitError, match=r"16 of 16 samples in step 1 .*max_error_fraction=1.0"):
        run_ppo(cfg)
    assert not (tmp_path / "run" / "logs" / "metrics.jsonl").exists() or \
        "training/global_step" not in (tmp_path / "run" / "logs" / "metrics.jsonl").read_text()
