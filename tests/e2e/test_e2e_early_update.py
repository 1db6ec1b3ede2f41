"""End to end on one Ray CPU worker: the early update (actor.early_update=true) trains each part of the rollout's
finished groups while the rest decode, and steps once after the last: the same steps as waiting for the rollout."""

import json
import math

import pytest
import test_e2e_runs
from test_e2e_runs import overrides, train_metrics

from hybridrl.config.errors import ConfigError
from hybridrl.config.loader import load_config
from hybridrl.trainer.launch import run_ppo

pytestmark = pytest.mark.slow
arith_dir = test_e2e_runs.arith_dir   # the module-scoped data fixture of the other e2e runs


# a score that varies within every group (the random tiny model never solves the task): non-zero advantages
REWARD = "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n" \
         "    return float(len(solution_str) % 3)\n"


def _run(tiny_model_dir, arith_dir, run_dir, early: str, *extra):
    run_dir.mkdir(parents=True)
    (run_dir / "reward.py").write_text(REWARD)
    cfg = load_config(overrides=overrides(
        tiny_model_dir, arith_dir, run_dir, "trainer.n_gpus_per_node=1", f"custom_reward_function.path={run_dir}/reward.py",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "trainer.total_training_steps=2",
        "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.optim.lr=1e-2",
        "algorithm.rollout_correction.rollout_is=token", f"actor_rollout_ref.actor.early_update={early}",
        f"trainer.rollout_data_dir={run_dir}/rollouts", *extra))
    return train_metrics(run_ppo(cfg)["history"])


def test_early_update_gives_the_steps_of_the_whole_batch_update(ray_local, tiny_model_dir, arith_dir, tmp_path):
    early = _run(tiny_model_dir, arith_dir, tmp_path / "early", "true")
    waited = _run(tiny_model_dir, arith_dir, tmp_path / "waited", "false")
    assert [h["training/global_step"] for h in early] == [1, 2]
    for e, w in zip(early, waited):
        # the same rollout (step 2's too, sampled by the weights step 1 made) and the same update
        for key in ("response_length/mean", "critic/score/mean"):
            assert e[key] == w[key], (key, e[key], w[key])
        for key in ("actor/grad_norm", "training/rollout_probs_diff_max", "rollout_corr/rollout_is_mean"):
            assert math.isclose(e[key], w[key], rel_tol=1e-4, abs_tol=1e-6), (key, e[key], w[key])
        assert e["actor/grad_norm"] > 1e-3      # advantages and KL terms that move the weights
        assert 0.0 <= e["actor/early_update_frac"] <= 1.0 and "actor/early_update_frac" not in w
        assert e["timing_s/update_after_gen"] >= 0 and e["timing_s/ref"] > 0
        assert "timing_s/old_log_prob" not in e
    # the dumped samples: the same ones (in the order their groups finished, with the early update)
    for step in (1, 2):
        dumps = [sorted((r["input"], r["output"], r["score"]) for r in map(json.loads, (d / f"{step}.jsonl").open()))
                 for d in (tmp_path / "early" / "rollouts", tmp_path / "waited" / "rollouts")]
        assert len(dumps[0]) == 32 and dumps[0] == dumps[1]


def test_early_update_true_is_refused_where_it_is_not_the_same_update(tiny_model_dir, arith_dir, tmp_path):
    from hybridrl.plan import DeviceSpec, make_plan
    from hybridrl.training.fsdp import load_hf_config

    hf = load_hf_config(str(tiny_model_dir))
    base = overrides(tiny_model_dir, arith_dir, tmp_path, "trainer.n_gpus_per_node=1",
                     "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "data.train_batch_size=8",
                     "actor_rollout_ref.actor.early_update=true")
    ok = make_plan(load_config(overrides=[*base, "actor_rollout_ref.actor.ppo_mini_batch_size=8"]), hf,
                   DeviceSpec("cpu", "cpu", None))
    assert ok.actor.early_update
    for extra, reason in ((["actor_rollout_ref.actor.ppo_mini_batch_size=4"], "old-log-prob pass"),
                          (["actor_rollout_ref.actor.ppo_mini_batch_size=8", "algorithm.adv_estimator=gae"], "'gae'"),
                          (["actor_rollout_ref.actor.ppo_mini_batch_size=8", "trainer.n_gpus_per_node=2"], "2 ranks")):
        with pytest.raises(ConfigError, match=reason) as e:
            make_plan(load_config(overrides=[*base, *extra]), hf, DeviceSpec("cpu", "cpu", None))
        assert "actor_rollout_ref.actor.early_update" in str(e.value)
    auto = [*base[:-1], "actor_rollout_ref.actor.early_update=auto", "actor_rollout_ref.actor.ppo_mini_batch_size=8"]
    plan = make_plan(load_config(overrides=auto), hf, DeviceSpec("cpu", "cpu", None))
    assert not plan.actor.early_update and any("early_update = false (the CPU" in c for c in plan.choices)
