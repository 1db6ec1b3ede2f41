"""ActorRolloutRefWorker: one process per GPU holding the actor (FSDP2), the reference and the rollout engine.

Colocating the three roles in one process is what lets the hybrid engine hand memory from one phase to the next
(training shards ↔ engine weights + KV) instead of keeping a copy per role. The worker composes parts that live
elsewhere — it owns no algorithm:
  training/  FSDP2 wrapping, the PPO actor (log-probs, update), checkpoints
  rollout/   the generation engine (TP over this rank's infer_tp group)
  hybrid/    the two meshes, resharding FSDP→TP, the per-phase memory order
Dispatch: generation is split over the rollout mesh's dp (every rank of a TP group gets the same chunk, rank 0 of
the group returns it); log-probs and updates are split over all ranks (the training mesh is pure data parallel).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import replace
from functools import partial

import torch
import torch.distributed as dist

from hybridrl.config.sections import PPOConfig
from hybridrl.controller import Dispatch, make_mesh_dispatch, register
from hybridrl.hybrid.engine import HybridEngine
from hybridrl.hybrid.memory import track_phase
from hybridrl.hybrid.meshes import format_mesh, rollout_coords
from hybridrl.protocol import DataProto
from hybridrl.training.fsdp import FSDPDtypes
from hybridrl.training.lora import adapters_disabled, has_lora
from hybridrl.workers.common import (
    RoleWorker,
    build_fsdp_model,
    metric_lists,
    prompt_token_lists,
    sampling_params_from,
    update_batches,
)
from hybridrl.workers.early_update import EarlyUpdateWorker

logger = logging.getLogger("hybridrl.workers")


def setup_worker_logging():
    """Ray starts workers without logging handlers: install one when the user asked for a level (verl's
    VERL_LOG_LEVEL is honoured too), so DEBUG lines such as the two device meshes reach the driver's console."""
    level = os.environ.get("HYBRIDRL_LOG_LEVEL") or os.environ.get("VERL_LOG_LEVEL")
    if level:
        logging.basicConfig(level=level.upper(), format="%(name)s: %(message)s")
        logger.setLevel(level.upper())


def build_tool_agent(config: PPOConfig, eos_token_ids, max_running_seqs: int):
    """The multi-turn agent of `rollout.multi_turn` (None when disabled): the user's agent loop
    (`agent_loop.path`), else the ToolAgent with its tools from tool_config_path and interactions; messages are
    rendered with the policy's tokenizer and chat template (models/tokenizer.py). `max_running_seqs` (the engine's)
    sizes the ToolAgent's thread pools: every running sequence may wait on its tools at once."""
    mt = config.actor_rollout_ref.rollout.multi_turn
    if not mt.enable:
        return None
    from hybridrl.models.tokenizer import policy_tokenizer

    if mt.agent_loop.path:
        from hybridrl.rollout.agent_loop import load_agent_loop

        return load_agent_loop(mt, policy_tokenizer(config), eos_token_ids)
    from hybridrl.rollout.interactions import load_interactions
    from hybridrl.rollout.multi_turn import MultiTurnSettings, ToolAgent
    from hybridrl.tools.registry import load_tool_config

    tools = load_tool_config(mt.tool_config_path) if mt.tool_config_path else {}
    interactions = load_interactions(mt.interaction_config_path) if mt.interaction_config_path else None
    return ToolAgent(policy_tokenizer(config), tools, MultiTurnSettings.from_config(mt), eos_token_ids=eos_token_ids,
                     interactions=interactions, max_running_seqs=max_running_seqs)


class ActorRolloutRefWorker(EarlyUpdateWorker, RoleWorker):
    def __init__(self, config: PPOConfig, plan, role: str = "actor_rollout_ref"):
        super().__init__(config, plan)  # plan: shape, micro-batches, KV blocks, unshard and reshard choices
        setup_worker_logging()
        if role not in ("actor_rollout", "actor_rollout_ref", "ref"):
            raise ValueError(f"ActorRolloutRefWorker role must be actor_rollout, actor_rollout_ref or ref, got {role!r}")
        self.role = role
        self._has_actor = role in ("actor_rollout", "actor_rollout_ref")
        self._has_ref = role in ("actor_rollout_ref", "ref")

    # ------------------------------------------------------------------ setup
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        cfg = self.config.actor_rollout_ref
        # Ulysses SP: the ranks of an SP group are one data-parallel rank of the actor, all fed the same rows
        meshes = self.setup_process("actor", dispatch="actor", rollout=self._has_actor)
        rank = dist.get_rank()
        self.device_mesh, self.sp_group = meshes.training, meshes.sp_group
        logger.debug("self.device_mesh: %s", format_mesh(self.device_mesh, with_names=False))
        actor_plan = self.plan.actor
        packed = actor_plan.remove_padding
        share = actor_plan.share_prompts   # shared-prompt forwards are packed ones: the varlen attention runs them

        if self._has_actor:
            self.actor_module, self.optimizer, self.scheduler = build_fsdp_model(
                cfg.model, FSDPDtypes.of(cfg.actor.fsdp_config), cfg.actor.optim, self.device_mesh, self.compute_device, trainable=True,
                lora_base_dtype=actor_plan.lora_base_dtype, fused_optimizer=self.plan.fused_optimizer,
                gradient_checkpointing=actor_plan.gradient_checkpointing,
                recompute_kept_layers=actor_plan.recompute_kept_layers, liger=actor_plan.use_liger,
                use_varlen_attention=packed or share)
            from hybridrl.training.actor import DataParallelPPOActor

            self.actor = DataParallelPPOActor(cfg.actor, self.actor_module, self.optimizer, self.scheduler,
                                              batches=update_batches(self.plan.layout.ppo_mini_batch_per_gpu,
                                                                     actor_plan.update),
                                              use_remove_padding=packed, sp_group=self.sp_group,
                                              activation_offload=actor_plan.activation_offload,
                                              share_prompts=share)
            self._build_rollout(meshes.rollout)
        if self._has_ref and self._has_actor and has_lora(self.actor_module):
            # LoRA: the reference is the actor's own module with its adapters switched off (no second copy)
            from hybridrl.training.actor import DataParallelPPOActor

            self.ref_module, self._ref_offload = self.actor_module, False
            self.ref = DataParallelPPOActor(cfg.actor, self.ref_module, use_remove_padding=packed,
                                            sp_group=self.sp_group, share_prompts=share)
        elif self._has_ref:
            # the reference never trains: keep it in the compute dtype (the plan's), no fp32 master copy
            ref_dtypes = replace(FSDPDtypes.of(cfg.actor.fsdp_config), model=self.plan.frozen_dtype)
            self.ref_module, _, _ = build_fsdp_model(cfg.model, ref_dtypes, None, self.device_mesh,
                                                     self.compute_device, trainable=False, liger=actor_plan.use_liger,
                                                     use_varlen_attention=packed or share)
            from hybridrl.training.actor import DataParallelPPOActor

            self.ref = DataParallelPPOActor(cfg.actor, self.ref_module, use_remove_padding=packed,
                                            sp_group=self.sp_group, share_prompts=share)
            self._ref_offload = cfg.ref.fsdp_config.param_offload
            if self._ref_offload:
                from hybridrl.training.offload import offload_fsdp_params

                offload_fsdp_params(self.ref_module)
        info = {"rank": rank, "device": str(self.compute_device)}
        if self.compute_device.type == "cuda":  # the seed's "init" row: memory once the FSDP actor (and ref) exist
            torch.cuda.synchronize()
            info["init_peak_allocated_gb"] = torch.cuda.max_memory_allocated() / 1024**3
            info["init_allocated_gb"] = torch.cuda.memory_allocated() / 1024**3
        return info

    def _build_rollout(self, rollout_mesh):
        cfg = self.config.actor_rollout_ref
        par = self.plan.parallel
        tp = par.rollout_tp
        coords = rollout_coords(dist.get_rank(), par.world_size, tp)
        self.rollout_mesh = rollout_mesh
        logger.debug("rollout_device_mesh in ActorRolloutRefWorker._build_rollout: %s", format_mesh(self.rollout_mesh))
        self.set_dispatch_info("rollout", coords.dp_rank, coords.dp_size, coords.is_collect)
        self.rollout_coords = coords

        from hybridrl.rollout.factory import build_rollout_engine
        from hybridrl.training.fsdp import resolve_dtype

        dtype = resolve_dtype(self.plan.rollout.dtype, "plan.rollout.dtype")
        self.engine = build_rollout_engine(
            self.config, self.plan, device=self.compute_device,
            tp_group=self.rollout_mesh.get_group("infer_tp") if tp > 1 else None, actor_module=self.actor_module)
        self.tool_agent = build_tool_agent(self.config, getattr(self.engine, "eos_token_ids", ()),
                                           self.plan.rollout.kv_cache.max_num_seqs)
        self.hybrid = HybridEngine(
            self.actor_module, self.optimizer, self.engine, device=self.compute_device, dtype=dtype,
            hybrid=self.plan.rollout.hybrid,
            param_offload=cfg.actor.fsdp_config.param_offload,
            optimizer_offload=self.plan.actor.optimizer_offload,
            reshard_strategy=self.plan.rollout.reshard_strategy, borrow_weights=self.plan.rollout.borrow_weights)
        borrowed = self.hybrid.resharder.borrowed_params() if self.plan.rollout.borrow_weights else 0
        if borrowed != self.plan.rollout.borrowed_params:
            logger.warning("the rollout engine borrows %d of the actor's parameters where the plan predicted %d: "
                           "its memory prediction is off by %.2f GiB", borrowed, self.plan.rollout.borrowed_params,
                           (self.plan.rollout.borrowed_params - borrowed) * 2 / 2**30)

    # ------------------------------------------------------------------ rollout
    @register(dispatch_mode=make_mesh_dispatch("rollout"))
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        from hybridrl.rollout.to_dataproto import outputs_to_dataproto

        rcfg = self.config.actor_rollout_ref.rollout
        params = sampling_params_from(rcfg, prompts.meta_info, dp_rank=self.rollout_coords.dp_rank)
        agent = {"agent": self.tool_agent} if self.tool_agent is not None else {}
        if agent:  # each prompt's row: interaction kwargs, or what an agent loop reads (messages, ground truth)
            self.tool_agent.begin_batch(prompts.non_tensor_batch)
        outputs, metrics = self._generate(prompt_token_lists(prompts), params,
                                          self.plan.rollout.kv_cache.blocks_for(len(prompts), params.n), **agent)
        out = outputs_to_dataproto(prompts, outputs, response_length=rcfg.response_length,
                                   pad_token_id=int(prompts.meta_info.get("pad_token_id", 0)))
        out.meta_info["metrics"] = metric_lists(metrics)
        return out

    @register(dispatch_mode=make_mesh_dispatch("rollout"))
    def continue_sequences(self, samples: DataProto) -> DataProto:
        """Partial rollouts: one row per sample, fresh or carried (rollout/to_dataproto.py's CARRIED_KEYS), each
        generated for at most the plan's per-step token budget; returns each row's completion so far."""
        from hybridrl.rollout.to_dataproto import completions_to_dataproto, sample_requests

        rcfg = self.config.actor_rollout_ref.rollout
        params = replace(sampling_params_from(rcfg, samples.meta_info, dp_rank=self.rollout_coords.dp_rank),
                         token_budget=self.plan.rollout.partial.tokens_per_step)
        prompts, conts, first_rows = sample_requests(prompt_token_lists(samples), samples, params.n)
        kv_blocks = self.plan.rollout.kv_cache.blocks_for(len(prompts), params.n, len(conts))
        outputs, metrics = self._generate(prompts, params, kv_blocks, continuations=conts)
        out = completions_to_dataproto(outputs, first_rows, len(samples))
        out.meta_info["metrics"] = metric_lists(metrics)
        return out

    def _generate(self, prompts: list[list[int]], params, num_kv_blocks: int, beside_training: bool = False,
                  **kwargs):
        """(the engine's outputs, this rollout's metrics): one generate call between the hybrid engine's wake-up
        (weights resharded in, KV allocated) and its sleep; `beside_training`: the early update trains meanwhile."""
        metrics: dict = {}
        t0 = time.perf_counter()
        with self.hybrid.rollout(metrics, num_kv_blocks=num_kv_blocks, beside_training=beside_training) as engine:
            tg = time.perf_counter()
            outputs = engine.generate(prompts, params, **kwargs)
            metrics["timing_s/gen_engine"] = time.perf_counter() - tg
            for k, v in getattr(engine, "stats", {}).items():
                if isinstance(v, (int, float)):
                    metrics[f"rollout/{k}"] = float(v)
        metrics["timing_s/rollout_total"] = time.perf_counter() - t0
        return outputs, metrics

    # ------------------------------------------------------------------ log-probs
    def _log_prob_meta(self, data: DataProto, section: str) -> DataProto:
        """meta_info for a log-prob pass (rollout: old log-probs, ref: reference): its micro-batch rows or token
        budget from the plan."""
        old = section == "rollout"
        data.meta_info.setdefault("temperature", self.config.actor_rollout_ref.rollout.temperature)
        micro = self.plan.actor.old_log_prob if old else self.plan.actor.ref_log_prob
        data.meta_info["micro_batch_size"] = micro.rows
        data.meta_info["use_dynamic_bsz"] = micro.rows is None
        data.meta_info["max_token_len"] = micro.max_tokens
        data.meta_info["unshard_once"] = micro.unshard_once
        return data

    @register(dispatch_mode=make_mesh_dispatch("actor"))
    def compute_log_prob(self, data: DataProto) -> DataProto:
        metrics: dict = {}
        data = self._log_prob_meta(data, "rollout")
        with track_phase("old_log_prob", metrics, self.compute_device):
            stats = self.actor.compute_log_prob_stats(
                data, calculate_entropy=True,
                calculate_sum_pi_squared=self.config.actor_rollout_ref.actor.calculate_sum_pi_squared)
        tensors = {"old_log_probs": stats["log_probs"], "entropys": stats["entropy"]}
        if "sum_pi_squared" in stats:
            tensors["sum_pi_squared"] = stats["sum_pi_squared"]
        return DataProto(tensors, meta_info={"metrics": metric_lists(metrics)})

    @register(dispatch_mode=make_mesh_dispatch("actor"))
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        metrics: dict = {}
        data = self._log_prob_meta(data, "ref")
        from hybridrl.training.offload import load_fsdp_params, offload_fsdp_params

        with track_phase("ref", metrics, self.compute_device):
            if self._ref_offload:  # the reference lives on the CPU except while it computes
                load_fsdp_params(self.ref_module, self.compute_device)
            with adapters_disabled(self.ref_module):  # LoRA: base weights only; no-op without adapters
                log_probs, _ = self.ref.compute_log_prob(data, calculate_entropy=False)
            if self._ref_offload:
                offload_fsdp_params(self.ref_module)
        return DataProto({"ref_log_prob": log_probs.cpu()}, meta_info={"metrics": metric_lists(metrics)})

    # ------------------------------------------------------------------ update
    @register(dispatch_mode=make_mesh_dispatch("actor"))
    def update_actor(self, data: DataProto) -> DataProto:
        metrics: dict = {}
        data.meta_info.setdefault("temperature", self.config.actor_rollout_ref.rollout.temperature)
        with track_phase("update_actor", metrics, self.compute_device):
            self.actor.before_optimizer_step = partial(self.hybrid.before_update, metrics)
            try:
                train_metrics = self.actor.update_policy(data)
            finally:
                self.actor.before_optimizer_step = None
        self.hybrid.after_update()
        metrics.update(train_metrics)
        # without an old-log-prob pass the update's own log-probs were the old ones: they go back to the driver
        own = self.actor.own_old_log_probs
        return DataProto({} if own is None else {"old_log_probs": own},
                         meta_info={"metrics": metric_lists(metrics)})

    # ------------------------------------------------------------------ checkpoints
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str):
        from hybridrl.training.checkpoint import save_checkpoint

        save_checkpoint(path, self.actor_module, self.optimizer, self.scheduler, role="actor",
                        hf_config=self.actor_module.config, contents=self._checkpoint_contents())
        return True

    def _checkpoint_contents(self) -> tuple[str, ...]:
        """actor.checkpoint.contents: what is saved and, on resume, loaded (a resume without 'optimizer' starts
        a fresh AdamW; without 'extra' a fresh lr schedule and unrestored RNG states)."""
        return tuple(self.config.actor_rollout_ref.actor.checkpoint.contents)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str):
        from hybridrl.training.checkpoint import load_checkpoint

        load_checkpoint(path, self.actor_module, self.optimizer, self.scheduler, contents=self._checkpoint_contents())
        self.hybrid.after_update()
        return True

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def describe(self):
        return {"rank": dist.get_rank(), "device_mesh": format_mesh(self.device_mesh, with_names=False),
                "rollout_mesh": format_mesh(self.rollout_mesh) if self._has_actor else None,
                "config": self.config.actor_rollout_ref.rollout.to_dict()}
