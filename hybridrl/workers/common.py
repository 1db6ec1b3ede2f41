"""What the workers share: the setup every role does first (`RoleWorker`), device choice, per-rank update sizes,
metrics for the driver, sampling parameters, model building."""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist

from hybridrl.config.sections import PPOConfig, Section
from hybridrl.config.sections.optim import OptimConfig
from hybridrl.config.sections.rollout import RolloutConfig
from hybridrl.controller import Worker
from hybridrl.hybrid.meshes import format_mesh
from hybridrl.protocol import DataProto
from hybridrl.training.fsdp import FSDPDtypes, ModelSource
from hybridrl.training.micro_batches import UpdateBatches

logger = logging.getLogger(__name__)


class RoleWorker(Worker):
    """A role's process (one per GPU): the config, the run plan — its shape (`plan.parallel`) and sizes, read here
    and never re-derived from the config — and the setup every role does before building its model."""

    def __init__(self, config: PPOConfig, plan):
        super().__init__()
        self.config = config
        self.plan = plan  # hybridrl.plan.RunPlan

    def setup_process(self, role: str, dispatch: str, rollout: bool = False):
        """Seed, import external_lib, join the process group, pick the device, build `role`'s meshes from the plan
        (plan/shape.py; `rollout`: the rollout mesh too) and declare this rank's place in mesh `dispatch` (the
        ranks of a Ulysses group are one data-parallel rank). Returns the Meshes."""
        prepare_process(self.config)
        self.init_distributed(timeout_s=self.config.trainer.worker_timeout_s)
        self.compute_device = pick_device(self.config.trainer.device)
        meshes = self.plan.parallel.build_meshes(self.compute_device.type, role, rollout=rollout)
        if meshes.sp is not None:
            logger.debug("%s ulysses_device_mesh: %s", role, format_mesh(meshes.sp))
        self.set_dispatch_info(dispatch, *meshes.data_parallel(dist.get_rank()))
        return meshes


def metric_lists(metrics: dict) -> dict:
    """A worker's metrics as the driver collects them: each value a list (a scalar becomes [value]; lists, e.g. one
    entry per micro-batch, stay)."""
    return {k: (v if isinstance(v, list) else [v]) for k, v in metrics.items()}


def prompt_token_lists(prompts: DataProto) -> list[list[int]]:
    """Unpadded prompt ids: `raw_prompt_ids` when the dataset kept them, else the unmasked part of input_ids."""
    if "raw_prompt_ids" in prompts.non_tensor_batch:
        return [list(map(int, ids)) for ids in prompts.non_tensor_batch["raw_prompt_ids"]]
    ids, mask = prompts.batch["input_ids"], prompts.batch["attention_mask"].bool()
    return [row[m].tolist() for row, m in zip(ids, mask)]


def pick_device(device: str) -> torch.device:
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("trainer.device=cuda but no CUDA device is visible to this worker")
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(device)


def update_batches(mini_batch_rows: int, micro) -> UpdateBatches:
    """An update's per-rank sizes (training/micro_batches.py), all the run plan's: `mini_batch_rows` per rank (verl's
    global prompts x n / dp, plan.layout) and the update's `micro` (plan/sizing.py MicroBatching: rows, or a token
    budget with rows None; whether its blocks stay gathered for a mini-batch)."""
    return UpdateBatches(mini_batch_rows, micro.rows, micro.max_tokens, micro.unshard_once)


def sampling_params_from(rollout_cfg: RolloutConfig, meta: dict, dp_rank: int = 0):
    """Training rollouts use rollout.*; validation sends meta_info {'validate': True} and uses rollout.val_kwargs;
    meta_info may override do_sample / n / temperature (e.g. ReMax's greedy baseline). The seed is the driver's
    (meta_info['seed'], else rollout.seed) plus this rollout data-parallel group's `dp_rank`: groups draw
    different streams, the TP ranks of a group the same one (hybridrl/seeding.py)."""
    from hybridrl.rollout.sampling_params import SamplingParams

    src = rollout_cfg.val_kwargs if meta.get("validate") else rollout_cfg
    do_sample = bool(meta.get("do_sample", src.do_sample))
    temperature = float(meta.get("temperature", src.temperature)) if do_sample else 0.0
    n = int(meta.get("n", src.n))
    return SamplingParams(
        n=n, temperature=temperature, do_sample=do_sample,
        top_p=src.top_p if do_sample else 1.0,
        top_k=src.top_k if do_sample else -1,
        max_tokens=int(meta.get("max_tokens", rollout_cfg.response_length)),
        ignore_eos=rollout_cfg.ignore_eos,
        stop_token_ids=list(meta.get("stop_token_ids", [])),
        seed=int(meta.get("seed", rollout_cfg.seed)) + int(dp_rank),
    )


def build_fsdp_model(model_cfg: Section, dtypes: FSDPDtypes, optim_cfg: OptimConfig | None, mesh, device,
                     trainable: bool, critic: bool = False, lora_base_dtype=None, fused_optimizer: bool = False,
                     gradient_checkpointing: bool = False, recompute_kept_layers: int = 0, liger: bool = False,
                     use_varlen_attention: bool = False):
    """HF model → FSDP2 (training/ applies FSDP; the model never knows) from a role's typed model and optim
    sections and its FSDP dtypes (`FSDPDtypes.of(fsdp_config)`). Returns (module, optimizer, scheduler).
    A trained actor or critic gets LoRA adapters when `model.lora_rank` > 0, in `dtypes.model`, over a frozen base
    stored in `lora_base_dtype` (the plan's; None: dtypes.model); the critic's value head trains whole beside them;
    the optimizer holds only what requires grad (the adapters, and the head, then; every parameter otherwise); `fused_optimizer`, `gradient_checkpointing` with `recompute_kept_layers`
    (trained models only), `liger` and `use_varlen_attention` (packed forwards) are the plan's choices."""
    from hybridrl.training.fsdp import build_fsdp_model as shard
    from hybridrl.training.lora import lora_settings
    from hybridrl.training.optim import build_lr_scheduler, build_optimizer

    lora = lora_settings(model_cfg, "critic.model" if critic else "actor_rollout_ref.model") if trainable else None
    module = shard(ModelSource.of(model_cfg), dtypes, mesh, device, role="critic" if critic else "actor", lora=lora,
                   lora_base_dtype=lora_base_dtype, gradient_checkpointing=trainable and gradient_checkpointing,
                   recompute_kept_layers=recompute_kept_layers, liger=liger, use_varlen_attention=use_varlen_attention)
    if not trainable:
        module.requires_grad_(False)
        return module, None, None
    optimizer = build_optimizer([p for p in module.parameters() if p.requires_grad], optim_cfg, fused=fused_optimizer)
    scheduler = build_lr_scheduler(optimizer, optim_cfg)
    return module, optimizer, scheduler


def prepare_process(config: PPOConfig) -> None:
    """What every process of a run does before it builds a model: seed its RNGs from trainer.seed and import
    actor_rollout_ref.model.external_lib (custom HF classes must be registered before from_pretrained)."""
    from hybridrl.models.external_lib import import_external_lib
    from hybridrl.seeding import seed_everything

    seed_everything(config.trainer.seed)
    import_external_lib(config.actor_rollout_ref.model.external_lib)
