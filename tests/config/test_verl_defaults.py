"""A verl user's config as verl writes it: its full generated defaults load, every key hybridrl has no use for
dropped at verl's default value and named; at any other value such a key is refused, naming verl's default."""

import logging

import pytest
import yaml

from hybridrl.config.errors import ConfigError
from hybridrl.config.loader import load_config
from hybridrl.config.verl_defaults import UNSET_WHEN_NULL, is_verl_default, verl_defaults

A, R, C = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "critic"


def nested(flat: dict) -> dict:
    tree: dict = {}
    for key, value in flat.items():
        node = tree
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return tree


def verl_generated(**changes) -> dict:
    """A config shaped like verl's `_generated_ppo_trainer.yaml`: every table key at verl's default, plus the keys
    of ours that verl's file writes its own way (nulls meaning "not set", interpolations, renamed spellings)."""
    flat = {
        **verl_defaults(),
        f"{A}.strategy": "fsdp", f"{A}.optim.warmup_style": None, f"{A}.optim.lr_scheduler_type": "constant",
        f"{A}.optim.clip_grad": 1.0, f"{A}.ppo_micro_batch_size": None, f"{A}.ppo_micro_batch_size_per_gpu": None,
        f"{A}.checkpoint.save_contents": ["model", "optimizer", "extra"],
        f"{A}.checkpoint.load_contents": "${.save_contents}",
        "actor_rollout_ref.ref.strategy": "${actor_rollout_ref.actor.strategy}",
        "actor_rollout_ref.ref.ulysses_sequence_parallel_size":
            "${oc.select:actor_rollout_ref.actor.ulysses_sequence_parallel_size,1}",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": None,
        f"{R}.name": "vllm", f"{R}.mode": "async", f"{R}.log_prob_micro_batch_size_per_gpu": None,
        f"{C}.strategy": "fsdp", f"{C}.optim.warmup_style": None, f"{C}.optim.lr_scheduler_type": "constant",
        f"{C}.ppo_micro_batch_size": None, f"{C}.ppo_micro_batch_size_per_gpu": "${oc.select:.ppo_micro_batch_size,null}",
        f"{C}.forward_micro_batch_size_per_gpu": "${oc.select:.ppo_micro_batch_size_per_gpu,null}",
        "reward_model.micro_batch_size_per_gpu": None,
        "data.seed": None, "data.dataloader_num_workers": 8,
    }
    flat.update(changes)
    return nested(flat)


def write(tmp_path, tree) -> str:
    path = tmp_path / "verl.yaml"
    path.write_text(yaml.safe_dump(tree))
    return str(path)


def test_verls_full_generated_config_loads_with_the_dropped_keys_named(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="hybridrl.config"):
        cfg = load_config(write(tmp_path, verl_generated()))
    ours = load_config()
    a, c = cfg.actor_rollout_ref.actor, cfg.critic
    assert a.optim.warmup_style == c.optim.warmup_style == "constant"   # verl's null spelling yields to the other
    assert a.ppo_micro_batch_size_per_gpu == "auto" and c.ppo_micro_batch_size_per_gpu == "auto"   # null: not set
    assert c.forward_micro_batch_size_per_gpu == ours.critic.forward_micro_batch_size_per_gpu
    assert cfg.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu == "auto"
    assert cfg.reward_model.micro_batch_size_per_gpu == ours.reward_model.micro_batch_size_per_gpu
    assert cfg.data.seed is None and a.checkpoint.contents == ["model", "optimizer", "extra"]
    assert a.strategy == "fsdp2" and cfg.actor_rollout_ref.rollout.name == "native"
    warning = next(r.getMessage() for r in caplog.records if "of verl's keys are at verl's defaults" in r.getMessage())
    assert warning.startswith(f"config: {len(verl_defaults())} of verl's keys are at verl's defaults")
    assert "actor_rollout_ref.actor.profiler.*" in warning and "transfer_queue.enable" in warning


@pytest.mark.parametrize("key,value", [("actor_rollout_ref.actor.checkpoint.async_save", True),
                                       (f"{R}.enable_prefix_caching", False),
                                       ("trainer.del_local_ckpt_after_load", True), ("actor_rollout_ref.actor.freeze_vision_tower", True)])
def test_a_verl_key_at_another_value_is_refused_naming_its_default(tmp_path, key, value):
    default = verl_defaults()[key]
    with pytest.raises(ConfigError, match=rf"unknown key '{key}': verl's key.*verl's default, {default!r}"):
        load_config(write(tmp_path, verl_generated(**{key: value})))
    with pytest.raises(ConfigError, match=rf"unknown key '{key}'"):
        load_config(overrides=[f"{key}={value}"])
    assert load_config(overrides=[f"{key}={default}"])   # on the command line too, the default is dropped


def test_table_values_are_compared_exactly():
    assert is_verl_default("transfer_queue.enable", False) and not is_verl_default("transfer_queue.enable", 0)
    assert is_verl_default(f"{R}.checkpoint_engine.update_weights_bucket_megabytes", 2048)
    assert not is_verl_default(f"{R}.checkpoint_engine.update_weights_bucket_megabytes", 2048.5)
    assert not is_verl_default("data.no_such_key", None)


def test_null_reads_as_not_set_only_for_the_keys_verl_leaves_null(tmp_path):
    cfg = load_config(overrides=[f"{key}=null" for key in UNSET_WHEN_NULL])
    assert cfg.actor_rollout_ref.actor.optim.warmup_style == "constant"
    assert cfg.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu == "auto"
    with pytest.raises(ConfigError, match=r"'data.max_prompt_length' must be int, got null"):
        load_config(overrides=["data.max_prompt_length=null"])


def test_the_table_holds_verls_keys_outside_ours_their_renames_and_our_free_dicts():
    from hybridrl.config.verl_defaults_table import table_from

    ours = {"actor_rollout_ref": {"actor": {"optim": {"lr": 1e-6}, "checkpoint": {"contents": ["model"]}},
                                  "model": {"override_config": {}}}}
    verl = {"actor_rollout_ref": {"actor": {"optim": {"lr": 1e-6, "num_cycles": 0.5},
                                            "checkpoint": {"save_contents": ["model"], "load_contents": "x"}},
                                  "model": {"override_config": {"attention_dropout": 0.0}, "use_shm": False}}}
    assert table_from(verl, ours) == {"actor_rollout_ref.actor.optim.num_cycles": 0.5,
                                      "actor_rollout_ref.model.use_shm": False}


def test_each_config_reads_its_own_table(tmp_path):
    """The SFT config drops verl's SFT keys at their defaults (its own table), and a key of the PPO table stays
    unknown there even at the PPO default; the PPO config does not drop the SFT table's keys."""
    path = tmp_path / "sft.yaml"
    path.write_text(yaml.safe_dump({"data": {"balance_dp_token": False}, "trainer": {"default_hdfs_dir": None}}))
    assert load_config(str(path), defaults="sft_trainer").data.train_batch_size == 256
    path.write_text(yaml.safe_dump({"actor_rollout_ref": {"actor": {"calculate_entropy": False}}}))
    with pytest.raises(ConfigError, match=r"unknown key 'actor_rollout_ref'") as e:
        load_config(str(path), defaults="sft_trainer")
    assert "verl's default" not in str(e.value)   # setting it would not help here
    with pytest.raises(ConfigError, match=r"unknown key 'data.balance_dp_token'"):
        load_config(overrides=["data.balance_dp_token=false"])


def test_verls_deprecated_global_micro_batch_key_beside_its_null_per_gpu_key(tmp_path):
    """verl's generated config nulls ppo_micro_batch_size_per_gpu; a user who sets the deprecated global
    ppo_micro_batch_size gets it divided by the data-parallel size, as verl does."""
    cfg = load_config(write(tmp_path, verl_generated(**{f"{A}.ppo_micro_batch_size": 64,
                                                       "trainer.n_gpus_per_node": 8})))
    assert cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 8
