"""CriticWorker: the PPO value model on FSDP2 (one process per GPU, same training mesh as the actor)."""

from __future__ import annotations

import torch.distributed as dist

from hybridrl.controller import Dispatch, make_mesh_dispatch, register
from hybridrl.hybrid.memory import track_phase
from hybridrl.protocol import DataProto
from hybridrl.training.fsdp import FSDPDtypes
from hybridrl.workers.common import RoleWorker, build_fsdp_model, metric_lists, update_batches

# the critic's section has no dtype keys: fp32 master weights (AdamW), bf16 compute, fp32 gradient reduction (the
# actor's packaged defaults)
CRITIC_DTYPES = FSDPDtypes(model="fp32", param="bf16", reduce="fp32")


class CriticWorker(RoleWorker):
    """Built from the config and the run plan (its shape, micro-batch sizes and the unshard choice)."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        meshes = self.setup_process("critic", dispatch="critic")
        rank, sp_group = dist.get_rank(), meshes.sp_group
        c, critic_plan = self.config.critic, self.plan.critic
        self.mesh = meshes.training
        self.module, self.optimizer, self.scheduler = build_fsdp_model(
            c.model, CRITIC_DTYPES, c.optim, self.mesh, self.compute_device, trainable=True, critic=True,
            fused_optimizer=self.plan.fused_optimizer, gradient_checkpointing=critic_plan.gradient_checkpointing,
            recompute_kept_layers=critic_plan.recompute_kept_layers,
            use_varlen_attention=critic_plan.remove_padding or critic_plan.share_prompts)
        from hybridrl.training.critic import DataParallelPPOCritic

        self.critic = DataParallelPPOCritic(c, self.module, self.optimizer, self.scheduler,
                                            batches=update_batches(self.plan.layout.critic_mini_batch_per_gpu,
                                                                   critic_plan.update), sp_group=sp_group,
                                            use_remove_padding=critic_plan.remove_padding,
                                            activation_offload=c.model.enable_activation_offload,
                                            share_prompts=critic_plan.share_prompts)
        self._param_offload = c.model.fsdp_config.param_offload
        self._optimizer_offload = c.model.fsdp_config.optimizer_offload
        self._optimizer_on_cpu = False  # AdamW state is created lazily at the first step, on the GPU
        self._offload(params=self._param_offload, optimizer=False)
        return {"rank": rank}

    def _offload(self, params: bool, optimizer: bool):
        from hybridrl.training.offload import offload_fsdp_params, offload_optimizer

        if params:
            offload_fsdp_params(self.module)
        if optimizer:
            offload_optimizer(self.optimizer)

    def _load(self, params: bool, optimizer: bool):
        from hybridrl.training.offload import load_fsdp_params, load_optimizer

        if params:
            load_fsdp_params(self.module, self.compute_device)
        if optimizer:
            load_optimizer(self.optimizer, self.compute_device)

    def _load_optimizer_state(self) -> None:
        if self._optimizer_on_cpu:
            self._load(params=False, optimizer=True)
            self._optimizer_on_cpu = False

    @register(dispatch_mode=make_mesh_dispatch("critic"))
    def compute_values(self, data: DataProto) -> DataProto:
        metrics: dict = {}
        values = self.plan.critic.values
        data.meta_info["micro_batch_size"] = values.rows
        data.meta_info["use_dynamic_bsz"] = values.rows is None
        data.meta_info["max_token_len"] = values.max_tokens
        data.meta_info["unshard_once"] = values.unshard_once
        with track_phase("values", metrics, self.compute_device):
            self._load(params=self._param_offload, optimizer=False)
            values = self.critic.compute_values(data)
            self._offload(params=self._param_offload, optimizer=False)
        return DataProto({"values": values.cpu()}, meta_info={"metrics": metric_lists(metrics)})

    @register(dispatch_mode=make_mesh_dispatch("critic"))
    def update_critic(self, data: DataProto) -> DataProto:
        metrics: dict = {}
        with track_phase("update_critic", metrics, self.compute_device):
            # with optimizer_offload the state is on the GPU only from the update's first optimizer step (after its
            # backward) to the update's end
            self._load(params=self._param_offload, optimizer=False)
            self.critic.before_optimizer_step = self._load_optimizer_state
            try:
                train_metrics = self.critic.update_critic(data)
            finally:
                self.critic.before_optimizer_step = None
            self._offload(params=self._param_offload, optimizer=self._optimizer_offload)
            self._optimizer_on_cpu = self._optimizer_offload
        metrics.update(train_metrics)
        return DataProto(meta_info={"metrics": metric_lists(metrics)})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str):
        from hybridrl.training.checkpoint import save_checkpoint

        self._load(params=self._param_offload, optimizer=self._optimizer_on_cpu)
        self._optimizer_on_cpu = False
        save_checkpoint(path, self.module, self.optimizer, self.scheduler, role="critic",
                        hf_config=self.module.config)
        return True

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str):
        from hybridrl.training.checkpoint import load_checkpoint

        self._load(params=self._param_offload, optimizer=self._optimizer_on_cpu)
        self._optimizer_on_cpu = False
        load_checkpoint(path, self.module, self.optimizer, self.scheduler)
        return True
