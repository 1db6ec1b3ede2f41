"""hybridrl: RL post-training of LLMs with a 3D-HybridEngine (FSDP training and TP rollout on the same GPUs)."""

__version__ = "0.1.0"
