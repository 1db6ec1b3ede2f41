"""The run plan: every fact of a run derived once on the driver — meshes and per-GPU batch sizes (the layout),
micro-batch sizes of each pass (`auto` resolved by the memory model), the KV cache each engine needs for this
step's batch, engine concurrency, unshard choices, reshard strategy — with the predicted peak memory of every
phase. Workers receive it frozen and read these facts instead of re-deriving them from the config; the rollout
engine gets them as one `EngineConfig` (`RunPlan.engine_config`).

Automatic sizes: the largest micro-batch (a divisor of the per-GPU mini-batch for updates) whose tokens stay
within a throughput target (beyond it a GPU gains nothing and only memory grows) and whose predicted phase peak
fits `SAFETY` of the GPU. An explicit size keeps verl's meaning, and a plan whose predicted peak does not fit
is refused, naming the key and a value that fits.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace

from omegaconf import DictConfig, OmegaConf

from hybridrl.config.validate import ConfigError
from hybridrl.dotted import dotted_get
from hybridrl.plan.layout import Layout, derive_layout
from hybridrl.plan.memory import GiB, MemoryModel, PhaseMemory, Residency
from hybridrl.plan.model_shape import ModelShape
from hybridrl.plan.partial_rollout import PartialRolloutPlan, plan_partial_rollout
from hybridrl.plan.shape import Parallelism
from hybridrl.rollout.config import EngineConfig, SpeculativeConfig
from hybridrl.training.fsdp import AUTO_UNSHARD_MAX_FRACTION, resolve_dtype
from hybridrl.training.lora import adapter_param_count

SAFETY = 0.9                    # fraction of a GPU's memory a phase may be planned to use
UPDATE_TOKENS_TARGET = 16384    # tokens per training micro-batch where an H200's GEMMs saturate
LOGPROB_TOKENS_TARGET = 32768   # tokens per no-grad log-prob micro-batch
MODEL = "actor_rollout_ref.model"
SPEC_ROWS_FALLBACK = 64         # verify rows per step where the device's peaks are unknown (CPU, other GPUs)


@dataclass(frozen=True)
class DeviceSpec:
    type: str                   # "cuda" | "cpu"
    name: str
    total_bytes: int | None     # per GPU; None on CPU (no device memory to plan against)

    def __str__(self) -> str:
        if self.total_bytes is None:
            return f"{self.type} (no device memory model)"
        return f"{self.name}, {self.total_bytes / GiB:.1f} GiB per GPU"


@dataclass(frozen=True)
class RunPlan:
    layout: Layout                      # the run's shape (layout.parallel) and the batch sizes it implies
    device: DeviceSpec
    model: ModelShape
    rollout_dtype: str                  # bf16 | fp16 | fp32: engine weights and KV (fp32 on CPU)
    frozen_dtype: str                   # models that never train (reference, reward model): the compute dtype, no
                                        # fp32 master copy (fp32 on CPU)
    actor_micro: int | None             # rows per forward/backward per GPU; None = dynamic (token budget)
    log_prob_micro: int | None
    ref_log_prob_micro: int | None
    critic_micro: int | None
    critic_forward_micro: int | None
    log_prob_unshard_once: bool
    ref_log_prob_unshard_once: bool
    critic_forward_unshard_once: bool
    kv_blocks: int                      # per engine (one TP rank): the largest call's need; capped at wake on GPUs
    kv_blocks_unshared: int             # the same batch without prompt sharing
    engine_max_num_seqs: int
    reshard_strategy: str
    old_log_prob_pass: bool             # false: the update's own detached log-probs are the old ones (on-policy)
    hybrid: bool                        # scheme B (engine sleeps between rollouts) or A (resident engine)
    kv_rule: tuple = ()                 # (prompt_len, response_len, block_size, prefix_sharing) for kv_blocks_for
    predicted: dict = field(default_factory=dict)   # phase -> PhaseMemory
    choices: tuple = ()                 # how each automatic value was chosen
    reward_model_micro: int | None = None       # sequences per reward-model forward per GPU (style=model)
    reward_model_unshard_once: bool = False
    reward_model_max_length: int = 0            # reward-model input tokens at most (reward_model.max_length or P + R)
    lora_base_dtype: str | None = None          # LoRA: the actor's frozen base weights, frozen_dtype unless
                                                # model_dtype is narrower (adapters stay in model_dtype); None: no LoRA
    fused_optimizer: bool = False               # AdamW's fused in-place kernel (GPUs); false: multi-tensor (CPU)
    gradient_checkpointing: bool = True         # the actor's update recomputes each layer in backward
    critic_gradient_checkpointing: bool = True
    use_liger: bool = False                     # Liger's fused kernels in the actor's / reference's training graph
    recompute_kept_layers: int = 0              # with the actor's checkpointing: its last decoder layers that keep
                                                # their activations (not recomputed); 0 = all recompute
    share_prompts: bool = False                 # actor.use_prefix_grouper: the actor's and reference's forwards run
                                                # each prompt of a micro-batch once (training/packing.py)
    critic_share_prompts: bool = False          # the critic's likewise (the actor's choice, without critic Ulysses)
    critic_recompute_kept_layers: int = 0       # the same for the critic's
    # token budgets of token-budgeted micro-batches (use_dynamic_bsz; the pass's micro-batch size is then None),
    # per GPU; None where the pass runs fixed rows
    actor_max_tokens: int | None = None
    log_prob_max_tokens: int | None = None
    ref_log_prob_max_tokens: int | None = None
    critic_max_tokens: int | None = None
    critic_forward_max_tokens: int | None = None
    remove_padding: bool = False                # the actor's and reference's forwards packed (varlen attention)
    critic_remove_padding: bool = False
    engine_max_num_batched_tokens: int = 8192   # the engine's prefill budget: at least max_model_len
    engine_async_scheduling: bool = False       # rollout.async_scheduling resolved (auto: on on GPUs)
    engine_speculative: SpeculativeConfig = SpeculativeConfig()  # rollout.speculative, max_running_seqs resolved
    partial_rollout: PartialRolloutPlan | None = None   # rollout.partial_rollout resolved; None: off
    record_routed_experts: bool = False         # actor.router_replay.mode=R3: the engine records each token's experts

    @property
    def parallel(self) -> Parallelism:
        """The world size and every role's degrees: what the workers build their meshes from."""
        return self.layout.parallel

    def kv_blocks_for(self, prompts: int, n: int, continuations: int = 0) -> int:
        """KV blocks one generate call of `prompts` x n (and `continuations` single samples: partial rollouts) needs
        on this engine (a hybrid engine allocates its KV per call, so a validation batch larger than the training one
        does not inflate every training step)."""
        prompt_len, response_len, block_size, sharing = self.kv_rule
        need = sum(kv_need(p, k, prompt_len, response_len, block_size, sharing, self.engine_max_num_seqs)[0]
                   for p, k in ((prompts, n), (continuations, 1)))
        return max(1, min(need, self.kv_blocks))

    def engine_config(self, rollout: DictConfig, eos_token_ids: tuple[int, ...] | None = None) -> EngineConfig:
        """The native rollout engine's config: its sizes, dtype and scheduling from this plan, the rest from the
        `actor_rollout_ref.rollout` section; `eos_token_ids` None leaves them to the model's config."""
        return EngineConfig(
            block_size=int(rollout.block_size), max_num_seqs=self.engine_max_num_seqs,
            max_num_batched_tokens=self.engine_max_num_batched_tokens,
            max_model_len=int(rollout.prompt_length) + int(rollout.response_length),
            gpu_memory_utilization=float(rollout.gpu_memory_utilization), num_kv_blocks=self.kv_blocks,
            enforce_eager=bool(rollout.enforce_eager), enable_prefix_sharing=bool(rollout.enable_prefix_sharing),
            async_scheduling=self.engine_async_scheduling, eos_token_ids=eos_token_ids,
            record_routed_experts=self.record_routed_experts,
            dtype=resolve_dtype(self.rollout_dtype, "plan.rollout_dtype"), speculative=self.engine_speculative)

    def predicted_peak_gb(self) -> dict[str, float]:
        return {f"plan/predicted_peak_gb/{k}": v.total / GiB for k, v in self.predicted.items()}

    def __str__(self) -> str:
        lines = [str(self.layout), f"device          {self.device}",
                 f"model           {self.model.num_params / 1e9:.3f}B params, {self.model.layers} layers, "
                 f"vocab {self.model.vocab}",
                 *([f"critic          micro-batch per GPU: update {_fmt(self.critic_micro, self.critic_max_tokens)}, "
                    f"values {_fmt(self.critic_forward_micro, self.critic_forward_max_tokens)}"] if self.layout.critic_mini_batch_per_gpu is not None else []),
                 f"dtypes          rollout engine {self.rollout_dtype}, reference and reward model {self.frozen_dtype}"
                 + (f", LoRA base {self.lora_base_dtype}" if self.lora_base_dtype else ""),
                 *([f"reward model    micro-batch per GPU {self.reward_model_micro}, inputs up to "
                    f"{self.reward_model_max_length} tokens"] if self.reward_model_micro is not None else []),
                 f"micro-batches   per GPU: update {_fmt(self.actor_micro, self.actor_max_tokens)}, old log-prob "
                 f"{_fmt(self.log_prob_micro, self.log_prob_max_tokens) if self.old_log_prob_pass else 'none (on-policy)'}"
                 f", reference {_fmt(self.ref_log_prob_micro, self.ref_log_prob_max_tokens)}"
                 f"{', packed' if self.remove_padding or self.share_prompts else ', padded'}",
                 f"kv cache        {self.kv_blocks} blocks per engine ({self.kv_blocks_unshared} without prompt "
                 f"sharing), {self.engine_max_num_seqs} sequences at most",
                 f"rollout engine  prefill budget {self.engine_max_num_batched_tokens} tokens per step, decode steps "
                 + ("launched ahead (async scheduling)" if self.engine_async_scheduling else "one at a time")
                 + "; per step it logs the tail's share of its time and its bandwidth floor",
                 f"speculative     {_describe_speculative(self.engine_speculative)}",
                 *([str(self.partial_rollout)] if self.partial_rollout is not None else []),
                 *(f"  auto: {c}" for c in self.choices)]
        if self.predicted:
            lines.append("predicted peak per GPU (GiB), by phase:")
            for name, pm in self.predicted.items():
                lines.append(f"  {name:<14}{pm.total / GiB:7.2f}  = {pm.describe()}")
        return "\n".join(lines)


def _fmt(rows, tokens=None) -> str:
    if rows is not None:
        return f"{rows} rows"
    return f"<= {tokens} tokens" if tokens is not None else "-"


def local_device(config: DictConfig | dict) -> DeviceSpec:
    """The GPU this process sees (or the CPU): what `config check` and a single-machine run plan against."""
    import torch

    device = dotted_get(config, "trainer.device")
    if device != "cpu" and torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        return DeviceSpec("cuda", p.name, int(p.total_memory))
    if device == "cuda":
        raise ValueError("trainer.device=cuda but this process sees no CUDA device")
    return DeviceSpec("cpu", "cpu", None)


def visible_gpus() -> list[DeviceSpec]:
    """Each CUDA device this process sees (none without CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return []
    return [DeviceSpec("cuda", p.name, int(p.total_memory))
            for p in map(torch.cuda.get_device_properties, range(torch.cuda.device_count()))]


def _auto(value) -> bool:
    return isinstance(value, str) and value == "auto"


def _divisors_desc(n: int) -> list[int]:
    return sorted({d for i in range(1, int(math.isqrt(n)) + 1) if n % i == 0 for d in (i, n // i)}, reverse=True)


def kv_need(prompts: int, n: int, prompt_len: int, response_len: int, block_size: int, sharing: bool,
            max_num_seqs: int) -> tuple[int, int]:
    """KV blocks one engine needs for `prompts` × n samples at the longest lengths, with and without prompt
    sharing (the full blocks of a prompt are shared by its n samples; the partial one is copied on write).
    At most max_num_seqs sequences run at once, which bounds the need of larger batches."""
    per_seq = -(-(prompt_len + response_len) // block_size)
    unshared = prompts * n * per_seq
    shared_blocks = prompt_len // block_size if (sharing and n > 1) else 0
    shared = prompts * shared_blocks + prompts * n * (per_seq - shared_blocks)
    cap = max_num_seqs * per_seq
    return min(shared, cap), min(unshared, cap)


def make_plan(config: DictConfig | dict, hf_config, device: DeviceSpec, val_prompts: int | None = None,
              rm_hf_config=None) -> RunPlan:
    """The plan of a PPO/GRPO config on `device`; raises ConfigError when a phase cannot fit. `rm_hf_config`: the
    reward model's HF config, needed with reward_model.enable and style=model."""
    layout = derive_layout(config, device.type)
    c = OmegaConf.to_container(config, resolve=True) if isinstance(config, DictConfig) else config
    g = lambda p: dotted_get(c, p)  # noqa: E731
    shape = ModelShape.from_hf_config(hf_config)
    a, rl, ref = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.ref"
    router_keys = [k for k in ("router_replay.mode", "router_aux_loss_coef", "router_z_loss_coef")
                   if g(f"{a}.{k}") not in ("disabled", 0, 0.0)]
    if router_keys and not shape.moe_layers:
        raise ConfigError([f"'{a}.{k}' = {g(f'{a}.{k}')!r} applies to mixture-of-experts models only; model_type "
                           f"{getattr(hf_config, 'model_type', None)!r} has no MoE layers" for k in router_keys])
    gae = layout.critic_mini_batch_per_gpu is not None
    par = layout.parallel
    world = par.world_size
    rm_shape = _reward_model_shape(c, rm_hf_config)
    judge = bool(g("reward_model.enable")) and g("reward_model.style") == "judge"
    cpu = device.type == "cpu"
    master_dtype = _dtype_name(g(f"{a}.fsdp_config.model_dtype"))
    lora_rank = g(f"{MODEL}.lora_rank")
    frozen_dtype, lora_base_dtype, fused_optimizer = training_dtypes(master_dtype, bool(lora_rank), device.type)
    choices: list[str] = []
    use_liger = resolve_liger(g(f"{MODEL}.use_liger"), device.type, getattr(hf_config, "model_type", None), choices)
    share = resolve_prefix_grouper(g(f"{a}.use_prefix_grouper"), device.type, layout.n, layout.ulysses_sp, choices)
    res = Residency(
        shard=par.actor_fsdp,
        master_bytes=_dtype_bytes(master_dtype),
        param_offload=g(f"{a}.fsdp_config.param_offload"), optimizer_offload=g(f"{a}.fsdp_config.optimizer_offload"),
        has_ref=bool(g(f"{a}.use_kl_loss") or g("algorithm.use_kl_in_reward")),
        ref_offload=g(f"{ref}.fsdp_config.param_offload"),
        critic=shape if gae else None, critic_shard=par.critic_fsdp if gae else world,
        critic_param_offload=g("critic.model.fsdp_config.param_offload"),
        critic_optimizer_offload=g("critic.model.fsdp_config.optimizer_offload"),
        hybrid=bool(g("actor_rollout_ref.hybrid_engine") and g(f"{rl}.free_cache_engine")),
        rollout_tp=par.rollout_tp,
        sort_sampling=any(g(f"{sec}.top_k") > 0 or g(f"{sec}.top_p") < 1 for sec in (rl, f"{rl}.val_kwargs")),
        # 'auto' is planned with checkpointing first; _resolve_checkpointing may then turn it off
        gradient_checkpointing=g(f"{MODEL}.enable_gradient_checkpointing") is not False,
        critic_gradient_checkpointing=g("critic.model.enable_gradient_checkpointing") is not False,
        activation_offload=bool(g(f"{MODEL}.enable_activation_offload")),
        critic_activation_offload=bool(g("critic.model.enable_activation_offload")),
        lora_params=adapter_param_count(shape, lora_rank, g(f"{MODEL}.target_modules")),
        lora_base_bytes=_dtype_bytes(lora_base_dtype) if lora_base_dtype else 0,
        fused_optimizer=fused_optimizer, liger=use_liger,
        reward_model=rm_shape, rm_shard=par.reward_fsdp,
        rm_param_offload=bool(g("reward_model.model.fsdp_config.param_offload")),
        rm_param_bytes=2 if device.type == "cuda" else 4,
        router_aux_loss=g(f"{a}.router_aux_loss_coef") > 0, router_z_loss=g(f"{a}.router_z_loss_coef") > 0,
        routing_record=g(f"{a}.router_replay.mode") == "R3")
    mm = MemoryModel(shape, res)
    P, R = g("data.max_prompt_length"), g("data.max_response_length")
    S, bs = P + R, g(f"{rl}.block_size")

    def micro_tokens(shared: bool):  # rows -> tokens of a micro-batch, each prompt once with shared prompts
        return (lambda rows: shared_prompt_tokens(rows, layout.n, P, R)) if shared else (lambda rows: rows * S)

    tokens_of = micro_tokens(share)   # the actor's and reference's passes
    budget = None if device.total_bytes is None else SAFETY * device.total_bytes

    # ---- rollout: KV for this step's batch (and validation's), engine concurrency
    val_n = g(f"{rl}.val_kwargs.n")
    val_per_dp = -(-(val_prompts or 0) // layout.rollout_dp)
    rows = max(layout.rollout_samples_per_dp, val_per_dp * val_n)
    engine_seqs = min(g(f"{rl}.max_num_seqs"), rows)
    sharing = g(f"{rl}.enable_prefix_sharing")
    kv, kv_unshared = kv_need(layout.rollout_prompts_per_dp, layout.n, P, R, bs, sharing, engine_seqs)
    val_kv, val_unshared = kv_need(val_per_dp, val_n, P, R, bs, sharing, engine_seqs)
    kv, kv_unshared = max(kv, val_kv), max(kv_unshared, val_unshared)
    # a hybrid engine allocates per call (the training step's need); a resident one holds the largest call's
    train_kv = kv_need(layout.rollout_prompts_per_dp, layout.n, P, R, bs, sharing, engine_seqs)[0]
    if judge:  # the judge's call: one prompt per sample (prompt + verdict within P + R), nothing shared
        judge_kv = kv_need(layout.rollout_samples_per_dp, 1, P, R, bs, sharing, engine_seqs)[0]
        train_kv, kv = max(train_kv, judge_kv), max(kv, judge_kv, val_unshared)
        kv_unshared = max(kv_unshared, judge_kv)
    step_kv = train_kv if res.hybrid else kv
    if budget is not None:  # more KV than fits: fewer sequences at once, the rest queue (nothing refused)
        room = _kv_room(mm, res, budget, bs, S, R, min(engine_seqs, layout.rollout_samples_per_dp),
                        min(g(f"{rl}.max_num_batched_tokens"), engine_seqs * S))
        per_seq = -(-S // bs)
        if per_seq <= room < kv:
            seqs = min(engine_seqs, room // per_seq)
            choices.append(f"kv cache = {room} blocks, {room / kv:.0%} of the step's need of {kv}: at most {seqs} "
                           f"sequences at once (of {engine_seqs}; {rl}.max_num_seqs), the rest wait their turn; "
                           f"more GPUs or '{rl}.tensor_model_parallel_size' for full concurrency")
            kv, train_kv, step_kv, engine_seqs = room, min(train_kv, room), min(step_kv, room), seqs
    kv_bytes = kv * mm.kv_block_bytes(bs)
    prefill = min(g(f"{rl}.max_num_batched_tokens"), engine_seqs * S)
    predicted = {"gen": mm.gen(step_kv, bs, min(engine_seqs, layout.rollout_samples_per_dp), prefill)}

    def auto_unshard(model: ModelShape) -> bool:  # fsdp.should_keep_unsharded's 'auto' rule, on the plan's GPU
        return device.total_bytes is not None and model.num_params * 2 <= AUTO_UNSHARD_MAX_FRACTION * device.total_bytes

    def unshard(key: str, model: ModelShape) -> bool:
        v = g(key)
        return auto_unshard(model) if _auto(v) else bool(v)

    lp_once, ref_once = unshard(f"{rl}.log_prob_unshard_once", shape), unshard(f"{ref}.log_prob_unshard_once", shape)

    def pick(key: str, value, candidates: list[int], tokens_target: int, peak, seq_len: int = S,
             tokens=None) -> int:
        """The configured size, or the largest candidate within the token target that fits the budget;
        tokens(rows): a micro-batch's tokens (rows x seq_len if None)."""
        tokens = tokens or (lambda d: d * seq_len)
        if not _auto(value):
            if budget is not None and peak(value).total > budget:
                fit = next((d for d in candidates if peak(d).total <= budget), None)
                raise ConfigError([f"'{key}' = {value}: phase {peak(value).phase} is predicted to peak at "
                                   f"{peak(value).total / GiB:.1f} GiB per GPU, over {SAFETY:.0%} of "
                                   f"{device.total_bytes / GiB:.1f} GiB; "
                                   + (f"set it to {fit} (or 'auto')" if fit else _no_fit_hint(key, peak(1)))])
            return value
        within = [d for d in candidates if tokens(d) <= tokens_target] or [candidates[-1]]
        for d in within:
            if budget is None or peak(d).total <= budget:
                choices.append(f"{key} = {d} ({tokens(d)} tokens per micro-batch"
                               + (f", predicted {peak(d).phase} peak {peak(d).total / GiB:.1f} GiB)"
                                  if budget is not None else ")"))
                return d
        raise ConfigError([f"'{key}' = auto: even 1 row per micro-batch is predicted to need "
                           f"{peak(1).total / GiB:.1f} GiB in phase {peak(1).phase}, over {SAFETY:.0%} of "
                           f"{device.total_bytes / GiB:.1f} GiB; " + _no_fit_hint(key, peak(1))])

    def pick_tokens(key: str, value, tokens_target: int, peak) -> int:
        """The configured token budget, or the throughput target raised to the longest sequence (a micro-batch
        must hold one), lowered while its predicted phase peak does not fit (never below that sequence)."""
        if not _auto(value):
            if budget is not None and peak(value).total > budget:
                raise ConfigError([f"'{key}' = {value}: phase {peak(value).phase} is predicted to peak at "
                                   f"{peak(value).total / GiB:.1f} GiB per GPU, over {SAFETY:.0%} of "
                                   f"{device.total_bytes / GiB:.1f} GiB; lower it (at least {S}) or set 'auto'"])
            return value
        tokens = max(tokens_target, S)
        while budget is not None and tokens > S and peak(tokens).total > budget:
            tokens = max(S, tokens // 2)
        if budget is not None and peak(tokens).total > budget:
            raise ConfigError([f"'{key}' = auto: even one sequence of {S} tokens is predicted to need "
                               f"{peak(tokens).total / GiB:.1f} GiB in phase {peak(tokens).phase}, over {SAFETY:.0%} "
                               f"of {device.total_bytes / GiB:.1f} GiB; " + _no_fit_hint(key, peak(tokens))])
        choices.append(f"{key} = {tokens}" + (f" (predicted {peak(tokens).phase} peak {peak(tokens).total / GiB:.1f} "
                                              "GiB)" if budget is not None else ""))
        return tokens

    def dynamic(key: str, micro_key: str) -> bool:
        return resolve_dynamic_bsz(g(key), g(micro_key), device.type, key, micro_key, choices)

    samples_per_gpu = layout.train_batch_size * layout.n // layout.train_dp
    lp_candidates = list(range(samples_per_gpu, 0, -1))
    actor_micro = actor_tokens = None
    actor_dyn = dynamic(f"{a}.use_dynamic_bsz", f"{a}.ppo_micro_batch_size_per_gpu")
    if not actor_dyn:
        actor_micro = pick(f"{a}.ppo_micro_batch_size_per_gpu", g(f"{a}.ppo_micro_batch_size_per_gpu"),
                           _divisors_desc(layout.ppo_mini_batch_per_gpu), UPDATE_TOKENS_TARGET,
                           lambda m: mm.update_actor(m, S, R, kv_bytes, tokens_of(m)), tokens=tokens_of)
        predicted["update_actor"] = mm.update_actor(actor_micro, S, R, kv_bytes, tokens_of(actor_micro))
    else:
        actor_tokens = pick_tokens(f"{a}.ppo_max_token_len_per_gpu", g(f"{a}.ppo_max_token_len_per_gpu"),
                                   UPDATE_TOKENS_TARGET, lambda t: mm.update_actor(1, t, R, kv_bytes))
        predicted["update_actor"] = mm.update_actor(1, actor_tokens, R, kv_bytes)
    lp_micro = ref_micro = lp_tokens = ref_tokens = None
    on_policy = (g(f"{a}.ppo_epochs") == 1 and layout.num_mini_batches == 1 and not g("algorithm.use_kl_in_reward"))
    old_pass = g(f"{a}.old_log_prob_pass")
    if old_pass is False and not on_policy:
        raise ConfigError([f"'{a}.old_log_prob_pass' = false needs an on-policy update (ppo_epochs 1, "
                           "ppo_mini_batch_size = train_batch_size, algorithm.use_kl_in_reward false)"])
    # rejection and batch-normalised IS weights change the whole batch's mask / weights before any update
    # micro-batch runs: they need the old log-probs first (plain token/sequence weights are made per micro-batch)
    rc = "algorithm.rollout_correction"
    whole_batch = [k for k in (f"{rc}.rollout_rs", f"{rc}.rollout_is_batch_normalize") if g(k)]
    if old_pass is False and whole_batch:
        raise ConfigError([f"'{a}.old_log_prob_pass' = false cannot go with '{whole_batch[0]}' = {g(whole_batch[0])}: "
                           "it needs the old log-probs of the whole batch before the update (set it to auto or true)"])
    old_pass = (not on_policy or bool(whole_batch)) if _auto(old_pass) else bool(old_pass)
    if not old_pass:
        choices.append(f"{a}.old_log_prob_pass = false (one on-policy mini-batch: the update's log-probs, detached, "
                       "are the old ones)")
    if old_pass and dynamic(f"{rl}.log_prob_use_dynamic_bsz", f"{rl}.log_prob_micro_batch_size_per_gpu"):
        lp_tokens = pick_tokens(f"{rl}.log_prob_max_token_len_per_gpu", g(f"{rl}.log_prob_max_token_len_per_gpu"),
                                LOGPROB_TOKENS_TARGET,
                                lambda t: mm.log_prob("old_log_prob", 1, t, R, lp_once, kv_bytes))
        predicted["old_log_prob"] = mm.log_prob("old_log_prob", 1, lp_tokens, R, lp_once, kv_bytes)
    elif old_pass:
        lp_micro = pick(f"{rl}.log_prob_micro_batch_size_per_gpu", g(f"{rl}.log_prob_micro_batch_size_per_gpu"),
                        lp_candidates, LOGPROB_TOKENS_TARGET,
                        lambda m: mm.log_prob("old_log_prob", m, S, R, lp_once, kv_bytes, tokens_of(m)),
                        tokens=tokens_of)
        predicted["old_log_prob"] = mm.log_prob("old_log_prob", lp_micro, S, R, lp_once, kv_bytes,
                                                tokens_of(lp_micro))
    if res.has_ref and dynamic(f"{ref}.log_prob_use_dynamic_bsz", f"{ref}.log_prob_micro_batch_size_per_gpu"):
        ref_tokens = pick_tokens(f"{ref}.log_prob_max_token_len_per_gpu", g(f"{ref}.log_prob_max_token_len_per_gpu"),
                                 LOGPROB_TOKENS_TARGET, lambda t: mm.log_prob("ref", 1, t, R, ref_once, kv_bytes))
        predicted["ref"] = mm.log_prob("ref", 1, ref_tokens, R, ref_once, kv_bytes)
    elif res.has_ref:
        ref_micro = pick(f"{ref}.log_prob_micro_batch_size_per_gpu", g(f"{ref}.log_prob_micro_batch_size_per_gpu"),
                         lp_candidates, LOGPROB_TOKENS_TARGET,
                         lambda m: mm.log_prob("ref", m, S, R, ref_once, kv_bytes, tokens_of(m)), tokens=tokens_of)
        predicted["ref"] = mm.log_prob("ref", ref_micro, S, R, ref_once, kv_bytes, tokens_of(ref_micro))
    critic_micro = critic_fwd = critic_tok = critic_fwd_tok = None
    critic_once = unshard("critic.forward_unshard_once", shape)
    # the critic shares prompts with the actor's choice, unless its own Ulysses SP splits the packed row
    critic_share = gae and share and par.critic_sp == 1
    critic_tokens = micro_tokens(critic_share)

    critic_dyn = gae and dynamic("critic.use_dynamic_bsz", "critic.ppo_micro_batch_size_per_gpu")
    if critic_dyn:  # the values pass follows the update's choice, with the log-prob target (no gradients)
        key = "critic.ppo_max_token_len_per_gpu"
        critic_tok = pick_tokens(key, g(key), UPDATE_TOKENS_TARGET,
                                 lambda t: mm.critic_phase("update_critic", 1, t, False, kv_bytes))
        critic_fwd_tok = pick_tokens(key, g(key), LOGPROB_TOKENS_TARGET,
                                     lambda t: mm.critic_phase("values", 1, t, critic_once, kv_bytes))
        predicted["values"] = mm.critic_phase("values", 1, critic_fwd_tok, critic_once, kv_bytes)
        predicted["update_critic"] = mm.critic_phase("update_critic", 1, critic_tok, False, kv_bytes)
    elif gae:
        critic_micro = pick("critic.ppo_micro_batch_size_per_gpu", g("critic.ppo_micro_batch_size_per_gpu"),
                            _divisors_desc(layout.critic_mini_batch_per_gpu), UPDATE_TOKENS_TARGET,
                            lambda m: mm.critic_phase("update_critic", m, S, False, kv_bytes, critic_tokens(m)),
                            tokens=critic_tokens)
        critic_fwd = pick("critic.forward_micro_batch_size_per_gpu", g("critic.forward_micro_batch_size_per_gpu"),
                          lp_candidates, LOGPROB_TOKENS_TARGET,
                          lambda m: mm.critic_phase("values", m, S, critic_once, kv_bytes, critic_tokens(m)),
                          tokens=critic_tokens)
        predicted["values"] = mm.critic_phase("values", critic_fwd, S, critic_once, kv_bytes,
                                              critic_tokens(critic_fwd))
        predicted["update_critic"] = mm.critic_phase("update_critic", critic_micro, S, False, kv_bytes,
                                                     critic_tokens(critic_micro))
    rm_micro, rm_once, rm_len = None, False, g("reward_model.max_length") or S
    if rm_shape is not None:
        rm_once = auto_unshard(rm_shape)
        rm_micro = pick("reward_model.micro_batch_size_per_gpu", g("reward_model.micro_batch_size_per_gpu"),
                        list(range(max(1, layout.train_batch_size * layout.n // world), 0, -1)),
                        LOGPROB_TOKENS_TARGET, lambda m: mm.reward_model_phase(m, rm_len, rm_once, kv_bytes), rm_len)
        predicted["reward_model"] = mm.reward_model_phase(rm_micro, rm_len, rm_once, kv_bytes)
    actor_ckpt, critic_ckpt = res.gradient_checkpointing, res.critic_gradient_checkpointing
    kept_layers = critic_kept = 0
    if _auto(g(f"{MODEL}.enable_gradient_checkpointing")):
        actor_ckpt, kept_layers = _resolve_checkpointing(
            f"{MODEL}.enable_gradient_checkpointing", res.activation_offload, budget, predicted, actor_micro, S,
            actor_tokens,
            lambda m, t, k=None: MemoryModel(shape, replace(res, gradient_checkpointing=k is not None,
                                                            kept_layers=k or 0)).update_actor(
                m, t, R, kv_bytes, None if actor_dyn else tokens_of(m)),
            "update_actor", choices, shape.layers)
    if gae and _auto(g("critic.model.enable_gradient_checkpointing")):
        critic_ckpt, critic_kept = _resolve_checkpointing(
            "critic.model.enable_gradient_checkpointing", res.critic_activation_offload, budget, predicted,
            critic_micro, S, critic_tok,
            lambda m, t, k=None: MemoryModel(shape, replace(res, critic_gradient_checkpointing=k is not None,
                                                            critic_kept_layers=k or 0)
                                             ).critic_phase("update_critic", m, t, False, kv_bytes,
                                                            None if critic_dyn else critic_tokens(m)),
            "update_critic", choices, shape.layers)
    if budget is not None and predicted["gen"].total > budget:
        raise ConfigError([f"rollout phase predicted at {predicted['gen'].total / GiB:.1f} GiB per GPU, over "
                           f"{SAFETY:.0%} of {device.total_bytes / GiB:.1f} GiB ({predicted['gen'].describe()}): "
                           f"raise '{rl}.tensor_model_parallel_size', lower 'data.train_batch_size', or set "
                           f"'{a}.fsdp_config.param_offload' / 'optimizer_offload' = true"])
    layout = replace(layout, ppo_micro_batch_per_gpu=actor_micro, log_prob_micro_batch_per_gpu=lp_micro,
                     ref_log_prob_micro_batch_per_gpu=ref_micro,
                     grad_accum_steps=None if actor_micro is None else layout.ppo_mini_batch_per_gpu // actor_micro)
    spec = resolve_speculative(g(f"{rl}.speculative"), device, choices)
    partial = plan_partial_rollout(g, layout.n, layout.train_batch_size,
                                   [layout.train_dp] + ([world // par.critic_sp] if gae else []), choices)
    return RunPlan(layout=layout, device=device, model=shape,
                   rollout_dtype="fp32" if cpu else _dtype_name(g(f"{rl}.dtype")),
                   frozen_dtype=frozen_dtype, actor_micro=actor_micro, log_prob_micro=lp_micro,
                   ref_log_prob_micro=ref_micro, critic_micro=critic_micro, critic_forward_micro=critic_fwd,
                   log_prob_unshard_once=lp_once, ref_log_prob_unshard_once=ref_once,
                   critic_forward_unshard_once=critic_once, kv_blocks=kv, kv_blocks_unshared=kv_unshared,
                   engine_max_num_seqs=engine_seqs,
                   reshard_strategy=os.environ.get("HYBRIDRL_RESHARD", "slice"), old_log_prob_pass=old_pass,
                   hybrid=res.hybrid, kv_rule=(P, R, bs, sharing),
                   predicted=predicted, choices=tuple(choices), reward_model_micro=rm_micro,
                   reward_model_unshard_once=rm_once, reward_model_max_length=rm_len, lora_base_dtype=lora_base_dtype,
                   fused_optimizer=res.fused_optimizer, gradient_checkpointing=actor_ckpt,
                   critic_gradient_checkpointing=critic_ckpt, use_liger=use_liger,
                   recompute_kept_layers=kept_layers, critic_recompute_kept_layers=critic_kept,
                   share_prompts=share, critic_share_prompts=critic_share, actor_max_tokens=actor_tokens,
                   log_prob_max_tokens=lp_tokens, ref_log_prob_max_tokens=ref_tokens, critic_max_tokens=critic_tok,
                   critic_forward_max_tokens=critic_fwd_tok,
                   remove_padding=resolve_remove_padding(g(f"{MODEL}.use_remove_padding"), actor_dyn or (
                       lp_tokens is not None) or (ref_tokens is not None), layout.ulysses_sp),
                   critic_remove_padding=resolve_remove_padding(g("critic.model.use_remove_padding"), critic_dyn,
                                                                par.critic_sp),
                   engine_max_num_batched_tokens=max(g(f"{rl}.max_num_batched_tokens"), S),
                   engine_async_scheduling=(not cpu) if _auto(g(f"{rl}.async_scheduling"))
                   else bool(g(f"{rl}.async_scheduling")), engine_speculative=spec,
                   partial_rollout=partial, record_routed_experts=res.routing_record)


def resolve_speculative(section, device: DeviceSpec, choices: list[str],
                        key: str = "actor_rollout_ref.rollout.speculative") -> SpeculativeConfig:
    """`rollout.speculative` as the engine's SpeculativeConfig. max_running_seqs auto: speculate while a verify step
    (each running sequence with num_draft_tokens + 1 rows) has at most half the device's ridge point in rows — its
    bf16 FLOP/s over its HBM bytes/s, the batch at which a decode step's weight read stops dominating — so the step
    stays memory-bound and checking the drafts costs about what decoding one token does; SPEC_ROWS_FALLBACK rows
    where the peaks are unknown."""
    from hybridrl.device_peaks import peaks_of

    k = int(section["num_draft_tokens"])
    value = section["max_running_seqs"]
    if _auto(value):
        peaks = peaks_of(device.name) if device.type == "cuda" else None
        rows = peaks.bf16_flops / peaks.hbm_bytes_per_s / 2 if peaks else SPEC_ROWS_FALLBACK
        value = max(1, int(rows // (k + 1)))
        if section["enable"]:
            choices.append(f"{key}.max_running_seqs = {value} (" + (
                f"{value} x {k + 1} verify rows within half {device.name}'s ridge point, {2 * rows:.0f} FLOP/byte"
                if peaks else f"{SPEC_ROWS_FALLBACK} verify rows: no known peaks for {device.name}") + ")")
    return SpeculativeConfig(enable=bool(section["enable"]), num_draft_tokens=k,
                             min_match=int(section["min_match"]), max_match=int(section["max_match"]),
                             max_running_seqs=int(value))


def _describe_speculative(spec: SpeculativeConfig) -> str:
    if not spec.enable:
        return "off (rollout.speculative.enable)"
    return (f"while <= {spec.max_running_seqs} sequences run, each decode step also checks up to "
            f"{spec.num_draft_tokens} draft tokens per sequence (the tokens that followed its last "
            f"{spec.min_match}-{spec.max_match} tokens in its prompt, own and sibling responses), accepted exactly "
            "(same distribution); multi-turn rollouts decode plainly")


def resolve_dynamic_bsz(value, micro, device_type: str, key: str, micro_key: str, choices: list[str]) -> bool:
    """`use_dynamic_bsz` (`key`): true / false as given; auto = token-budgeted micro-batches on GPUs where the
    pass's micro-batch size (`micro_key`) is left to the plan ('auto') or null, fixed rows where it is a number
    (verl's meaning of an explicit size) and on the CPU (the padded rows are the reference there)."""
    if value is True or value is False:
        return value
    if micro is None:
        return True
    on = _auto(micro) and device_type != "cpu"
    choices.append(f"{key} = {str(on).lower()} (" + (
        "token-budgeted micro-batches at the step's actual lengths" if on else
        f"{micro_key} = {micro}" if not _auto(micro) else "the CPU: fixed rows") + ")")
    return on


def resolve_remove_padding(value, dynamic: bool, sp: int) -> bool:
    """`use_remove_padding`: auto = packed where micro-batches are token-budgeted (a padded micro-batch of short
    rows would compute every row at the longest length) or split by Ulysses (which needs the packed row)."""
    return bool(value) if not _auto(value) else bool(dynamic or sp > 1)


def shared_prompt_tokens(rows: int, n: int, prompt_len: int, response_len: int) -> int:
    """Tokens of a micro-batch of `rows` consecutive samples (each prompt's n samples adjacent) with each prompt
    once, at the longest lengths: a micro-batch of whole groups holds rows / n prompts, one inside a group one, any
    other at most rows // n + 2 (the window may start and end inside a group)."""
    prompts = rows // n if rows % n == 0 else 1 if n % rows == 0 else min(rows, rows // n + 2)
    return prompts * prompt_len + rows * response_len


def resolve_prefix_grouper(value, device_type: str, n: int, sp: int, choices: list[str],
                           key: str = "actor_rollout_ref.actor.use_prefix_grouper") -> bool:
    """`use_prefix_grouper`: true needs no Ulysses SP (its attention splits one packed row by position) and is
    refused with it; auto is on on GPUs when a prompt has several samples (rollout.n > 1) and true would be
    accepted, and off on the CPU (runs there check correctness; the padded path is the reference)."""
    if value not in ("auto", True, False) or isinstance(value, int) and not isinstance(value, bool):
        raise ConfigError([f"'{key}' = {value!r}: must be auto, true or false"])
    if value is False:
        return False
    if sp > 1:
        if value is True:
            raise ConfigError([f"'{key}' = true does not go with actor_rollout_ref.actor.ulysses_sequence_parallel_"
                               f"size = {sp} (Ulysses splits the packed row by position); set one of them to "
                               "false / 1"])
        choices.append(f"{key} = false (Ulysses sequence parallelism, sp = {sp})")
        return False
    if value is True:
        return True
    why_not = ("rollout.n = 1: no prompt has two samples" if n == 1
               else "the CPU: the padded path" if device_type == "cpu" else None)
    choices.append(f"{key} = " + (f"false ({why_not})" if why_not else
                                  f"true (each prompt once per micro-batch for its {n} samples)"))
    return why_not is None


def resolve_liger(value, device_type: str, model_type: str | None, choices: list[str],
                  key: str = f"{MODEL}.use_liger") -> bool:
    """`use_liger` (`key`): true needs a GPU, the liger-kernel package and an architecture it patches (else a
    ConfigError naming what is missing); auto is on exactly where true would be accepted, and says why in
    `choices`; false is off."""
    from hybridrl.training.liger import LIGER_ARCHITECTURES, liger_installed

    if value not in ("auto", True, False) or isinstance(value, int) and not isinstance(value, bool):
        raise ConfigError([f"'{key}' = {value!r}: must be auto, true or false"])
    if value is False:
        return False
    missing = ("the device is the CPU: Liger's kernels are Triton GPU kernels" if device_type == "cpu"
               else "the liger-kernel package is not installed: pip install 'hybridrl[gpu]'" if not liger_installed()
               else f"model_type {model_type!r} has no Liger kernels here (supported: {', '.join(LIGER_ARCHITECTURES)})"
               if model_type not in LIGER_ARCHITECTURES else None)
    if value is True:
        if missing:
            raise ConfigError([f"'{key}' = true: {missing}; set it to false or auto"])
        return True
    choices.append(f"{key} = {'false (' + missing + ')' if missing else 'true (fused RMSNorm, SwiGLU, RoPE)'}")
    return missing is None


def _resolve_checkpointing(key: str, offload: bool, budget: float | None, predicted: dict, micro: int | None,
                           seq_len: int, dyn_tokens: int | None, peak, phase: str, choices: list[str],
                           layers: int) -> tuple[bool, int]:
    """Gradient checkpointing 'auto' -> (checkpointing, kept_layers). Off (backward without recomputing each
    layer's forward: one forward fewer per micro-batch) where the micro-batch chosen with it — or the token
    budget — also fits without it within the run's predicted peak, the largest phase with checkpointing (e.g. a
    rollout holding a long-response KV cache). Else on, but with as many of the last `layers` decoder layers as fit
    under that peak keeping their activations (each one kept saves its share of the recompute). Lean first: it
    never raises the peak. It never shrinks the micro-batch to fit either: on a 7B LoRA update, 128 micro-batches
    of 2048 tokens without recompute took 1.54x the time of 16 of 16384 with it (docs/benchmarks.md). On a CPU (no
    memory model) it is off. Updates `predicted[phase]` unless fully on.
    `peak(rows, tokens, kept)`: the phase's memory with `kept` layers not recomputed, without checkpointing for
    kept=None."""
    if offload:
        choices.append(f"{key} = true (activation offload moves the inputs checkpointing keeps)")
        return True, 0
    if budget is None:
        choices.append(f"{key} = false (no device memory to plan against: recompute would only cost time)")
        return False, 0
    ceiling = max(p.total for p in predicted.values())
    rows, tokens = (1, dyn_tokens) if dyn_tokens is not None else (micro, seq_len)
    without = peak(rows, tokens)
    if without.total <= ceiling:
        predicted[phase] = without
        choices.append(f"{key} = false (no recompute: predicted {phase} peak {without.total / GiB:.1f} GiB, within "
                       f"the run's {ceiling / GiB:.1f} GiB)")
        return False, 0
    kept = next((k for k in range(layers - 1, 0, -1) if peak(rows, tokens, k).total <= ceiling), 0)
    if kept:
        predicted[phase] = peak(rows, tokens, kept)
        choices.append(f"{key} = true for the first {layers - kept} of {layers} decoder layers (the last {kept} keep "
                       f"their activations: predicted {phase} peak {predicted[phase].total / GiB:.1f} GiB, within "
                       f"the run's {ceiling / GiB:.1f} GiB; without recompute {without.total / GiB:.1f} GiB)")
        return True, kept
    choices.append(f"{key} = true (without it the {phase} micro-batch would peak at {without.total / GiB:.1f} "
                   f"GiB, over the run's predicted {ceiling / GiB:.1f} GiB)")
    return True, 0


def _kv_room(mm: MemoryModel, res: Residency, budget: float, block_size: int, seq_len: int, response_len: int,
             rows: int, prefill: int) -> int:
    """KV blocks that fit the budget next to everything else of the phases that hold the cache: the rollout, and
    for a resident engine (scheme A) also the update and log-prob passes at one row per micro-batch."""
    peaks = [mm.gen(0, block_size, rows, prefill).total]
    if not res.hybrid:
        peaks += [mm.update_actor(1, seq_len, response_len, 0).total,
                  mm.log_prob("old_log_prob", 1, seq_len, response_len, False, 0).total]
    return max(0, int((budget - max(peaks)) // mm.kv_block_bytes(block_size)))


def reward_model_hf_config(config: DictConfig):
    """The reward model's HF config when it runs as a worker (reward_model.enable, style=model), else None."""
    rm = config.reward_model
    if not (rm.enable and rm.style == "model"):
        return None
    from hybridrl.training.fsdp import load_hf_config

    return load_hf_config(os.path.expanduser(rm.model.path), role="reward_model",
                          override_config=rm.model.override_config, trust_remote_code=bool(rm.model.trust_remote_code))


def training_dtypes(master_dtype: str, lora: bool, device_type: str) -> tuple[str, str | None, bool]:
    """(frozen_dtype, lora_base_dtype, fused_optimizer) of a plan: models that never train in the compute dtype
    (fp32 on CPU, where runs are for correctness and bf16 matmuls are slow; bf16 on GPUs); a LoRA base likewise
    but never wider than the masters (model_dtype=bf16 on CPU stays bf16), None without LoRA; AdamW's fused
    in-place kernel on GPUs."""
    frozen = "fp32" if device_type == "cpu" else "bf16"
    base = min(frozen, _dtype_name(master_dtype), key=_dtype_bytes) if lora else None
    return frozen, base, device_type != "cpu"


def _reward_model_shape(c: dict, rm_hf_config) -> ModelShape | None:
    """The reward model's shape (style=model), or None. A ...ForSequenceClassification has no LM head: its
    parameters are counted as a tied model's (the one-output score head is negligible)."""
    rm = c["reward_model"]
    if not rm["enable"] or rm["style"] != "model":
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


def _no_fit_hint(key: str, one: PhaseMemory) -> str:
    return (f"it needs {one.total / GiB:.1f} GiB at 1 row ({one.describe()}): enable gradient checkpointing "
            "(model.enable_gradient_checkpointing=true) and activation offload (model.enable_activation_offload=true), "
            "offload (fsdp_config.param_offload / optimizer_offload), bf16 masters (fsdp_config.model_dtype=bf16) or more GPUs")
