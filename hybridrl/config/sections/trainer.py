"""The `trainer` section: the devices, the run's length, logging and checkpoints."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hybridrl.config.sections.base import Section
from hybridrl.config.sections.rules import Findings
from hybridrl.config.sections.values import Device, LoggerName


@dataclass(frozen=True)
class TrainerConfig(Section):
    """`trainer`."""

    balance_batch: bool
    """reorder samples so every dp rank gets a similar token count"""
    total_epochs: int
    """passes over the training set"""
    total_training_steps: int | None
    """null = epochs x steps per epoch; set = stop after this many steps"""
    project_name: str
    """logger project"""
    experiment_name: str
    """logger run name"""
    logger: list[LoggerName] | LoggerName
    """console (a short line a step: step k/N, elapsed, ETA, a few numbers) | file (every metric,
    {default_local_dir}/logs/metrics.jsonl) | tensorboard | wandb | mlflow"""
    log_val_generations: int
    """validation samples to log as text each test"""
    rollout_data_dir: str | None
    """a directory: each training step's samples written to {step}.jsonl (input, output, gts, score, step, uid), as
    verl writes them; null = none"""
    validation_data_dir: str | None
    """a directory: each validation's samples written to {step}.jsonl (input, output, gts, score, step, uid and the
    scorer's per-sample extra info); null = none"""
    nnodes: int
    """machines"""
    n_gpus_per_node: int
    """GPUs (worker processes) per machine"""
    device: Device
    """auto | cuda | cpu"""
    gpu_memory_gb: float | None
    """plan each GPU as holding this many GiB (null = its whole memory): every phase, the KV cache and the update's
    micro-batches are sized to fit it, so several runs can share a GPU; more than the GPU holds is refused"""
    ray_address: str | None
    """null = RAY_ADDRESS or a local Ray"""
    worker_timeout_s: int
    """a worker call (or hung collective) longer than this ends the run"""
    save_freq: int
    """checkpoint every this many steps; -1 = never"""
    resume_mode: Literal["auto", "disable", "resume_path"]
    """auto | disable | resume_path"""
    resume_from_path: str | None
    """checkpoint directory with resume_mode=resume_path"""
    val_before_train: bool
    """validate once before the first step"""
    val_only: bool
    """validate once (at the step a resume loads, else the initial weights) and stop without training; needs
    data.val_files"""
    test_freq: int
    """validate every this many steps; -1 = never"""
    critic_warmup: int
    """steps that update only the critic"""
    default_local_dir: str
    """checkpoint root"""
    max_actor_ckpt_to_keep: int | None
    """null = keep all"""
    max_critic_ckpt_to_keep: int | None
    """null = same as max_actor_ckpt_to_keep; another value is refused (one checkpoint directory holds actor and
    critic)"""
    seed: int
    """global seed: random/numpy/torch in the driver and every worker, the rollout sampling seed of each step,
    mini-batch shuffles"""

    @property
    def world_size(self) -> int:
        """Worker processes of the run: nnodes x n_gpus_per_node."""
        return self.nnodes * self.n_gpus_per_node

    def check_sizes(self, found: Findings) -> None:
        found.positive(self, "trainer", ("nnodes", "n_gpus_per_node", "total_epochs"))
        found.positive_or_unset(self, "trainer", ("total_training_steps", "gpu_memory_gb"))

    def check(self, found: Findings, val_files) -> None:
        if self.val_only and not val_files:
            found.errors.append("'trainer.val_only' = true needs validation data: 'data.val_files' is null")
        actor_keep, critic_keep = self.max_actor_ckpt_to_keep, self.max_critic_ckpt_to_keep
        if critic_keep is not None and critic_keep != actor_keep:
            found.errors.append(f"'trainer.max_critic_ckpt_to_keep' = {critic_keep} differs from "
                                f"'trainer.max_actor_ckpt_to_keep' = {actor_keep}: one checkpoint directory per step "
                                "holds both actor and critic (a step without its critic could not be resumed); set it "
                                "to null or to the actor's value")
