"""The FSDP2 training engine that runs inside each worker process on its GPU (not to be confused with
`hybridrl.trainer`, the driver's fit loop that calls the workers): mesh + per-block wrapping (fsdp), AdamW +
schedule (optim), phase offload (offload), sequence packing and its attention (packing, packed_attention), the
forward to the response positions (response_forward), dynamic micro-batches (token_bins, micro_batches),
the PPO actor and critic updates (actor, critic), sharded checkpoints of one model (checkpoint), HF export
(hf_export) and the offline merge of a checkpoint into a HF directory (merge). It knows nothing of Ray or of
the run's steps: a worker hands it a batch and gets losses and log-probs back."""

from hybridrl.training.actor import DataParallelPPOActor
from hybridrl.training.checkpoint import load_checkpoint, save_checkpoint, save_hf_model
from hybridrl.training.critic import DataParallelPPOCritic
from hybridrl.training.fsdp import apply_fsdp, build_fsdp_model, build_training_mesh, load_hf_model
from hybridrl.training.merge import merge_checkpoint
from hybridrl.training.offload import load_fsdp_params, load_optimizer, offload_fsdp_params, offload_optimizer
from hybridrl.training.optim import build_lr_scheduler, build_optimizer

__all__ = ["DataParallelPPOActor", "DataParallelPPOCritic", "apply_fsdp", "build_fsdp_model", "build_training_mesh",
           "load_hf_model", "build_optimizer", "build_lr_scheduler", "save_checkpoint", "load_checkpoint",
           "save_hf_model", "merge_checkpoint", "offload_fsdp_params", "load_fsdp_params", "offload_optimizer",
           "load_optimizer"]
