"""The actor's offloads the plan chooses itself ('auto', the defaults), settled before any pass is sized because
every phase's memory depends on them:

- activation offload (`model.enable_activation_offload`): each checkpointed layer's input waits in host memory
  between the update's forward and backward. It costs a host round trip of tokens x hidden x 2 bytes per layer, so
  it is on only where the update cannot hold even one sequence of the longest length without it (with gradient
  checkpointing, which it needs) and can with it;
- optimizer offload (`actor.fsdp_config.optimizer_offload`): the hybrid engine moves the AdamW state to host memory
  when the rollout starts and back at the update's first optimizer step (hybrid/engine.py; with one optimizer step
  per update the forward and backward run without it, which the memory model counts). It costs copying that state out
  and back each step, so it is on only where, on the GPU, it would leave the rollout's KV cache unable to hold all
  of the step's sequences at once (or the rollout unable to fit at all), on the CPU more of them fit, and the
  node's host memory holds the pinned copies of every rank's state (host_memory.py).

Both are off on a CPU (no device memory to plan against); explicit true / false keep their meaning. Each choice
is recorded in `sizing.choices` and its key in `sizing.weighed` (a refusal then does not tell the user to set it).
"""

from __future__ import annotations

from dataclasses import replace

from hybridrl.plan.host_memory import host_pinned, host_words
from hybridrl.plan.memory import GiB, MemoryModel
from hybridrl.plan.rollout_plan import ROLLOUT, kv_demand, kv_room, sequences_at_full_length
from hybridrl.plan.sizing import ACTOR_FSDP, MODEL, Sizing, is_auto

ACTIVATION_OFFLOAD = f"{MODEL}.enable_activation_offload"
OPTIMIZER_OFFLOAD = f"{ACTOR_FSDP}.optimizer_offload"


def resolve_activation_offload(sizing: Sizing) -> None:
    """`model.enable_activation_offload` 'auto': on where the actor's update, with every layer recomputing, is
    predicted over the device budget for one sequence of the longest length (prompt + response) and within it with
    the layer inputs on the host; then gradient checkpointing is on too. Off elsewhere, and where checkpointing is
    off (`enable_gradient_checkpointing: false`)."""
    choices, key = sizing.choices, ACTIVATION_OFFLOAD
    if not is_auto(sizing.get(key)):
        return
    if sizing.budget is None:
        choices.append(f"{key} = false (no device memory to plan against)")
        return
    if sizing.get(f"{MODEL}.enable_gradient_checkpointing") is False:
        choices.append(f"{key} = false ({MODEL}.enable_gradient_checkpointing = false: it offloads the inputs "
                       "checkpointing keeps)")
        return
    sizing.weighed.add(key)
    longest = sizing.seq_len
    # a resident engine (scheme A) holds at least one sequence's KV through the update; a hybrid one none
    kv = -(-longest // sizing.get(f"{ROLLOUT}.block_size")) * sizing.memory.kv_block_bytes(
        sizing.get(f"{ROLLOUT}.block_size"))

    def one_sequence(offload: bool):
        residency = replace(sizing.residency, gradient_checkpointing=True, kept_layers=0, activation_offload=offload)
        return MemoryModel(sizing.shape, residency).update_actor(1, longest, sizing.response_len, kv)

    kept, offloaded = one_sequence(False), one_sequence(True)
    if sizing.fits_budget(kept):
        choices.append(f"{key} = false (one sequence of {longest} tokens fits the update with checkpointing alone: "
                       f"predicted {kept.total / GiB:.1f} GiB, within {sizing.budget_words})")
    elif not sizing.fits_budget(offloaded):
        choices.append(f"{key} = false (one sequence of {longest} tokens is predicted at {offloaded.total / GiB:.1f} "
                       f"GiB in the update even with it, over {sizing.budget_words})")
    else:
        sizing.reside(activation_offload=True, gradient_checkpointing=True)
        choices.append(f"{key} = true (one sequence of {longest} tokens is predicted at {kept.total / GiB:.1f} GiB in "
                       f"the update with checkpointing alone, over {sizing.budget_words}; "
                       f"{offloaded.total / GiB:.1f} GiB with each layer's input in host memory between forward and "
                       "backward)")


def resolve_optimizer_offload(sizing: Sizing, val_prompts: int | None, judge: bool) -> None:
    """`actor.fsdp_config.optimizer_offload` 'auto': on with the hybrid engine and full fine-tuning on a GPU where,
    with the AdamW state on the GPU, the rollout's KV cache would hold fewer than all of the step's sequences per
    engine at once (none: the plan would refuse the rollout phase), with it in host memory during the rollout
    more, and the node's host memory can pin it for all its ranks. Off elsewhere: on a CPU, with a resident engine
    (scheme A: it never moves the state), with LoRA (the adapters' state is small)."""
    choices, key, residency = sizing.choices, OPTIMIZER_OFFLOAD, sizing.residency
    if not is_auto(sizing.get(key)):
        return
    why_not = ("no device memory to plan against" if sizing.budget is None else
               "a resident engine (actor_rollout_ref.hybrid_engine or rollout.free_cache_engine false) keeps it on "
               "the GPU" if not residency.hybrid else
               "LoRA: only the adapters have optimizer state" if residency.lora_params else None)
    if why_not is not None:
        choices.append(f"{key} = false ({why_not})")
        return
    sizing.weighed.add(key)
    blocks, _, _, seqs = kv_demand(sizing, val_prompts, judge)
    moved = replace(residency, optimizer_offload=True)
    kept_fit = sequences_at_full_length(sizing, kv_room(sizing, sizing.memory, residency, seqs), blocks, seqs)
    moved_room = kv_room(sizing, MemoryModel(sizing.shape, moved), moved, seqs)
    moved_fit = sequences_at_full_length(sizing, moved_room, blocks, seqs)
    state = sizing.memory.gen(0, sizing.get(f"{ROLLOUT}.block_size"), 1, 0).parts["actor optimizer"] / GiB
    on_gpu = ("the rollout phase would not fit even one sequence" if kept_fit == 0
              else f"the rollout's KV cache holds {kept_fit} of the step's {seqs} sequences at full length")
    if kept_fit >= seqs:
        choices.append(f"{key} = false (the rollout's KV cache holds all {seqs} of the step's sequences at full "
                       f"length beside its {state:.1f} GiB)")
    elif moved_fit <= kept_fit:
        choices.append(f"{key} = false (with its {state:.1f} GiB on the GPU {on_gpu}; moving it would not raise that)")
    elif not sizing.host_fits(pinned := host_pinned(MemoryModel(sizing.shape, moved))):
        sizing.host_declined = (f"in host memory it would need "
                                f"{host_words(pinned, sizing.layout.parallel.gpus_per_node, sizing.device.host_bytes)}")
        choices.append(f"{key} = false (with its {state:.1f} GiB on the GPU {on_gpu}; {sizing.host_declined})")
    else:
        sizing.reside(optimizer_offload=True)
        choices.append(f"{key} = true (with its {state:.1f} GiB on the GPU {on_gpu}; with it in host memory from the "
                       f"rollout until the update's optimizer step, {'all ' if moved_fit >= seqs else ''}{moved_fit}, at the cost of "
                       f"copying {state:.1f} GiB out and back each step)")
