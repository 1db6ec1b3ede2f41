"""The device layout a config implies, derived once on the driver and printed before training.

Mirrors verl's 3D-HybridEngine: the training mesh is FSDP over all ranks (`('fsdp',)`), or HSDP
`('ddp','fsdp')` when `fsdp_size` is smaller than the world; the rollout mesh is `('dp','infer_tp')`
with consecutive ranks in a TP group (they share a machine, and NVLink); Ulysses SP, when on, groups
consecutive ranks as `('dp','sp')`. Batch sizes are given per GPU the way the workers will see them
(verl normalises `ppo_mini_batch_size` by `× n / dp`). `derive_layout` runs `PPOConfig.validate` first, so
a bad config raises ConfigError rather than dividing by zero. The world size and degrees are the run's shape
(plan/shape.py: `parallelism`); the layout holds them and adds the rank lists and batch sizes they imply.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridrl.config.sections import PPOConfig
from hybridrl.plan.shape import Parallelism, parallelism

__all__ = ["Layout", "derive_layout"]


def _grid(rows: int, cols: int) -> list[list[int]]:
    return [[r * cols + c for c in range(cols)] for r in range(rows)]


@dataclass
class Layout:
    device: str
    parallel: Parallelism  # the world size and every role's degrees
    training_mesh: list[int] | list[list[int]]  # 1-D FSDP, or 2-D HSDP [ddp][fsdp]
    training_mesh_dims: tuple[str, ...]
    sp_mesh: list[list[int]] | None  # [dp][sp] when ulysses_sp > 1
    train_dp: int  # data-parallel size of training = world / ulysses_sp
    rollout_dp: int
    rollout_mesh: list[list[int]]  # [dp][infer_tp]
    train_batch_size: int  # prompts per step
    gen_batch_size: int  # prompts per generation batch (data.gen_batch_size, else train_batch_size)
    n: int  # samples per prompt
    num_mini_batches: int  # per PPO epoch
    ppo_mini_batch_per_gpu: int  # rows (samples) per GPU per mini-batch
    ppo_micro_batch_per_gpu: int | str | None  # None = dynamic batch size, 'auto' until the run plan resolves it
    grad_accum_steps: int | None
    log_prob_micro_batch_per_gpu: int | None
    ref_log_prob_micro_batch_per_gpu: int | None
    rollout_prompts_per_dp: int
    rollout_samples_per_dp: int
    critic_mini_batch_per_gpu: int | None  # only with adv_estimator=gae
    critic_num_mini_batches: int | None = None  # per critic PPO epoch; only with adv_estimator=gae

    @property
    def world_size(self) -> int:
        return self.parallel.world_size

    @property
    def samples_per_train_rank(self) -> int:
        """A step's samples on each training data-parallel rank (what a no-grad pass's micro-batch divides)."""
        return self.train_batch_size * self.n // self.train_dp

    @property
    def ulysses_sp(self) -> int:  # the actor's and reference's
        return self.parallel.actor_sp

    @property
    def rollout_tp(self) -> int:
        return self.parallel.rollout_tp

    @staticmethod
    def _mesh(device: str, mesh, dims) -> str:
        return f"DeviceMesh('{device}', {mesh}, mesh_dim_names={dims})"

    def __str__(self) -> str:
        kind = "FSDP" if len(self.training_mesh_dims) == 1 else "HSDP"
        micro = ("dynamic (token budget)" if self.ppo_micro_batch_per_gpu is None else
                 f"{self.grad_accum_steps} micro-batches of {self.ppo_micro_batch_per_gpu}"
                 if self.grad_accum_steps is not None else f"micro-batch {self.ppo_micro_batch_per_gpu}")
        if self.device == "cpu":  # trainer.n_gpus_per_node counts worker processes there, not GPUs
            par = self.parallel
            nodes = f" ({par.nodes} nodes x {par.gpus_per_node})" if par.nodes > 1 else ""
            workers = "worker" if self.world_size == 1 else "workers"
            world = f"world size      {self.world_size} {workers} on CPU{nodes}"
        else:
            world = (f"world size      {self.world_size} ({self.parallel.nodes} node(s) x "
                     f"{self.parallel.gpus_per_node} GPUs)")
        lines = [
            world,
            f"training mesh   {self._mesh(self.device, self.training_mesh, self.training_mesh_dims)}"
            f"  [{kind}, dp={self.train_dp}]",
        ]
        if self.sp_mesh is not None:
            lines.append(f"ulysses mesh    {self._mesh(self.device, self.sp_mesh, ('dp', 'sp'))}")
        lines += [
            f"rollout mesh    {self._mesh(self.device, self.rollout_mesh, ('dp', 'infer_tp'))}"
            f"  [dp={self.rollout_dp} x tp={self.rollout_tp}]",
            f"per step        {self.train_batch_size} prompts x n={self.n} = {self.train_batch_size * self.n} samples, "
            f"{self.num_mini_batches} mini-batch(es) per epoch",
            f"rollout         {self.rollout_prompts_per_dp} prompts -> {self.rollout_samples_per_dp} samples per dp group"
            + (f" (generation batches of {self.gen_batch_size} prompts)" if self.gen_batch_size != self.train_batch_size
               else ""),
            f"actor update    {self.ppo_mini_batch_per_gpu} rows per GPU per mini-batch = {micro}",
            f"log-prob        micro-batch per GPU: actor {self.log_prob_micro_batch_per_gpu}, "
            f"ref {self.ref_log_prob_micro_batch_per_gpu} (None = dynamic)",
        ]
        if self.critic_mini_batch_per_gpu is not None:
            lines.append(f"critic update   {self.critic_mini_batch_per_gpu} rows per GPU per mini-batch")
        return "\n".join(lines)


def derive_layout(config: PPOConfig, device_type: str | None = None) -> Layout:
    """Meshes and per-GPU batch sizes implied by a (PPO) config; raises ConfigError if it is inconsistent.
    device_type: "cpu" or "cuda", the device the run will have (trainer.device=auto leaves it to the machine);
    None: cpu only when trainer.device says so."""
    config.validate()
    actor, rollout, ref = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout, config.actor_rollout_ref.ref
    par = parallelism(config)
    world, fsdp, sp, tp = par.world_size, par.actor_fsdp, par.actor_sp, par.rollout_tp
    if fsdp == world:
        training_mesh, dims = list(range(world)), ("fsdp",)
    else:
        training_mesh, dims = _grid(world // fsdp, fsdp), ("ddp", "fsdp")
    n, tbs, mini = rollout.n, config.data.train_batch_size, actor.ppo_mini_batch_size
    gen = config.data.gen_batch_size or tbs
    train_dp, rollout_dp = world // sp, world // tp
    mini_per_gpu = mini * n // train_dp
    micro = None if actor.use_dynamic_bsz is True else actor.ppo_micro_batch_size_per_gpu
    critic_mini = critic_minis = None
    if config.algorithm.adv_estimator == "gae":
        critic_mini = config.critic.ppo_mini_batch_size * n // (world // par.critic_sp)
        critic_minis = tbs // config.critic.ppo_mini_batch_size
    return Layout(
        device=device_type or ("cpu" if config.trainer.device == "cpu" else "cuda"),
        parallel=par, training_mesh=training_mesh, training_mesh_dims=dims,
        sp_mesh=_grid(train_dp, sp) if sp > 1 else None, train_dp=train_dp, rollout_dp=rollout_dp,
        rollout_mesh=_grid(rollout_dp, tp),
        train_batch_size=tbs, gen_batch_size=gen, n=n, num_mini_batches=tbs // mini,
        ppo_mini_batch_per_gpu=mini_per_gpu, ppo_micro_batch_per_gpu=micro,
        grad_accum_steps=mini_per_gpu // micro if isinstance(micro, int) else None,
        log_prob_micro_batch_per_gpu=None if rollout.log_prob_use_dynamic_bsz is True else
        rollout.log_prob_micro_batch_size_per_gpu,
        ref_log_prob_micro_batch_per_gpu=None if ref.log_prob_use_dynamic_bsz is True else
        ref.log_prob_micro_batch_size_per_gpu,
        rollout_prompts_per_dp=gen // rollout_dp, rollout_samples_per_dp=gen // rollout_dp * n,
        critic_mini_batch_per_gpu=critic_mini, critic_num_mini_batches=critic_minis,
    )
