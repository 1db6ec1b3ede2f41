"""Validation of the DAPO keys: dynamic sampling, generation batch size, rollout correction."""

import pytest

from hybridrl.config.errors import ConfigError
from hybridrl.config.loader import load_config

FG, RC = "algorithm.filter_groups", "algorithm.rollout_correction"


REFUSED = [
    ([f"{FG}.enable=true"], rf"'{FG}.metric' is null but '{FG}.enable' is true"),
    ([f"{FG}.enable=true", f"{FG}.metric=pass"], rf"'{FG}.metric' = 'pass' is not one of"),
    ([f"{FG}.max_num_gen_batches=-1"], rf"'{FG}.max_num_gen_batches' = -1 must be >= 0 \(0 = no limit\)"),
    (["data.gen_batch_size=2048"],
     rf"'data.gen_batch_size' = 2048 differs from data.train_batch_size = 256 but '{FG}.enable' is false"),
    (["data.gen_batch_size=1500", f"{FG}.enable=true", f"{FG}.metric=acc"],
     r"'data.gen_batch_size' = 1500 must be a positive multiple of the rollout dp size 8"),
    ([f"{RC}.rollout_is=geo"], rf"'{RC}.rollout_is' = 'geo' is not one of \['token', 'sequence'\]"),
    ([f"{RC}.rollout_is=token", f"{RC}.rollout_is_threshold=0.0"], rf"'{RC}.rollout_is_threshold' = 0.0 must be > 0"),
    ([f"{RC}.rollout_rs=token_k2"], rf"{RC}.rollout_rs_threshold is null but rollout_rs='token_k2'"),
    ([f"{RC}.rollout_rs=seq_k2", f"{RC}.rollout_rs_threshold=1"], r"unknown: \['seq_k2'\]"),
    (["reward_model.launch_reward_fn_async=true", f"{FG}.enable=true", f"{FG}.metric=acc"],
     rf"'reward_model.launch_reward_fn_async' = true scores beside the passes after the rollout, but '{FG}.enable' "
     "= true needs the scores before them"),
    ([f"{RC}.loss_type=reinforce"], rf"'{RC}.loss_type' = reinforce acts only with '{RC}.bypass_mode' = true"),
    ([f"{RC}.loss_type=pg"], rf"'{RC}.loss_type' = 'pg' is not one of \['ppo_clip', 'reinforce'\]"),
    ([f"{RC}.bypass_mode=true", "actor_rollout_ref.actor.policy_loss.loss_mode=gspo"],
     rf"'{RC}.bypass_mode' = true replaces the policy loss with its '{RC}.loss_type' \(ppo_clip\), but "
     r"'actor_rollout_ref.actor.policy_loss.loss_mode' = gspo"),
    ([f"{RC}.bypass_mode=true", "actor_rollout_ref.actor.old_log_prob_pass=true"],
     r"'actor_rollout_ref.actor.old_log_prob_pass' = true would compute log-probs that nothing reads"),
]


@pytest.mark.parametrize("overrides,message", REFUSED)
def test_bad_dapo_values_are_refused_naming_key_and_rule(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=overrides)


def test_accepted_dapo_values_and_warnings():
    cfg = load_config(overrides=[f"{FG}.enable=true", f"{FG}.metric=seq_reward", "actor_rollout_ref.rollout.n=1"])
    assert any("nothing is filtered" in w for w in cfg.validate())
    load_config(overrides=["data.gen_batch_size=128", f"{FG}.enable=true", f"{FG}.metric=acc"])  # smaller is fine
    load_config(overrides=["data.gen_batch_size=256"])
    # the collected batch only trains: data.train_batch_size need not divide by the rollout dp size (8 here)
    load_config(overrides=["data.gen_batch_size=16", "data.train_batch_size=12", f"{FG}.enable=true",
                           f"{FG}.metric=acc", "actor_rollout_ref.actor.ppo_mini_batch_size=12",
                           "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"])
    with pytest.raises(ConfigError, match=r"'data.train_batch_size' = 12 must be divisible by the rollout dp size"):
        load_config(overrides=["data.train_batch_size=12", f"{FG}.enable=true", f"{FG}.metric=acc",
                               "actor_rollout_ref.actor.ppo_mini_batch_size=12",
                               "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"])
    cfg = load_config(overrides=[f"{RC}.rollout_rs=token_k1,seq_mean_k3", f"{RC}.rollout_rs_threshold='0.5_2,0.1'"])
    assert cfg.algorithm.rollout_correction.rollout_rs_threshold == "0.5_2,0.1"
    warnings = load_config(overrides=[f"{RC}.rollout_rs_threshold=2"]).validate()
    assert any("nothing is rejected" in w for w in warnings)


def test_verls_bypass_presets_load():
    """verl's RolloutCorrectionConfig presets of the bypass mode, as command-line keys."""
    presets = [
        [f"{RC}.bypass_mode=true"],                                                   # bypass_ppo_clip
        [f"{RC}.bypass_mode=true", f"{RC}.rollout_rs=seq_mean_k1", f"{RC}.rollout_rs_threshold=0.999_1.001"],
        [f"{RC}.bypass_mode=true", f"{RC}.loss_type=reinforce", f"{RC}.rollout_is=sequence"],     # bypass_pg_is
        [f"{RC}.bypass_mode=true", f"{RC}.loss_type=reinforce", f"{RC}.rollout_is=token",
         f"{RC}.rollout_rs=seq_mean_k1", f"{RC}.rollout_rs_threshold=0.999_1.001"],
    ]
    for keys in presets:
        cfg = load_config(overrides=keys)
        assert cfg.algorithm.rollout_correction.bypass_mode
    warned = load_config(overrides=[f"{RC}.bypass_mode=true", f"{RC}.rollout_is=token"]).validate()
    assert any("no IS weights are applied" in w for w in warned)
