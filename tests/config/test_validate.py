"""Validation: each bad config raises ConfigError naming the key; warnings are not errors."""

import logging

import pytest
from omegaconf import OmegaConf

from hybridrl.config import ConfigError, load_config, validate_config
from hybridrl.config.loader import load_defaults
from hybridrl.config.schema import check_schema
from hybridrl.config.sections import ROOTS, PPOConfig

A, R = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"

# (overrides on top of the seed config: 6 GPUs, 60 prompts x n=12, tp=2), key expected in the message, rule text
BAD = [
    (["data.train_batch_size=50"], "data.train_batch_size", "must be divisible by"),
    ([f"{R}.n=1", f"{A}.ppo_mini_batch_size=15"], f"{A}.ppo_mini_batch_size", "data-parallel size 6"),
    ([f"{A}.ppo_micro_batch_size_per_gpu=7"], f"{A}.ppo_micro_batch_size_per_gpu", "120"),
    ([f"{R}.tensor_model_parallel_size=4"], f"{R}.tensor_model_parallel_size", "must divide the world size"),
    ([f"{R}.tensor_model_parallel_size=12", "trainer.nnodes=2"], f"{R}.tensor_model_parallel_size", "<= trainer.n_gpus"),
    (["data.train_batch_size=20", f"{A}.ppo_mini_batch_size=20"], "data.train_batch_size", "rollout dp size"),
    ([f"{R}.gpu_memory_utilization=0"], f"{R}.gpu_memory_utilization", "(0, 1]"),
    ([f"{R}.gpu_memory_utilization=1.2"], f"{R}.gpu_memory_utilization", "(0, 1]"),
    ([f"{R}.name=trtllm"], f"{R}.name", "not one of"),
    (["algorithm.adv_estimator=ppo"], "algorithm.adv_estimator", "not one of"),
    ([f"{A}.loss_agg_mode=mean"], f"{A}.loss_agg_mode", "not one of"),
    ([f"{A}.kl_loss_type=k4"], f"{A}.kl_loss_type", "not one of"),
    ([f"{A}.optim.warmup_style=linear"], f"{A}.optim.warmup_style", "not one of"),
    (["data.truncation=both"], "data.truncation", "not one of"),
    (["trainer.logger=[console,swanlab]"], "trainer.logger", "'swanlab' is not one of"),
    (["algorithm.kl_ctrl.type=pid"], "algorithm.kl_ctrl.type", "not one of"),
    (["trainer.resume_mode=latest"], "trainer.resume_mode", "not one of"),
    ([f"{A}.strategy=megatron"], f"{A}.strategy", "not one of"),
    (["trainer.device=tpu"], "trainer.device", "not one of"),
    (["data.train_batch_size=sixty"], "data.train_batch_size", "must be int"),
    (["trainer.nnodes=1.5"], "trainer.nnodes", "must be int"),
    ([f"{A}.use_kl_loss=1"], f"{A}.use_kl_loss", "must be bool"),
    (["data.max_prompt_length=null"], "data.max_prompt_length", "got null"),
    ([f"{A}.optim.betas=[a,b]"], f"{A}.optim.betas", "entries must be float"),
    (["data.val_batch_size=big"], "data.val_batch_size", "must be int"),
    ([f"{R}.n=0"], f"{R}.n", "must be > 0"),
    ([f"{A}.fsdp_config.fsdp_size=4"], f"{A}.fsdp_config.fsdp_size", "divisor"),
    ([f"{A}.ulysses_sequence_parallel_size=4", "actor_rollout_ref.model.use_remove_padding=false"],
     f"{A}.ulysses_sequence_parallel_size", "use_remove_padding"),
    ([f"{A}.ulysses_sequence_parallel_size=4", "actor_rollout_ref.model.use_remove_padding=true"],
     f"{A}.ulysses_sequence_parallel_size", "must divide the world size"),
    (["algorithm.adv_estimator=gae", "critic.ulysses_sequence_parallel_size=2", "critic.model.use_remove_padding=false"], "critic.ulysses_sequence_parallel_size",
     "critic.model.use_remove_padding"),
    (["critic.ulysses_sequence_parallel_size=0"], "critic.ulysses_sequence_parallel_size", "must be > 0"),
    (["reward_model.enable=true"], "reward_model.model.path", "is null"),
    ([f"{A}.use_dynamic_bsz=true", f"{A}.ppo_max_token_len_per_gpu=100"], f"{A}.ppo_max_token_len_per_gpu", "1024"),
    (["algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size_per_gpu=7"], "critic.ppo_micro_batch_size_per_gpu",
     "divisible"),
]


@pytest.mark.parametrize("overrides,key,rule", BAD, ids=[f"{i}-{b[1]}" for i, b in enumerate(BAD)])
def test_bad_config_names_key_and_rule(seed_yaml, overrides, key, rule):
    with pytest.raises(ConfigError) as e:
        load_config(seed_yaml, overrides)
    msg = str(e.value)
    assert f"'{key}'" in msg, msg
    assert rule in msg, msg
    assert isinstance(e.value, ValueError)


def test_at_least_ten_distinct_keys_are_covered():
    assert len({key for _, key, _ in BAD}) >= 10


def test_batch_message_carries_the_numbers(seed_yaml):
    with pytest.raises(ConfigError) as e:
        load_config(seed_yaml, ["data.train_batch_size=50"])
    assert "50 × 12 = 600" in str(e.value) and "60 × 12 = 720" in str(e.value)


def test_all_problems_reported_together(seed_yaml):
    with pytest.raises(ConfigError) as e:
        load_config(seed_yaml, ["trainer.device=tpu", "data.truncation=both", "trainer.nnodes=x"])
    assert len(e.value.errors) == 3


def test_critic_checked_only_with_gae(seed_yaml):
    cfg = load_config(seed_yaml, ["critic.ppo_micro_batch_size_per_gpu=7"])  # grpo: no critic
    assert cfg.critic.ppo_micro_batch_size_per_gpu == 7


def test_kl_twice_is_a_warning_not_an_error(seed_yaml, caplog):
    with caplog.at_level(logging.WARNING, logger="hybridrl.config"):
        load_config(seed_yaml, [f"{A}.use_kl_loss=true", "algorithm.use_kl_in_reward=true"])
    assert any("applied twice" in r.getMessage() for r in caplog.records)
    cfg = load_config(seed_yaml, [f"{A}.use_kl_loss=true", "algorithm.use_kl_in_reward=true"], validate=False)
    assert validate_config(cfg) == [w for w in validate_config(cfg) if "applied twice" in w]


def test_grpo_with_one_sample_warns():
    warnings = validate_config(load_config(overrides=["actor_rollout_ref.rollout.n=1"], validate=False))
    assert any("no group baseline and each advantage is the sample's raw score" in w for w in warnings)


def test_packaged_defaults_are_a_grpo_run_without_warnings():
    cfg = load_config(validate=False)
    assert cfg.algorithm.adv_estimator == "grpo" and cfg.actor_rollout_ref.rollout.n > 1
    assert validate_config(cfg) == []


def test_unknown_key_in_a_plain_dict_suggests_closest():
    with pytest.raises(ConfigError, match="did you mean 'trainer.n_gpus_per_node'"):
        check_schema({"trainer": {"n_gpu_per_node": 2}}, PPOConfig)
    with pytest.raises(ConfigError, match="must be a section"):
        check_schema({"trainer": 3}, PPOConfig)
    check_schema({"actor_rollout_ref": {"model": {"override_config": {"anything": {"goes": 1}}}}}, PPOConfig)


def test_the_packaged_defaults_have_their_fields_types():
    for name, root in ROOTS.items():
        check_schema(OmegaConf.to_container(load_defaults(name), resolve=True), root)


def test_types_and_allowed_values_come_from_the_annotations():
    with pytest.raises(ConfigError) as raised:
        check_schema({"data": {"truncation": "up", "val_batch_size": "x"},
                      "actor_rollout_ref": {"actor": {"use_dynamic_bsz": "maybe", "ppo_micro_batch_size_per_gpu": "zz",
                                                      "checkpoint": {"contents": ["model", 3]}}},
                      "trainer": {"logger": ["console", "foo"], "nnodes": True}}, PPOConfig)
    assert raised.value.errors == [
        "'data.truncation' = 'up' is not one of ['error', 'left', 'right', 'middle']",
        "'data.val_batch_size' must be int, got 'x' (str)",
        "'actor_rollout_ref.actor.use_dynamic_bsz' = 'maybe' is not one of ['auto', True, False]",
        "'actor_rollout_ref.actor.checkpoint.contents' entries must be str, got [3]",
        "'trainer.logger' = 'foo' is not one of ['console', 'file', 'tensorboard', 'wandb', 'mlflow']",
        "'trainer.nnodes' must be int, got True (bool)"]  # 'zz' micro-batch: the actor's rules name it


def test_the_demo_overrides_validate(tmp_path):
    demo = pytest.importorskip("hybridrl.trainer.demo")
    cfg = load_config(overrides=demo.demo_overrides(tmp_path, tmp_path / "sft"))
    assert cfg.trainer.device == "cpu"
