"""Host memory the offloads pin, per node, against what the node has available: the plan's check that an offload
cannot take the host down mid-run.

Every offload keeps its host copies in pinned (page-locked) memory, which the kernel can neither swap nor reclaim:
- parameter and optimizer offload (training/offload.py) pin one host twin per offloaded tensor, kept for the whole
  run and packed into power-of-two buffers (within ~3% of the bytes: `PACKING_SLACK`). They are allocated at the
  first offload, so an over-committed host fails one step into the run, after the first rollout and update;
- activation offload (training/activation_offload.py) copies each checkpointed layer's input of an update
  micro-batch into torch's caching host allocator, which rounds every block up to a power of two and keeps it.

Each GPU rank of a node pins its own shards, so the node needs (ranks per node) x (one rank's pinned bytes). The
plan allows `HOST_SAFETY` of the host memory available when it plans (`DeviceSpec.host_bytes`: MemAvailable of the
node the GPUs are on), leaving the rest to the worker processes themselves, the data and Ray's object store.
Nothing is checked where the host memory is unknown (a CPU plan, or `config check --gpu-memory-gb` without
`--host-memory-gb`).
"""

from __future__ import annotations

from hybridrl.plan.memory import GiB, MemoryModel, PhaseMemory

HOST_SAFETY = 0.75      # fraction of the node's available host memory the offloads may pin
PACKING_SLACK = 1.03    # pinned bytes per offloaded byte: the power-of-two packing's worst case (0.5B's AdamW state)

__all__ = ["HOST_SAFETY", "OFFLOAD_KEYS", "host_pinned", "host_available_bytes", "host_words"]


def _next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


# each part of `host_pinned` and the config key that puts it there
OFFLOAD_KEYS = {"actor params": "actor_rollout_ref.actor.fsdp_config.param_offload",
                "actor optimizer": "actor_rollout_ref.actor.fsdp_config.optimizer_offload",
                "actor layer inputs": "actor_rollout_ref.model.enable_activation_offload",
                "ref params": "actor_rollout_ref.ref.fsdp_config.param_offload",
                "critic params": "critic.model.fsdp_config.param_offload",
                "critic optimizer": "critic.model.fsdp_config.optimizer_offload",
                "critic layer inputs": "critic.model.enable_activation_offload",
                "reward model params": "reward_model.model.fsdp_config.param_offload"}


def host_pinned(memory: MemoryModel, actor_update_tokens: int = 0, critic_update_tokens: int = 0) -> PhaseMemory:
    """Pinned host bytes of one GPU rank at the run's worst moment (the update, where the twins and the layer inputs
    coexist): each offloaded model state (the hybrid engine's actor parameters and AdamW state, the reference's,
    critic's and reward model's; their sizes as the memory model counts them on the GPU), and with activation
    offload the checkpointed layer inputs of one update micro-batch of `*_update_tokens` tokens."""
    r, s = memory.r, memory.s
    whole = {**memory._actor(grads=False, params_on_gpu=True, optim_on_gpu=True),
             **memory._others(ref_on_gpu=True, critic_on_gpu=True, rm_on_gpu=True)}
    offloaded = {"actor params": r.hybrid and r.param_offload, "actor optimizer": r.hybrid and r.optimizer_offload,
                 "ref params": r.ref_offload, "critic params": r.critic_param_offload,
                 "critic optimizer": r.critic_optimizer_offload, "reward model params": r.rm_param_offload}
    parts = {part: whole.get(part, 0) for part, on in offloaded.items() if on}
    parts["packing"] = (PACKING_SLACK - 1) * sum(parts.values())

    def layer_inputs(shape, tokens: int, kept_layers: int) -> int:
        return (shape.layers - kept_layers) * _next_pow2(tokens * shape.hidden * 2) if tokens else 0

    if r.activation_offload and r.gradient_checkpointing:
        parts["actor layer inputs"] = layer_inputs(s, actor_update_tokens, r.kept_layers)
    if r.critic is not None and r.critic_activation_offload and r.critic_gradient_checkpointing:
        parts["critic layer inputs"] = layer_inputs(r.critic, critic_update_tokens, r.critic_kept_layers)
    return PhaseMemory("host", {k: v for k, v in parts.items() if v})


def host_available_bytes() -> int | None:
    """This machine's available memory (Linux MemAvailable: free plus reclaimable), None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def host_words(per_rank: PhaseMemory, ranks_per_node: int, host_bytes: int) -> str:
    """'A GiB pinned per GPU x N GPUs per node = B GiB, of C GiB (HOST_SAFETY of the node's D GiB available)'."""
    return (f"{per_rank.total / GiB:.1f} GiB pinned per GPU x {ranks_per_node} GPUs per node = "
            f"{per_rank.total * ranks_per_node / GiB:.1f} GiB, of {HOST_SAFETY * host_bytes / GiB:.1f} GiB "
            f"({HOST_SAFETY:.0%} of the node's {host_bytes / GiB:.1f} GiB of available host memory)")
