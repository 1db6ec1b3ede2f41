"""The run plan: every fact of a run derived once on the driver — meshes and per-GPU batch sizes (the layout),
then one sub-plan per role, each from its planner: the rollout's KV cache, engine concurrency and scheduling
(rollout_plan.py), the actor's and reference's micro-batches, token budgets and recompute (actor_plan.py), the
critic's (critic_plan.py) and the reward model's (reward_model_plan.py) — with the predicted peak memory of every
phase and how each automatic value was chosen (sizing.py: the rules they share). Workers receive it frozen and
read these facts instead of re-deriving them from the config; the rollout engine gets them as one `EngineConfig`
(`RunPlan.rollout.engine_config`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

from hybridrl.config.errors import ConfigError
from hybridrl.config.sections import PPOConfig
from hybridrl.config.sections.reward_model import RewardModelConfig
from hybridrl.dotted import dotted_get
from hybridrl.models.decoder import window_error
from hybridrl.models.moe import padded_rank
from hybridrl.plan.actor_plan import (
    ACTOR,
    REF,
    ActorPlan,
    plan_actor,
    plan_actor_recompute,
    resolve_liger,
    resolve_prefix_grouper,
)
from hybridrl.plan.critic_plan import CriticPlan, plan_critic, plan_critic_recompute
from hybridrl.plan.early_update import plan_early_update, update_fits_beside_rollout
from hybridrl.plan.host_memory import OFFLOAD_KEYS, host_available_bytes, host_pinned, host_words
from hybridrl.plan.layout import Layout, derive_layout
from hybridrl.plan.memory import GiB, MemoryModel, PhaseMemory, Residency
from hybridrl.plan.model_shape import ModelShape
from hybridrl.plan.offload import resolve_activation_offload, resolve_optimizer_offload
from hybridrl.plan.reward_model_plan import RewardModelPlan, plan_reward_model
from hybridrl.plan.rollout_plan import ROLLOUT, RolloutPlan, plan_kv_cache, plan_rollout
from hybridrl.plan.shape import Parallelism
from hybridrl.plan.sizing import MODEL, DeviceSpec, Sizing
from hybridrl.training.fsdp import resolve_dtype
from hybridrl.training.lora import EXPERT_TARGETS, adapter_param_count, lora_target_names


@dataclass(frozen=True)
class RunPlan:
    layout: Layout                      # the run's shape (layout.parallel) and the batch sizes it implies
    device: DeviceSpec
    model: ModelShape
    frozen_dtype: str                   # models that never train (reference, reward model): the compute dtype, no
                                        # fp32 master copy (fp32 on CPU)
    fused_optimizer: bool               # AdamW's fused in-place kernel (GPUs); false: multi-tensor (CPU)
    rollout: RolloutPlan
    actor: ActorPlan
    critic: CriticPlan | None = None            # None without a critic (no GAE)
    reward_model: RewardModelPlan | None = None  # None unless reward_model.enable with style=model
    predicted: dict = field(default_factory=dict)   # phase -> PhaseMemory
    choices: tuple = ()                 # how each automatic value was chosen
    host_pinned: PhaseMemory | None = None   # per GPU rank: the host memory its offloads pin (host_memory.py)

    @property
    def parallel(self) -> Parallelism:
        """The world size and every role's degrees: what the workers build their meshes from."""
        return self.layout.parallel

    def predicted_peak_gb(self) -> dict[str, float]:
        return {f"plan/predicted_peak_gb/{k}": v.total / GiB for k, v in self.predicted.items()}

    def __str__(self) -> str:
        lines = [str(self.layout), f"device          {self.device}",
                 f"model           {self.model.num_params / 1e9:.3f}B params, {self.model.layers} layers, "
                 f"vocab {self.model.vocab}",
                 *([self.critic.describe()] if self.critic is not None else []),
                 f"dtypes          rollout engine {self.rollout.dtype}, reference and reward model {self.frozen_dtype}"
                 + (f", LoRA base {self.actor.lora_base_dtype}" if self.actor.lora_base_dtype else ""),
                 *([self.reward_model.describe()] if self.reward_model is not None else []),
                 self.actor.describe(),
                 *([f"ulysses         token budgets are per GPU: a group of {self.layout.ulysses_sp} packs "
                    f"{self.layout.ulysses_sp} x the budget into a micro-batch, 1/{self.layout.ulysses_sp} of it on "
                    "each GPU (verl's meaning)"]
                   if self.layout.ulysses_sp > 1 and self.actor.update.rows is None else []),
                 *self.rollout.describe(),
                 *(f"  auto: {c}" for c in self.choices)]
        if self.predicted:
            lines.append("predicted peak per GPU (GiB), by phase:")
            for name, pm in self.predicted.items():
                lines.append(f"  {name:<14}{pm.total / GiB:7.2f}  = {pm.describe()}")
        if self.host_pinned is not None and self.host_pinned.total:
            lines.append(f"  {'host (pinned)':<14}{self.host_pinned.total / GiB:7.2f}  = {self.host_pinned.describe()}"
                         + ("" if self.device.host_bytes else "  (host memory not checked: unknown)"))
        return "\n".join(lines)


def local_device(config: PPOConfig) -> DeviceSpec:
    """The GPU this process sees (or the CPU): what `config check` and a single-machine run plan against."""
    import torch

    device = config.trainer.device
    if device != "cpu" and torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        return DeviceSpec("cuda", p.name, int(p.total_memory), host_available_bytes())
    if device == "cuda":
        raise ConfigError(["'trainer.device' = cuda but this process sees no CUDA device (to plan for GPUs from a "
                           "machine without one: hybridrl config check --gpu-memory-gb N)"])
    return DeviceSpec("cpu", "cpu", None)


def visible_gpus() -> list[DeviceSpec]:
    """Each CUDA device this process sees (none without CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return []
    return [DeviceSpec("cuda", p.name, int(p.total_memory), host_available_bytes())
            for p in map(torch.cuda.get_device_properties, range(torch.cuda.device_count()))]


def make_plan(config: PPOConfig, hf_config, device: DeviceSpec, val_prompts: int | None = None,
              rm_hf_config=None) -> RunPlan:
    """The plan of a PPO/GRPO config on `device`; raises ConfigError when a phase cannot fit. `rm_hf_config`: the
    reward model's HF config, needed with reward_model.enable and style=model. The planners run in the order their
    memory depends on: the KV cache first (a resident engine's training passes plan next to it), then each role's
    passes, then recompute against the run's peak, then the rollout engine's scheduling. The actor's 'auto' offloads
    come before all of them (offload.py)."""
    choices: list[str] = []
    device = _memory_cap(device, config.trainer.gpu_memory_gb, choices)
    layout = derive_layout(config, device.type)

    def get(key: str):
        return dotted_get(config, key)

    shape = ModelShape.from_hf_config(hf_config)
    _check_router_keys(get, shape, hf_config)
    _check_expert_lora(get, shape, hf_config)
    _check_attention_window(get, hf_config)
    rm_shape = _reward_model_shape(config.reward_model, rm_hf_config)
    master_dtype = _dtype_name(get(f"{ACTOR}.fsdp_config.model_dtype"))
    lora_rank = get(f"{MODEL}.lora_rank")
    frozen_dtype, lora_base_dtype, fused_optimizer = training_dtypes(master_dtype, bool(lora_rank), device.type)
    use_liger = resolve_liger(get(f"{MODEL}.use_liger"), device.type, getattr(hf_config, "model_type", None), choices)
    share_prompts = resolve_prefix_grouper(get(f"{ACTOR}.use_prefix_grouper"), device.type, layout.n,
                                           layout.ulysses_sp, choices)
    residency = _residency(get, layout, device, shape, rm_shape, master_dtype, lora_base_dtype, fused_optimizer,
                           use_liger)
    sizing = Sizing(get=get, layout=layout, device=device, shape=shape, residency=residency,
                    memory=MemoryModel(shape, residency), prompt_len=get("data.max_prompt_length"),
                    response_len=get("data.max_response_length"), choices=choices, predicted={})

    judge = bool(get("reward_model.enable")) and get("reward_model.style") == "judge"
    # 'auto' offloads, first: every phase's memory counts them. The optimizer's before the activations': with the
    # state on the host until the optimizer step the update's forward and backward have its room
    resolve_optimizer_offload(sizing, val_prompts, judge)
    resolve_activation_offload(sizing)
    kv_cache = plan_kv_cache(sizing, val_prompts, judge)
    actor = plan_actor(sizing, kv_cache, share_prompts, lora_base_dtype)
    has_critic = layout.critic_mini_batch_per_gpu is not None
    critic = plan_critic(sizing, kv_cache, actor) if has_critic else None
    reward_model = plan_reward_model(sizing, kv_cache, rm_shape) if rm_shape is not None else None
    actor = plan_actor_recompute(sizing, kv_cache, actor, *(update_fits_beside_rollout(sizing, actor) or ()))
    critic = plan_critic_recompute(sizing, kv_cache, critic) if critic is not None else None
    rollout = plan_rollout(sizing, kv_cache, "fp32" if device.type == "cpu" else _dtype_name(get(f"{ROLLOUT}.dtype")))
    actor = plan_early_update(sizing, actor)

    host = _check_host_memory(sizing, actor, critic)

    update_rows = actor.update.rows
    layout = replace(layout, ppo_micro_batch_per_gpu=update_rows, log_prob_micro_batch_per_gpu=actor.old_log_prob.rows,
                     ref_log_prob_micro_batch_per_gpu=actor.ref_log_prob.rows,
                     grad_accum_steps=None if update_rows is None else layout.ppo_mini_batch_per_gpu // update_rows)
    return RunPlan(layout=layout, device=device, model=shape, frozen_dtype=frozen_dtype,
                   fused_optimizer=fused_optimizer, rollout=rollout, actor=actor, critic=critic,
                   reward_model=reward_model, predicted=sizing.predicted, choices=tuple(choices), host_pinned=host)


def _memory_cap(device: DeviceSpec, cap_gb: float | None, choices: list[str]) -> DeviceSpec:
    """The device the plan sizes for under 'trainer.gpu_memory_gb': a GPU of that many GiB (its name, and so its
    peaks, kept)."""
    if cap_gb is None:
        return device
    key = "trainer.gpu_memory_gb"
    if device.total_bytes is None:
        choices.append(f"{key} = {cap_gb:g} has nothing to cap: the run has no GPU")
        return device
    cap = int(cap_gb * GiB)
    if cap > device.total_bytes:
        raise ConfigError([f"'{key}' = {cap_gb:g} exceeds the GPU's {device.total_bytes / GiB:.1f} GiB "
                           f"({device.name}): set at most that, or null to plan for the whole GPU"])
    choices.append(f"planned for {cap_gb:g} of the GPU's {device.total_bytes / GiB:.1f} GiB ({key}): the rest is "
                   "left to other processes")
    return replace(device, total_bytes=cap)


def _update_tokens(batching, seq_len: int) -> int:
    return batching.max_tokens or (batching.rows or 0) * seq_len


def _check_host_memory(sizing: Sizing, actor: ActorPlan, critic: CriticPlan | None) -> PhaseMemory:
    """One rank's pinned host memory (host_memory.py); refused, naming the offload keys that are on, where the node's
    ranks together would pin more than HOST_SAFETY of its available host memory."""
    actor_tokens = _update_tokens(actor.update, sizing.seq_len)
    critic_tokens = _update_tokens(critic.update, sizing.seq_len) if critic is not None else 0
    pinned = host_pinned(sizing.memory, actor_tokens, critic_tokens)
    if sizing.host_fits(pinned):
        return pinned
    on = [key for part, key in OFFLOAD_KEYS.items() if part in pinned.parts]
    raise ConfigError([
        "the offloads would pin more host memory than the node has: "
        f"{host_words(pinned, sizing.layout.parallel.gpus_per_node, sizing.device.host_bytes)} (per GPU, GiB: "
        f"{pinned.describe()}). Pinned memory cannot be swapped, and it is allocated at each state's first offload, "
        f"for the optimizer state a whole step into the run; set one of {', '.join(f'{k}=false' for k in on)}, or "
        "run with more host memory or more GPUs to shard the state over"])


def _check_router_keys(get, shape: ModelShape, hf_config) -> None:
    """Router replay and router losses are refused for a model without mixture-of-experts layers."""
    router_keys = [k for k in ("router_replay.mode", "router_aux_loss_coef", "router_z_loss_coef")
                   if get(f"{ACTOR}.{k}") not in ("disabled", 0, 0.0)]
    if router_keys and not shape.moe_layers:
        raise ConfigError([f"'{ACTOR}.{k}' = {get(f'{ACTOR}.{k}')!r} applies to mixture-of-experts models only; "
                           f"model_type {getattr(hf_config, 'model_type', None)!r} has no MoE layers"
                           for k in router_keys])


def _check_attention_window(get, hf_config) -> None:
    """A model's sliding window narrower than the run's sequences is refused where hybridrl's own attention runs it
    (the native engine, the packed training path): both attend fully."""
    native = get(f"{ROLLOUT}.name") in ("native", "vllm")
    packed = get(f"{MODEL}.use_remove_padding") is not False or get(f"{ACTOR}.use_prefix_grouper") is not False
    error = window_error(hf_config, get("data.max_prompt_length") + get("data.max_response_length"))
    if error and (native or packed):
        where = [f"'{ROLLOUT}.name' = {get(f'{ROLLOUT}.name')!r}"] * native + ["the packed training path"] * packed
        raise ConfigError([f"{error} (with {' and '.join(where)}; HF's own attention, rollout.name=hf with "
                           "use_remove_padding=false, applies the window)"])


def _check_expert_lora(get, shape: ModelShape, hf_config) -> None:
    """Expert adapters (`target_parameters`) are refused for a model without mixture-of-experts layers."""
    experts = get(f"{MODEL}.target_parameters")
    if experts and get(f"{MODEL}.lora_rank") and not shape.moe_layers:
        raise ConfigError([f"'{MODEL}.target_parameters' = {list(experts)!r} adapts mixture-of-experts experts; "
                           f"model_type {getattr(hf_config, 'model_type', None)!r} has no MoE layers (set it to "
                           "null and name its linears in target_modules)"])


def _lora_targets(get) -> tuple[str, ...]:
    """The linears and expert tensors that carry adapters (empty without LoRA)."""
    if not get(f"{MODEL}.lora_rank"):
        return ()
    return (*lora_target_names(get(f"{MODEL}.target_modules")), *(get(f"{MODEL}.target_parameters") or ()))


def _residency(get, layout: Layout, device: DeviceSpec, shape: ModelShape, rm_shape: ModelShape | None,
               master_dtype: str, lora_base_dtype: str | None, fused_optimizer: bool, use_liger: bool) -> Residency:
    """What each GPU holds in each phase, for the memory model."""
    par = layout.parallel
    has_critic = layout.critic_mini_batch_per_gpu is not None
    hybrid = bool(get("actor_rollout_ref.hybrid_engine") and get(f"{ROLLOUT}.free_cache_engine"))
    return Residency(
        shard=par.actor_fsdp,
        master_bytes=_dtype_bytes(master_dtype),
        param_offload=get(f"{ACTOR}.fsdp_config.param_offload"),
        optimizer_offload=get(f"{ACTOR}.fsdp_config.optimizer_offload") is True,   # 'auto': offload.py settles it
        has_ref=bool(get(f"{ACTOR}.use_kl_loss") or get("algorithm.use_kl_in_reward")),
        ref_offload=get(f"{REF}.fsdp_config.param_offload"),
        critic=shape if has_critic else None, critic_shard=par.critic_fsdp if has_critic else par.world_size,
        critic_param_offload=get("critic.model.fsdp_config.param_offload"),
        critic_optimizer_offload=get("critic.model.fsdp_config.optimizer_offload"),
        hybrid=hybrid, rollout_tp=par.rollout_tp,
        optimizer_steps=layout.num_mini_batches * get(f"{ACTOR}.ppo_epochs"),
        critic_optimizer_steps=layout.critic_num_mini_batches * get("critic.ppo_epochs") if has_critic else 1,
        sort_sampling=any(get(f"{section}.top_k") > 0 or get(f"{section}.top_p") < 1
                          for section in (ROLLOUT, f"{ROLLOUT}.val_kwargs")),
        # 'auto' is planned with checkpointing first; plan_actor_recompute / plan_critic_recompute may turn it off
        gradient_checkpointing=get(f"{MODEL}.enable_gradient_checkpointing") is not False,
        critic_gradient_checkpointing=get("critic.model.enable_gradient_checkpointing") is not False,
        activation_offload=get(f"{MODEL}.enable_activation_offload") is True,   # 'auto': likewise
        critic_activation_offload=bool(get("critic.model.enable_activation_offload")),
        lora_params=adapter_param_count(shape, get(f"{MODEL}.lora_rank"), get(f"{MODEL}.target_modules"),
                                        get(f"{MODEL}.target_parameters")),
        lora_base_bytes=_dtype_bytes(lora_base_dtype) if lora_base_dtype else 0,
        critic_lora_params=(adapter_param_count(shape, get("critic.model.lora_rank"), get("critic.model.target_modules"))
                            + shape.hidden) if has_critic and get("critic.model.lora_rank") else 0,
        lora_expert_bytes=2 * shape.expert_tensor_params(get(f"{MODEL}.target_parameters") or ())
        if get(f"{MODEL}.lora_rank") else 0,
        fused_optimizer=fused_optimizer, liger=use_liger,
        reward_model=rm_shape, rm_shard=par.reward_fsdp,
        rm_param_offload=bool(get("reward_model.model.fsdp_config.param_offload")),
        rm_param_bytes=2 if device.type == "cuda" else 4,
        router_aux_loss=get(f"{ACTOR}.router_aux_loss_coef") > 0, router_z_loss=get(f"{ACTOR}.router_z_loss_coef") > 0,
        routing_record=get(f"{ACTOR}.router_replay.mode") == "R3",
        engine_borrowed_params=(borrowed := _engine_borrowed_params(get, par, shape, hybrid, device,
                                                                    lora_base_dtype or master_dtype)),
        engine_adapter_params=_engine_adapter_params(get, shape, device) if borrowed else 0)


def _engine_borrowed_params(get, par, shape: ModelShape, hybrid: bool, device: DeviceSpec, stored_dtype: str) -> int:
    """Parameters the native hybrid engine uses in place from the actor instead of copying them (hybrid/reshard.py):
    those the actor holds whole (no FSDP sharding), in the engine's dtype (a LoRA run's frozen base, or bf16 masters) and
    on the GPU (no param_offload) that the engine holds whole in HF's layout (TP = 1), except LoRA-merged linears.
    Expert tensors with adapters are borrowed too: the engine adds their low-rank update unmerged
    (`_engine_adapter_params`)."""
    engine_dtype = "fp32" if device.type == "cpu" else _dtype_name(get(f"{ROLLOUT}.dtype"))
    if not (hybrid and get(f"{ROLLOUT}.name") == "native" and par.actor_fsdp == 1 and par.rollout_tp == 1
            and stored_dtype == engine_dtype and not get(f"{ACTOR}.fsdp_config.param_offload")):
        return 0
    return shape.engine_whole_params(tuple(t for t in _lora_targets(get) if t not in EXPERT_TARGETS))


def _engine_adapter_params(get, shape: ModelShape, device: DeviceSpec) -> int:
    """The per-expert LoRA factors a borrowing engine holds to add the update unmerged (models/moe.py): E·r'·(in + out)
    per adapted tensor of each MoE layer, r' the rank padded to rows of 16 bytes in the engine's dtype."""
    experts = get(f"{MODEL}.target_parameters") or ()
    rank = get(f"{MODEL}.lora_rank")
    if not (rank and experts):
        return 0
    itemsize = _dtype_bytes("fp32" if device.type == "cpu" else _dtype_name(get(f"{ROLLOUT}.dtype")))
    return adapter_param_count(shape, padded_rank(rank, itemsize), (), experts)


def reward_model_hf_config(config: PPOConfig):
    """The reward model's HF config when it runs as a worker (reward_model.enable, style=model), else None."""
    rm = config.reward_model
    if not (rm.enable and rm.style == "model"):
        return None
    from hybridrl.training.fsdp import load_hf_config

    return load_hf_config(os.path.expanduser(rm.model.path), role="reward_model",
                          override_config=rm.model.override_config, trust_remote_code=rm.model.trust_remote_code)


def training_dtypes(master_dtype: str, lora: bool, device_type: str) -> tuple[str, str | None, bool]:
    """(frozen_dtype, lora_base_dtype, fused_optimizer) of a plan: models that never train in the compute dtype
    (fp32 on CPU, where runs are for correctness and bf16 matmuls are slow; bf16 on GPUs); a LoRA base likewise
    but never wider than the masters (model_dtype=bf16 on CPU stays bf16), None without LoRA; AdamW's fused
    in-place kernel on GPUs."""
    frozen = "fp32" if device_type == "cpu" else "bf16"
    base = min(frozen, _dtype_name(master_dtype), key=_dtype_bytes) if lora else None
    return frozen, base, device_type != "cpu"


def _reward_model_shape(rm: RewardModelConfig, rm_hf_config) -> ModelShape | None:
    """The reward model's shape (style=model), or None. A ...ForSequenceClassification has no LM head: its
    parameters are counted as a tied model's (the one-output score head is negligible)."""
    if not rm.enable or rm.style != "model":
        return None
    if rm_hf_config is None:
        raise ValueError("make_plan: reward_model.enable=true with style=model needs the reward model's HF config "
                         "(rm_hf_config)")
    return replace(ModelShape.from_hf_config(rm_hf_config), tied=True)


def _dtype_name(name: str) -> str:
    """The short name (fp32 | bf16 | fp16) of a config dtype spelling; the aliases are fsdp.resolve_dtype's."""
    return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}[str(resolve_dtype(name)).removeprefix("torch.")]


def _dtype_bytes(name: str) -> int:
    return resolve_dtype(name).itemsize
