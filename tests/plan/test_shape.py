"""plan/shape.py: the run's shape read from a config, and each role's meshes built from it (one gloo rank here; the
multi-rank meshes run in the e2e tests, tests/e2e/test_e2e_runs.py's Ulysses and critic runs)."""

from types import SimpleNamespace

import pytest
import torch.distributed as dist

from hybridrl.config import load_config
from hybridrl.plan import Meshes, Parallelism, parallelism

A = "actor_rollout_ref.actor"


def test_parallelism_resolves_fsdp_size_to_the_world_and_reads_each_role():
    par = parallelism(load_config(overrides=[
        "trainer.nnodes=2", "trainer.n_gpus_per_node=4", f"{A}.fsdp_config.fsdp_size=4",
        f"{A}.ulysses_sequence_parallel_size=2", "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
        "critic.ulysses_sequence_parallel_size=4"]))
    assert (par.world_size, par.actor_fsdp, par.actor_sp, par.rollout_tp) == (8, 4, 2, 2)
    assert (par.fsdp("critic"), par.sp("critic"), par.fsdp("reward"), par.sp("reward")) == (8, 4, 8, 1)
    with pytest.raises(ValueError, match="role must be one of"):
        par.fsdp("ref")


def test_a_ulysses_group_is_one_data_parallel_rank():
    meshes = Meshes(training=SimpleNamespace(size=lambda: 8), sp=None, rollout=None, sp_size=2)
    assert [meshes.data_parallel(r) for r in (0, 1, 5)] == [(0, 4, True), (0, 4, False), (2, 4, False)]


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_build_meshes_on_one_rank(one_rank):
    par = Parallelism(nodes=1, gpus_per_node=1, actor_fsdp=1, actor_sp=1, rollout_tp=1, critic_fsdp=1, critic_sp=1,
                      reward_fsdp=1)
    actor = par.build_meshes("cpu", "actor", rollout=True)
    assert actor.training.mesh_dim_names == ("fsdp",) and actor.sp is None and actor.sp_group is None
    assert actor.rollout.mesh_dim_names == ("dp", "infer_tp") and actor.data_parallel(0) == (0, 1, True)
    assert par.build_meshes("cpu", "reward").rollout is None
    with pytest.raises(ValueError, match="world size 2 .* is not the process group's 1"):
        Parallelism(nodes=1, gpus_per_node=2, actor_fsdp=2, actor_sp=1, rollout_tp=1, critic_fsdp=2, critic_sp=1,
                    reward_fsdp=2).build_meshes("cpu", "actor")
