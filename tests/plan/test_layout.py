"""derive_layout: meshes and per-GPU batch sizes for the seed config and variants."""

import pytest

from hybridrl.config import ConfigError, load_config
from hybridrl.plan import derive_layout

A, R = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"


def test_seed_layout(seed_yaml):
    lay = derive_layout(load_config(seed_yaml))
    assert lay.world_size == 6
    assert lay.training_mesh == [0, 1, 2, 3, 4, 5] and lay.training_mesh_dims == ("fsdp",)
    assert lay.rollout_mesh == [[0, 1], [2, 3], [4, 5]] and (lay.rollout_dp, lay.rollout_tp) == (3, 2)
    assert (lay.rollout_prompts_per_dp, lay.rollout_samples_per_dp) == (20, 240)
    # the update micro-batch defaults to "auto": the run plan (tests/plan) resolves it for the model and device
    assert (lay.ppo_mini_batch_per_gpu, lay.ppo_micro_batch_per_gpu, lay.grad_accum_steps) == (120, "auto", None)
    assert lay.log_prob_micro_batch_per_gpu == 8 and lay.num_mini_batches == 1  # set in the seed YAML
    assert lay.critic_mini_batch_per_gpu is None
    text = str(lay)
    assert "DeviceMesh('cuda', [[0, 1], [2, 3], [4, 5]], mesh_dim_names=('dp', 'infer_tp'))" in text
    assert "DeviceMesh('cuda', [0, 1, 2, 3, 4, 5], mesh_dim_names=('fsdp',))" in text


def test_hsdp_two_nodes_and_gae():
    cfg = load_config(overrides=["trainer.nnodes=2", "trainer.n_gpus_per_node=4", f"{A}.fsdp_config.fsdp_size=4",
                                 f"{R}.tensor_model_parallel_size=2", "data.train_batch_size=64",
                                 f"{A}.ppo_mini_batch_size=16", f"{R}.n=4", "algorithm.adv_estimator=gae",
                                 "trainer.device=cpu"])
    lay = derive_layout(cfg)
    assert lay.training_mesh == [[0, 1, 2, 3], [4, 5, 6, 7]] and lay.training_mesh_dims == ("ddp", "fsdp")
    assert lay.rollout_mesh == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert (lay.ppo_mini_batch_per_gpu, lay.num_mini_batches, lay.critic_mini_batch_per_gpu) == (8, 4, 8)
    assert "HSDP" in str(lay) and "DeviceMesh('cpu'" in str(lay)


def test_tp1_layout():
    cfg = load_config(overrides=["trainer.n_gpus_per_node=4", "data.train_batch_size=8", f"{A}.ppo_mini_batch_size=4",
                                 f"{R}.n=2", f"{A}.ppo_micro_batch_size_per_gpu=1"])
    lay = derive_layout(cfg)
    assert lay.rollout_mesh == [[0], [1], [2], [3]] and lay.rollout_prompts_per_dp == 2
    assert lay.train_dp == 4
    assert (lay.ppo_mini_batch_per_gpu, lay.grad_accum_steps) == (2, 2)


def test_ulysses_layout():
    cfg = load_config(overrides=["trainer.n_gpus_per_node=4", f"{A}.ulysses_sequence_parallel_size=2",
                                 "actor_rollout_ref.model.use_remove_padding=true", "data.train_batch_size=8",
                                 f"{A}.ppo_mini_batch_size=4", f"{R}.n=2", f"{A}.ppo_micro_batch_size_per_gpu=1"])
    lay = derive_layout(cfg)
    assert lay.train_dp == 2 and lay.sp_mesh == [[0, 1], [2, 3]]
    assert lay.ppo_mini_batch_per_gpu == 4  # 4 prompts x n=2 over dp 2, not over the 4 ranks
    assert "ulysses mesh" in str(lay)
    critic = load_config(overrides=["trainer.n_gpus_per_node=4", "algorithm.adv_estimator=gae", "data.train_batch_size=8",
                                    f"{A}.ppo_mini_batch_size=4", f"{R}.n=2", "critic.ppo_micro_batch_size_per_gpu=1",
                                    f"{A}.ppo_micro_batch_size_per_gpu=1", "critic.ulysses_sequence_parallel_size=4",
                                    "critic.model.use_remove_padding=true"])
    assert derive_layout(critic).critic_mini_batch_per_gpu == 8  # 4 prompts x n=2 over critic dp 1


def test_dynamic_bsz_has_no_micro_batch(seed_yaml):
    lay = derive_layout(load_config(seed_yaml, [f"{A}.use_dynamic_bsz=true", f"{R}.log_prob_use_dynamic_bsz=true"]))
    assert lay.ppo_micro_batch_per_gpu is None and lay.grad_accum_steps is None
    assert lay.log_prob_micro_batch_per_gpu is None and "dynamic" in str(lay)


def test_invalid_config_raises(seed_yaml):
    cfg = load_config(seed_yaml, [f"{R}.tensor_model_parallel_size=4"], validate=False)
    with pytest.raises(ConfigError, match="tensor_model_parallel_size"):
        derive_layout(cfg)


def test_agrees_with_hybrid_meshes():
    meshes = pytest.importorskip("hybridrl.hybrid.meshes")
    for world, tp in [(6, 2), (8, 4), (4, 1)]:
        cfg = load_config(overrides=[f"trainer.n_gpus_per_node={world}", f"{R}.tensor_model_parallel_size={tp}",
                                     "data.train_batch_size=24", f"{A}.ppo_mini_batch_size=24", f"{R}.n=2",
                                     f"{A}.ppo_micro_batch_size_per_gpu=1"])
        assert derive_layout(cfg).rollout_mesh == meshes.rollout_mesh_ranks(world, tp)
