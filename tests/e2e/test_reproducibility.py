"""Two fresh runs with the same seed give the same metrics on CPU (GAE: the critic's value head is randomly
initialised, so it is the estimator that a missing seed shows first)."""

import pytest
from test_e2e_runs import arith_dir, overrides, train_metrics  # noqa: F401  (arith_dir is a fixture)

from hybridrl.config.loader import load_config
from hybridrl.trainer.launch import run_ppo

pytestmark = pytest.mark.slow

# wall-clock and memory measurements (and rates: `*_s`, `*_gb_s`) differ between any two runs; nothing else may
VARYING = ("timing_s/", "timing_per_token_ms/", "perf/", "memory/", "rollout/tail_time_frac")  # wall-clock based


def comparable(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in h.items() if not (k.startswith(VARYING) or k.endswith("_s"))}
            for h in train_metrics(history)]


def test_two_fresh_gae_runs_with_the_same_seed_match(ray_local, tiny_model_dir, arith_dir, tmp_path):  # noqa: F811
    gae = ["algorithm.adv_estimator=gae", "actor_rollout_ref.rollout.n=1", "data.train_batch_size=8",
           "actor_rollout_ref.actor.ppo_mini_batch_size=8", "critic.ppo_micro_batch_size_per_gpu=4",
           "critic.optim.lr=1e-4", "trainer.total_training_steps=2", "trainer.logger=[console]",
           # one rank (half the processes of the 2-rank runs): the value head is random on rank 0 either way
           "trainer.n_gpus_per_node=1", "actor_rollout_ref.rollout.tensor_model_parallel_size=1"]
    first, second = (comparable(run_ppo(load_config(overrides=overrides(tiny_model_dir, arith_dir, tmp_path / run,
                                                                        *gae)))["history"])
                     for run in ("a", "b"))
    assert len(first) == len(second) == 2
    assert "critic/values/mean" in first[0] and "critic/vf_loss" in first[0]
    for step, (a, b) in enumerate(zip(first, second), start=1):
        assert a.keys() == b.keys()
        differ = {k: (a[k], b[k]) for k in a if a[k] != b[k]}
        assert not differ, f"step {step}: metrics differ between two runs with the same seed: {differ}"
