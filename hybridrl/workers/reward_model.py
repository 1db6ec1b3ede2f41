"""RewardModelWorker: a sequence-classification reward model on FSDP2, one process per GPU colocated with the actor
(`reward_model.enable=true`, `style=model`; verl's RewardModelWorker).

It never trains: weights are kept in the compute dtype (bf16 on GPUs, fp32 on CPU) with no optimizer, and with
`reward_model.model.fsdp_config.param_offload` (the default) its shards live on the CPU except inside
`compute_rm_score`, so the rollout and the updates do not pay for it. Each call decodes / re-renders the samples
it is given (rewards/rm_inputs.py), scores them in micro-batches of the run plan's size and returns verl's
`rm_scores` [B, R]: the score at the last valid response token. Data-parallel over all ranks (mesh "reward").
"""

from __future__ import annotations

import os

import torch.distributed as dist

from hybridrl.controller import Dispatch, make_mesh_dispatch, register
from hybridrl.hybrid.memory import track_phase
from hybridrl.protocol import DataProto
from hybridrl.workers.common import RoleWorker, metric_lists


def _tokenizer(path: str, trust_remote_code: bool):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(os.path.expanduser(path), trust_remote_code=trust_remote_code)


class RewardModelWorker(RoleWorker):
    """Built from the config and the run plan (its shape, micro-batch size, unshard choice, input length)."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        mesh = self.setup_process("reward", dispatch="reward").training
        rm = self.config.reward_model
        from hybridrl.training.fsdp import FSDPDtypes, ModelSource, build_fsdp_model
        dtypes = FSDPDtypes(model=self.plan.frozen_dtype, param="bf16", reduce="fp32")   # no master copy: never trains
        self.module = build_fsdp_model(ModelSource.of(rm.model), dtypes, mesh, self.compute_device,
                                       role="reward_model")
        self.module.requires_grad_(False)
        trust = rm.model.trust_remote_code
        self.tokenizer = _tokenizer(rm.model.path, trust)
        self.input_tokenizer = _tokenizer(rm.model.input_tokenizer, trust) if rm.model.input_tokenizer else None
        self.pad_token_id = next(t for t in (self.tokenizer.pad_token_id, self.tokenizer.eos_token_id, 0)
                                 if t is not None)
        self._param_offload = rm.model.fsdp_config.param_offload
        if self._param_offload:
            from hybridrl.training.offload import offload_fsdp_params

            offload_fsdp_params(self.module)
        return {"rank": dist.get_rank()}

    @register(dispatch_mode=make_mesh_dispatch("reward"))
    def compute_rm_score(self, data: DataProto) -> DataProto:
        from hybridrl.rewards.rm_inputs import rm_token_lists
        from hybridrl.rewards.token_level import place_at_last_token
        from hybridrl.training.offload import load_fsdp_params, offload_fsdp_params
        from hybridrl.training.reward_model import score_sequences

        rm = self.config.reward_model
        sequences, truncated = rm_token_lists(data, self.tokenizer, self.input_tokenizer,
                                              self.plan.reward_model.max_length, rm.truncation)
        metrics: dict = {}
        with track_phase("reward_model", metrics, self.compute_device):
            if self._param_offload:
                load_fsdp_params(self.module, self.compute_device)
            forward = self.plan.reward_model.forward
            scores = score_sequences(self.module, sequences, forward.rows, self.pad_token_id, self.compute_device,
                                     forward.unshard_once, max_tokens=forward.max_tokens)
            if self._param_offload:
                offload_fsdp_params(self.module)
        rm_scores, _ = place_at_last_token(scores, data.batch["response_mask"])
        metrics["reward_model/truncated"] = float(truncated)  # per rank: the driver sums it
        return DataProto({"rm_scores": rm_scores}, meta_info={"metrics": metric_lists(metrics)})
