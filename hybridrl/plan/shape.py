"""The run's shape, with one owner: how many ranks a run has (`trainer.nnodes` x `trainer.n_gpus_per_node`) and how
each role groups them — the FSDP shard group of the actor and reference, of the critic and of the reward model, the
rollout's tensor-parallel degree, the actor's and the critic's Ulysses SP degree. `parallelism(config)` reads these
keys; outside `config/` (which loads and validates them) and `plan/`, nothing else does
(tests/plan/test_shape_owner.py): the layout (plan/layout.py) prints the meshes they imply and the run plan carries
them to the workers.

The meshes (verl's 3D-HybridEngine), over the same W ranks:
  training : 1-D ('fsdp',) over all ranks, or 2-D HSDP ('ddp','fsdp') when the shard group is smaller than W
             (training/fsdp.py: build_training_mesh);
  ulysses  : 2-D ('dp','sp') of consecutive ranks when sp > 1 (workers/common.py: build_sp_group);
  rollout  : 2-D ('dp','infer_tp') of consecutive ranks, one engine per row (hybrid/meshes.py: build_rollout_mesh).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Parallelism:
    """The world and the process-group sizes each role builds its meshes from (the training mesh is 1-D FSDP when the
    shard group is the world, else HSDP of world / shard replicas)."""
    nodes: int
    gpus_per_node: int          # worker processes per node (one per GPU; on the CPU, processes)
    actor_fsdp: int             # ranks per FSDP shard group of the actor and reference
    actor_sp: int               # Ulysses SP degree of the actor and reference
    rollout_tp: int
    critic_fsdp: int
    critic_sp: int
    reward_fsdp: int            # the reward model's (style=model)

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node


def parallelism(config) -> Parallelism:
    """The shape of a (validated) PPO config: fsdp_size -1 resolved to the world."""
    c = config
    world = int(c["trainer"]["nnodes"]) * int(c["trainer"]["n_gpus_per_node"])

    def shard(fsdp_config) -> int:
        size = int(fsdp_config["fsdp_size"])
        return world if size == -1 else size

    actor = c["actor_rollout_ref"]["actor"]
    return Parallelism(
        nodes=int(c["trainer"]["nnodes"]), gpus_per_node=int(c["trainer"]["n_gpus_per_node"]),
        actor_fsdp=shard(actor["fsdp_config"]), actor_sp=int(actor["ulysses_sequence_parallel_size"]),
        rollout_tp=int(c["actor_rollout_ref"]["rollout"]["tensor_model_parallel_size"]),
        critic_fsdp=shard(c["critic"]["model"]["fsdp_config"]),
        critic_sp=int(c["critic"]["ulysses_sequence_parallel_size"]),
        reward_fsdp=shard(c["reward_model"]["model"]["fsdp_config"]))


def sft_training_mesh(sft_config, world: int, device_type: str):
    """The SFT trainer's one mesh over torchrun's `world` ranks: FSDP shard groups of `model.fsdp_config.fsdp_size`
    (-1: all ranks)."""
    from hybridrl.training.fsdp import build_training_mesh

    return build_training_mesh(world, int(sft_config.model.fsdp_config.fsdp_size), device_type)
