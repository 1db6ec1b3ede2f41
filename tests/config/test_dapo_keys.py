"""Validation of the DAPO keys: dynamic sampling, generation batch size, rollout correction."""

import pytest

from hybridrl.config.loader import load_config
from hybridrl.config.validate import ConfigError, check_semantics

FG, RC = "algorithm.filter_groups", "algorithm.rollout_correction"


def test_filter_groups_needs_a_metric_and_a_non_negative_limit():
    with pytest.raises(ConfigError, match=rf"'{FG}.metric' is null but '{FG}.enable' is true"):
        load_config(overrides=[f"{FG}.enable=true"])
    with pytest.raises(ConfigError, match=rf"'{FG}.metric' = 'pass' is not one of"):
        load_config(overrides=[f"{FG}.enable=true", f"{FG}.metric=pass"])
    with pytest.raises(ConfigError, match=rf"'{FG}.max_num_gen_batches' = -1 must be >= 0 \(0 = no limit\)"):
        load_config(overrides=[f"{FG}.max_num_gen_batches=-1"])
    cfg = load_config(overrides=[f"{FG}.enable=true", f"{FG}.metric=seq_reward", "actor_rollout_ref.rollout.n=1"])
    assert any("nothing is filtered" in w for w in check_semantics(cfg))


def test_gen_batch_size_differs_only_with_dynamic_sampling_and_divides_the_rollout():
    with pytest.raises(ConfigError, match=r"'data.gen_batch_size' = 2048 differs from data.train_batch_size = 1024 "
                                          rf"but '{FG}.enable' is false"):
        load_config(overrides=["data.gen_batch_size=2048"])
    with pytest.raises(ConfigError, match=r"'data.gen_batch_size' = 1500 must be a positive multiple of the rollout "
                                          r"dp size 8"):
        load_config(overrides=["data.gen_batch_size=1500", f"{FG}.enable=true", f"{FG}.metric=acc"])
    load_config(overrides=["data.gen_batch_size=512", f"{FG}.enable=true", f"{FG}.metric=acc"])  # smaller is fine
    load_config(overrides=["data.gen_batch_size=1024"])


def test_rollout_correction_keys():
    with pytest.raises(ConfigError, match=rf"'{RC}.rollout_is' = 'geo' is not one of \['token', 'sequence'\]"):
        load_config(overrides=[f"{RC}.rollout_is=geo"])
    with pytest.raises(ConfigError, match=rf"'{RC}.rollout_is_threshold' = 0.0 must be > 0"):
        load_config(overrides=[f"{RC}.rollout_is=token", f"{RC}.rollout_is_threshold=0.0"])
    with pytest.raises(ConfigError, match=rf"{RC}.rollout_rs_threshold is null but rollout_rs='token_k2'"):
        load_config(overrides=[f"{RC}.rollout_rs=token_k2"])
    with pytest.raises(ConfigError, match=r"unknown: \['seq_k2'\]"):
        load_config(overrides=[f"{RC}.rollout_rs=seq_k2", f"{RC}.rollout_rs_threshold=1"])
    cfg = load_config(overrides=[f"{RC}.rollout_rs=token_k1,seq_mean_k3", f"{RC}.rollout_rs_threshold='0.5_2,0.1'"])
    assert cfg.algorithm.rollout_correction.rollout_rs_threshold == "0.5_2,0.1"
    warnings = check_semantics(load_config(overrides=[f"{RC}.rollout_rs_threshold=2"]))
    assert any("nothing is rejected" in w for w in warnings)
