"""Settings that used to pass `config check` and fail later (or were refused although documented): each is now
decided at load time, naming the key, the value and the rule."""

import pytest

from hybridrl import cli
from hybridrl.config import ConfigError, load_config

SEED = "examples/seed_6gpu.yaml"
A = "actor_rollout_ref.actor"


@pytest.mark.parametrize("override, key", [
    (f"{A}.optim.lr=-1e-05", f"{A}.optim.lr"),
    (f"{A}.optim.lr=0", f"{A}.optim.lr"),
    ("critic.optim.lr=-0.001", "critic.optim.lr"),
])
def test_config_check_refuses_a_learning_rate_that_is_not_positive(capsys, override, key):
    extra = ["algorithm.adv_estimator=gae"] if key.startswith("critic") else []
    assert cli.main(["config", "check", SEED, override, *extra]) == 1
    err = capsys.readouterr().err
    assert f"'{key}' must be > 0, got {override.split('=')[1]}" in err, err


@pytest.mark.parametrize("override, key, rule", [
    ("reward_model.timeout_s=0", "reward_model.timeout_s", "> 0 or null"),
    ("reward_model.max_error_fraction=0", "reward_model.max_error_fraction", "(0, 1] or null"),
    ("reward_model.max_error_fraction=1.5", "reward_model.max_error_fraction", "(0, 1] or null"),
    ("reward_model.error_window_steps=0", "reward_model.error_window_steps", "> 0"),
])
def test_reward_limits_are_checked_at_load(override, key, rule):
    with pytest.raises(ConfigError) as e:
        load_config(overrides=[override])
    assert f"'{key}'" in str(e.value) and rule in str(e.value) and override.split("=")[1] in str(e.value)


def test_null_timeout_means_no_time_limit(tiny_model_dir):
    from transformers import AutoTokenizer

    from hybridrl.trainer.launch import build_reward_fns

    cfg = load_config(overrides=["reward_model.timeout_s=null", "reward_model.max_error_fraction=null"])
    assert cfg.reward_model.timeout_s is None and cfg.reward_model.max_error_fraction is None
    train_fn, val_fn = build_reward_fns(cfg, AutoTokenizer.from_pretrained(tiny_model_dir))
    assert train_fn.timeout_s is None and train_fn._workers == []  # scored in-process, no deadline
    assert val_fn.timeout_s is None and val_fn._workers == []


def test_ulysses_degree_must_divide_the_attention_heads_of_each_role_s_model(tiny_model_dir):
    """tiny_model_dir has 4 attention heads: SP 3 on 3 ranks passed the check and crashed in the first forward."""
    base = [f"actor_rollout_ref.model.path={tiny_model_dir}", "trainer.n_gpus_per_node=3", "trainer.device=cpu",
            "data.train_batch_size=6", f"{A}.ppo_mini_batch_size=6", "actor_rollout_ref.model.use_remove_padding=true"]
    with pytest.raises(ConfigError, match=rf"'{A}.ulysses_sequence_parallel_size' = 3 must divide the model's 4 "
                                          r"attention heads .*allowed: \[1, 2, 4\]"):
        load_config(overrides=[*base, f"{A}.ulysses_sequence_parallel_size=3"])
    with pytest.raises(ConfigError, match=r"'critic.ulysses_sequence_parallel_size' = 3 must divide the model's 4"):
        load_config(overrides=[*base, "algorithm.adv_estimator=gae", "critic.ppo_mini_batch_size=6",
                               "critic.model.use_remove_padding=true", "critic.ulysses_sequence_parallel_size=3"])


def test_the_hf_rollout_cannot_be_tensor_parallel_and_the_critic_s_mini_batch_must_divide_the_batch():
    with pytest.raises(ConfigError, match="rollout.name' = hf generates with the whole model .* needs rollout.name=native"):
        load_config(overrides=["actor_rollout_ref.rollout.name=hf", "trainer.n_gpus_per_node=2",
                               "actor_rollout_ref.rollout.tensor_model_parallel_size=2"])
    with pytest.raises(ConfigError, match=r"must be divisible by 'critic.ppo_mini_batch_size' × rollout.n \(3 × 8"):
        load_config(overrides=["algorithm.adv_estimator=gae", "critic.ppo_mini_batch_size=3"])


def test_each_validation_batch_draws_its_own_samples_and_every_validation_the_same():
    from hybridrl.seeding import validation_sampling_seed

    seeds = [validation_sampling_seed(1, 0, b) for b in range(3)]
    assert len(set(seeds)) == 3 and seeds[0] == validation_sampling_seed(1, 0)
