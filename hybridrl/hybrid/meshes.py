"""The device meshes of the 3D-HybridEngine beside the training mesh (training/fsdp.py: build_training_mesh), built
from degrees the run plan owns (plan/shape.py: Parallelism.build_meshes makes the calls).

The same W ranks are viewed several ways:
  training : 1-D ('fsdp',) over all ranks (or 2-D HSDP ('ddp','fsdp') when fsdp_size < W) — FSDP2 shards live here;
  rollout  : 2-D ('dp','infer_tp') with dp = W / tp — each row is one TP group running one generation engine;
  ulysses  : 2-D ('dp','sp') with dp = W / sp when sp > 1 — each row is one data-parallel rank of a training role.
Rank r sits at rollout coordinates (r // tp, r % tp): TP groups are consecutive ranks, so on one node they share
NVLink-close GPUs (what the seed prints as [[0, 1], [2, 3], [4, 5]] for W=6, tp=2).

The mesh layout itself (which ranks go where) is plain arithmetic shared with `hybridrl config check`; building
DeviceMesh objects needs an initialised process group.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh


@dataclass(frozen=True)
class RolloutCoords:
    dp_rank: int
    dp_size: int
    tp_rank: int
    tp_size: int

    @property
    def is_collect(self) -> bool:
        # results of a TP group are identical on all its ranks; collect from one
        return self.tp_rank == 0


def rollout_coords(rank: int, world_size: int, tp: int) -> RolloutCoords:
    if tp < 1 or world_size % tp:
        raise ValueError(f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp} must divide the world size {world_size}")
    return RolloutCoords(rank // tp, world_size // tp, rank % tp, tp)


def rollout_mesh_ranks(world_size: int, tp: int) -> list[list[int]]:
    rollout_coords(0, world_size, tp)  # validates
    return [list(range(d * tp, (d + 1) * tp)) for d in range(world_size // tp)]


def build_rollout_mesh(device_type: str, world_size: int, tp: int) -> DeviceMesh:
    rollout_coords(0, world_size, tp)
    return init_device_mesh(device_type, (world_size // tp, tp), mesh_dim_names=("dp", "infer_tp"))


def build_sp_mesh(device_type: str, world_size: int, sp: int) -> DeviceMesh:
    """Ulysses groups: ranks [d*sp, (d+1)*sp) are data-parallel rank d of the role."""
    return init_device_mesh(device_type, (world_size // sp, sp), mesh_dim_names=("dp", "sp"))


def format_mesh(mesh: DeviceMesh, with_names: bool = True) -> str:
    """The seed's form: DeviceMesh('cuda', [[0, 1], [2, 3]], mesh_dim_names=('dp', 'infer_tp'))."""
    ranks = mesh.mesh.tolist()
    if with_names and mesh.mesh_dim_names:
        return f"DeviceMesh('{mesh.device_type}', {ranks}, mesh_dim_names={tuple(mesh.mesh_dim_names)})"
    return f"DeviceMesh('{mesh.device_type}', {ranks})"
