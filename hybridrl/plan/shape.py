"""The run's shape, with one owner: how many ranks a run has (`trainer.nnodes` x `trainer.n_gpus_per_node`) and how
each role groups them — the FSDP shard group of the actor and reference, of the critic and of the reward model, the
rollout's tensor-parallel degree, the actor's and the critic's Ulysses SP degree. `parallelism(config)` reads these
keys; outside `config/` (which loads and validates them) and `plan/`, nothing else does
(tests/plan/test_shape_owner.py): the layout (plan/layout.py) prints the meshes they imply, the run plan carries them
to the workers, and `Parallelism.build_meshes` builds a role's meshes in its worker.

The meshes (verl's 3D-HybridEngine), over the same W ranks:
  training : 1-D ('fsdp',) over all ranks, or 2-D HSDP ('ddp','fsdp') when the shard group is smaller than W
             (training/fsdp.py: build_training_mesh);
  ulysses  : 2-D ('dp','sp') of consecutive ranks when sp > 1 (hybrid/meshes.py: build_sp_mesh);
  rollout  : 2-D ('dp','infer_tp') of consecutive ranks, one engine per row (hybrid/meshes.py: build_rollout_mesh).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hybridrl.config.sections import PPOConfig, SFTConfig

ROLES = ("actor", "critic", "reward")


@dataclass(frozen=True)
class Meshes:
    """One role's device meshes in its worker. `sp` is None without Ulysses SP, `rollout` None but for the actor."""
    training: Any               # DeviceMesh ('fsdp',) or ('ddp','fsdp')
    sp: Any                     # DeviceMesh ('dp','sp'), or None
    rollout: Any                # DeviceMesh ('dp','infer_tp'), or None
    sp_size: int

    def data_parallel(self, rank: int) -> tuple[int, int, bool]:
        """(dp_rank, dp_size, is_collect) of `rank` for the role's dispatch: the sp ranks of a Ulysses group are one
        data-parallel rank, all fed the same rows (its first returns them)."""
        world = self.training.size()
        return rank // self.sp_size, world // self.sp_size, rank % self.sp_size == 0

    @property
    def sp_group(self):
        """The Ulysses process group, or None without SP."""
        return None if self.sp is None else self.sp.get_group("sp")


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

    def fsdp(self, role: str) -> int:
        return {"actor": self.actor_fsdp, "critic": self.critic_fsdp, "reward": self.reward_fsdp}[_role(role)]

    def sp(self, role: str) -> int:
        return {"actor": self.actor_sp, "critic": self.critic_sp, "reward": 1}[_role(role)]

    def build_meshes(self, device_type: str, role: str, rollout: bool = False) -> Meshes:
        """`role`'s meshes over the initialised default process group, created in one order on every rank: the
        training mesh, the Ulysses mesh (sp > 1), the rollout mesh (`rollout`: the actor with its engine)."""
        import torch.distributed as dist

        from hybridrl.hybrid.meshes import build_rollout_mesh, build_sp_mesh
        from hybridrl.training.fsdp import build_training_mesh

        world = self.world_size
        if dist.get_world_size() != world:
            raise ValueError(f"the run plan's world size {world} (trainer.nnodes x trainer.n_gpus_per_node = "
                             f"{self.nodes} x {self.gpus_per_node}) is not the process group's "
                             f"{dist.get_world_size()}")
        sp = self.sp(role)
        training = build_training_mesh(world, self.fsdp(role), device_type)
        sp_mesh = build_sp_mesh(device_type, world, sp) if sp > 1 else None
        rollout_mesh = build_rollout_mesh(device_type, world, self.rollout_tp) if rollout else None
        return Meshes(training=training, sp=sp_mesh, rollout=rollout_mesh, sp_size=sp)


def _role(role: str) -> str:
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    return role


def parallelism(config: PPOConfig) -> Parallelism:
    """The shape of a (validated) PPO config: fsdp_size -1 resolved to the world."""
    t = config.trainer

    def shard(fsdp_size: int) -> int:
        return t.world_size if fsdp_size == -1 else fsdp_size

    roles = config.actor_rollout_ref
    return Parallelism(
        nodes=t.nnodes, gpus_per_node=t.n_gpus_per_node,
        actor_fsdp=shard(roles.actor.fsdp_config.fsdp_size), actor_sp=roles.actor.ulysses_sequence_parallel_size,
        rollout_tp=roles.rollout.tensor_model_parallel_size,
        critic_fsdp=shard(config.critic.model.fsdp_config.fsdp_size),
        critic_sp=config.critic.ulysses_sequence_parallel_size,
        reward_fsdp=shard(config.reward_model.model.fsdp_config.fsdp_size))


def sft_sequence_parallel(sft_config: SFTConfig, world: int, rank: int, device_type: str) -> tuple[Any, int, int]:
    """The SFT trainer's Ulysses layout over torchrun's `world` ranks: (the group of `rank`, or None without SP; its
    data-parallel index; the data-parallel size). The ranks of one group take the same rows."""
    sp = sft_config.ulysses_sequence_parallel_size
    if sp < 1 or world % sp:
        raise ValueError(f"ulysses_sequence_parallel_size={sp} must be >= 1 and divide the world size {world}")
    if sp == 1:
        return None, rank, world
    if not sft_config.model.use_remove_padding:
        raise ValueError(f"ulysses_sequence_parallel_size={sp} needs model.use_remove_padding=true (the packed "
                         "path splits each micro-batch's tokens over the group)")
    from hybridrl.hybrid.meshes import build_sp_mesh

    return build_sp_mesh(device_type, world, sp).get_group("sp"), rank // sp, world // sp


def sft_training_mesh(sft_config: SFTConfig, world: int, device_type: str):
    """The SFT trainer's one mesh over torchrun's `world` ranks: FSDP shard groups of `model.fsdp_config.fsdp_size`
    (-1: all ranks)."""
    from hybridrl.training.fsdp import build_training_mesh

    return build_training_mesh(world, sft_config.model.fsdp_config.fsdp_size, device_type)
