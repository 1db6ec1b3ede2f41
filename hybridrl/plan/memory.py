"""Memory model of one RL step, per GPU and per phase: what is resident (weights, gradients, optimizer state,
the reference, the critic, the engine) plus what the phase itself allocates (activations, logits, KV).

Every number estimates what `torch.cuda.max_memory_allocated` sees in that phase (the CUDA context and allocator
slack are not in it): on one H200 from 0.5B to 7B, full fine-tuning and LoRA, with and without recompute, within
-4.4% .. +3.2% of the measured peak (docs/benchmarks.md §0); the plan keeps a margin (sizing.SAFETY). The plan
(run_plan.py) uses it to choose micro-batch sizes and to refuse a config that cannot fit; workers log the measured
peak of the same phases next to these predictions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hybridrl.algorithms.chunked_logprob import chunk_rows
from hybridrl.plan.model_shape import ModelShape

GiB = 1024**3


@dataclass(frozen=True)
class Residency:
    """Static facts of where each model's state lives (from the config; the actor's 'auto' offloads as the plan
    settles them, plan/offload.py)."""
    shard: int                  # FSDP shard count of the actor (fsdp_size or the world)
    master_bytes: int           # 4 fp32 masters, 2 bf16
    param_offload: bool
    optimizer_offload: bool
    has_ref: bool
    ref_offload: bool
    critic: ModelShape | None   # value model (GAE) or None
    critic_shard: int
    critic_param_offload: bool
    critic_optimizer_offload: bool
    hybrid: bool                # false = scheme A: the engine stays resident in every phase
    rollout_tp: int
    gradient_checkpointing: bool
    critic_gradient_checkpointing: bool
    activation_offload: bool = False        # checkpointed layer inputs on the host during the update
    critic_activation_offload: bool = False
    lora_params: int = 0        # actor LoRA adapter parameters; 0 = full fine-tuning. With LoRA only the adapters
                                # have grads and AdamW state, and the reference is the actor's base (no copy)
    lora_base_bytes: int = 0    # LoRA: bytes per frozen base parameter (2: bf16 on GPUs; adapters: master_bytes)
    critic_lora_params: int = 0  # the critic's LoRA adapters and value head (all it trains); 0 = full fine-tuning
    lora_expert_bytes: int = 0  # LoRA on experts: one MoE layer's adapted expert tensors in bf16, which peft's
                                # forward rebuilds as W + scale·B·A (the update's backward keeps that copy)
    reward_model: ModelShape | None = None   # sequence-classification reward model (reward_model.style=model)
    rm_shard: int = 1
    rm_param_offload: bool = True   # its shards on the GPU only in the reward_model phase
    rm_param_bytes: int = 2     # bf16 on GPUs (it never trains: no fp32 master)
    optimizer_steps: int = 1        # actor optimizer steps per update (mini-batches x ppo_epochs): with one, an
                                    # offloaded AdamW state returns only for that step, after the last backward
    critic_optimizer_steps: int = 1     # the same for the critic's update
    sort_sampling: bool = False     # some sampling uses top-k / top-p (the sorting sampler), else the one-pass kernel
    fused_optimizer: bool = True    # AdamW's fused in-place kernel; false: the multi-tensor path, whose step holds
                                    # sqrt(exp_avg_sq) of every trained tensor at once
    liger: bool = False             # the actor's training graph uses Liger's RMSNorm / SwiGLU (training/liger.py)
    kept_layers: int = 0            # with the actor's checkpointing: its last decoder layers that keep their
                                    # activations instead of recomputing them (0: every layer recomputes)
    update_unshard_once: bool = False   # the actor's update keeps every block unsharded for a whole mini-batch
    critic_kept_layers: int = 0     # the same for the critic's
    router_aux_loss: bool = False   # MoE: the actor's load-balancing loss is on (its router logits kept to backward)
    router_z_loss: bool = False     # MoE: the router z-loss is on
    routing_record: bool = False    # MoE routing replay: the engine records each token's experts beside its K/V
    engine_borrowed_params: int = 0  # parameters the hybrid engine uses in place from the actor (no engine copy)
    engine_adapter_params: int = 0   # LoRA on experts, unmerged: the engine's own per-expert factors (padded rank)


@dataclass(frozen=True)
class PhaseMemory:
    phase: str
    parts: dict = field(default_factory=dict)   # name -> bytes

    @property
    def total(self) -> int:
        return int(sum(self.parts.values()))

    def describe(self) -> str:
        big = sorted(((v, k) for k, v in self.parts.items() if v > 0), reverse=True)
        return ", ".join(f"{k} {v / GiB:.2f}" for v, k in big)


class MemoryModel:
    def __init__(self, shape: ModelShape, res: Residency):
        self.s, self.r = shape, res

    # ------------------------------------------------------------------ resident state
    def _actor(self, grads: bool, params_on_gpu: bool, optim_on_gpu: bool) -> dict:
        p, mb, shard = self.s.num_params, self.r.master_bytes, self.r.shard
        trained = self.r.lora_params or p   # LoRA: the frozen base needs no grads or optimizer state
        stored = p * self.r.lora_base_bytes + self.r.lora_params * mb if self.r.lora_params else p * mb
        return {"actor params": stored / shard if params_on_gpu else 0,
                "actor grads": trained * mb / shard if grads else 0,
                "actor optimizer": 2 * trained * mb / shard if optim_on_gpu else 0}

    def _others(self, ref_on_gpu: bool, critic_grads: bool = False, critic_on_gpu: bool | None = None,
                rm_on_gpu: bool = False, critic_optim_on_gpu: bool | None = None) -> dict:
        r, parts = self.r, {}
        if r.reward_model is not None and (rm_on_gpu or not r.rm_param_offload):
            parts["reward model params"] = r.reward_model.num_params * r.rm_param_bytes / r.rm_shard
        if r.has_ref and ref_on_gpu and not r.lora_params:
            parts["ref params"] = self.s.num_params * 2 / r.shard
        if r.critic is not None:
            pc = r.critic.num_params
            params = not r.critic_param_offload if critic_on_gpu is None else critic_on_gpu
            optim = (not r.critic_optimizer_offload if critic_on_gpu is None else critic_on_gpu) \
                if critic_optim_on_gpu is None else critic_optim_on_gpu
            trained = r.critic_lora_params or pc   # LoRA: the adapters (and the value head) only
            parts["critic params"] = pc * 4 / r.critic_shard if params else 0
            parts["critic optimizer"] = 2 * trained * 4 / r.critic_shard if optim else 0
            parts["critic grads"] = trained * 4 / r.critic_shard if critic_grads else 0
        return parts

    def engine_weights(self) -> int:
        return int((self.s.num_params - self.r.engine_borrowed_params + self.r.engine_adapter_params) * 2
                   / self.r.rollout_tp)

    def kv_block_bytes(self, block_size: int) -> int:
        """One KV block on one TP rank (the heads split over TP; replicated when TP exceeds the KV heads)."""
        kv_heads = max(1, self.s.kv_heads // self.r.rollout_tp)
        record = block_size * self.s.routing_record_bytes_per_token if self.r.routing_record else 0
        return 2 * self.s.layers * block_size * kv_heads * self.s.head_dim * 2 + record

    def _scheme_a_engine(self, kv_bytes: int) -> dict:
        return {} if self.r.hybrid else {"engine weights": self.engine_weights(), "kv cache": kv_bytes}

    def _sampling_bytes_per_logit(self) -> float:
        """Full-vocabulary logits per row (all-gathered from the TP shards when TP > 1), bf16, plus the sampler's
        own tensors: the one-pass kernel (rollout/triton_sample.py) reads them with one fp32 noise tensor; the
        top-k / top-p path (rollout/sampler.py) holds fp32 logits, scaled logits, log-probs, sorted values, int64
        indices, a drop mask, probabilities and their cumulative sum, then the filtered logits and the noise."""
        tp = self.r.rollout_tp
        logits = 2 + (2 / tp if tp > 1 else 0)
        return logits + (4 * 3 + 4 + 8 + 1 + 4 * 2 + 4 * 2 if self.r.sort_sampling else 4)

    # ------------------------------------------------------------------ transient (per phase)
    def _fsdp_working(self, shape: ModelShape, unshard_once: bool, backward: bool, frozen: bool = False) -> int:
        """Unsharded bf16 parameters during compute: all of them (unshard once), else the root (embedding and
        head) plus two blocks (the one computing and the one prefetched); plus a block's gradients in backward
        (none for a frozen LoRA base: its adapters' gradients are counted with the actor's)."""
        block = shape.layer_params
        grads = block * (2 + 4) if backward and not frozen else 0
        if unshard_once:
            return shape.num_params * 2 + grads
        root = shape.embed_params * (1 if shape.tied else 2) * 2
        return root + 2 * block * 2 + grads

    def _train_activations(self, shape: ModelShape, tokens: int, checkpointing: bool, offload: bool = False,
                           liger: bool = False, kept_layers: int = 0) -> int:
        """A layer's backward: the kept activations plus, with recompute, one layer's rebuilt graph, and its
        backward's own gradients. With the last `kept_layers` not recomputed, backward reaches them first, while
        everything the forward kept is alive, and frees their activations before the first rebuild, which is
        smaller: the kept activations and the gradients are the peak then."""
        rebuilt = shape.train_act_bytes_per_token_layer(liger) * tokens if checkpointing and not kept_layers else 0
        return self._kept_activations(shape, tokens, checkpointing, offload, liger, kept_layers) + rebuilt + \
            shape.layer_backward_bytes_per_token(liger) * tokens

    @staticmethod
    def _kept_activations(shape: ModelShape, tokens: int, checkpointing: bool, offload: bool,
                          liger: bool = False, kept_layers: int = 0) -> int:
        """What the forward leaves for backward: each recomputed layer's input with recompute (offloaded: the input
        being recomputed and the one copied back), every other layer's saved activations."""
        saved = shape.train_act_bytes_per_token_layer(liger) * tokens
        if checkpointing:
            recomputed = shape.layers - kept_layers
            return (2 if offload else recomputed) * tokens * shape.hidden * 2 + kept_layers * saved
        return shape.layers * saved

    def _logprob_head(self, rows: int, grad: bool, head_frozen: bool = False) -> int:
        """Fused chunked log-prob head (training/fused_logprob.py): hidden of the kept rows (and its gradient),
        one chunk of logits in bf16 and fp32 with its softmax (and its gradient in backward) — or, where its Triton
        kernels run, two bf16 chunks of KERNEL_CHUNK_BYTES; the larger of the two paths."""
        v, h = self.s.vocab, self.s.hidden
        chunk = min(rows, chunk_rows(v))
        kernel_chunks = 2 * min(rows, chunk_rows(v, kernels=True)) * v * 2
        if not grad:
            return rows * h * 2 + max(chunk * v * (2 + 4 + 4), kernel_chunks)
        # backward: bf16 logits, fp32 log-probs (turned into the logit grads in place), probabilities, the grads'
        # bf16 copy; the head weight's gradient summed in fp32 (on CUDA inside each chunk's GEMM; its bf16 copy when
        # returned, or a bf16 product per chunk elsewhere: 2 bytes either way) — not with LoRA: the head is frozen
        return 2 * rows * h * 2 + max(chunk * v * (2 + 4 + 4 + 2), kernel_chunks) + \
            (0 if head_frozen else v * h * (4 + 2))

    # ------------------------------------------------------------------ phases
    def gen(self, kv_blocks: int, block_size: int, rows: int, prefill_tokens: int) -> PhaseMemory:
        r, s = self.r, self.s
        kv = kv_blocks * self.kv_block_bytes(block_size)
        # no gradients in either scheme: every optimizer step ends with zero_grad(set_to_none=True)
        parts = self._actor(grads=False, params_on_gpu=not (r.hybrid and r.param_offload),
                            optim_on_gpu=not (r.hybrid and r.optimizer_offload))
        parts.update(self._others(ref_on_gpu=not r.ref_offload))
        tp = r.rollout_tp
        parts["engine weights"] = self.engine_weights()
        parts["kv cache"] = kv
        parts["sampling"] = rows * s.vocab * self._sampling_bytes_per_logit()
        mlp = 2 * 3 * s.token_mlp_width // tp + s.moe_dispatch_bytes_per_token
        parts["prefill activations"] = prefill_tokens * (2 * 4 * s.hidden + mlp)
        parts["cuda graphs"] = rows * (2 * 6 * s.hidden + mlp)
        return PhaseMemory("gen", parts)

    def log_prob(self, phase: str, micro_rows: int, seq_len: int, response_len: int, unshard_once: bool,
                 kv_bytes: int, tokens: int | None = None) -> PhaseMemory:
        """tokens: of one micro-batch (None: micro_rows x seq_len; fewer with shared prompts)."""
        r, s = self.r, self.s
        optim = not r.optimizer_offload  # offloaded optimizer state comes back only at the update's optimizer step
        parts = self._actor(grads=False, params_on_gpu=True, optim_on_gpu=optim)
        parts.update(self._others(ref_on_gpu=phase == "ref" or not r.ref_offload))
        parts.update(self._scheme_a_engine(kv_bytes))
        parts["unsharded params"] = self._fsdp_working(s, unshard_once, backward=False)
        parts["activations"] = (micro_rows * seq_len if tokens is None else tokens) * s.infer_act_bytes_per_token
        parts["log-prob head"] = self._logprob_head(micro_rows * response_len, grad=False)
        if r.lora_expert_bytes and phase != "ref":   # the reference runs with the adapters off: no rebuilt copies
            parts["expert LoRA copies"] = 2 * r.lora_expert_bytes   # a layer's update B·A and W + it, in its forward
        return PhaseMemory(phase, parts)

    def update_actor(self, micro_rows: int, seq_len: int, response_len: int, kv_bytes: int,
                     tokens: int | None = None) -> PhaseMemory:
        """tokens: of one micro-batch (None: micro_rows x seq_len; fewer with shared prompts). Where the hybrid engine
        offloads the AdamW state and the update has one optimizer step, the state comes back only for that step
        (FSDPUpdater.before_optimizer_step), when the activations are freed: the phase peaks at the larger of the
        forward/backward without it and the step with it."""
        s, r = self.s, self.r
        deferred = r.hybrid and r.optimizer_offload and r.optimizer_steps == 1
        parts = self._actor(grads=True, params_on_gpu=True, optim_on_gpu=not deferred)
        parts.update(self._others(ref_on_gpu=not r.ref_offload))
        parts.update(self._scheme_a_engine(kv_bytes))
        lora, tokens = bool(r.lora_params), micro_rows * seq_len if tokens is None else tokens
        router = tokens * s.router_loss_bytes_per_token(r.router_aux_loss, r.router_z_loss)  # kept whatever recomputes
        kept = self._kept_activations(s, tokens, r.gradient_checkpointing, r.activation_offload, r.liger,
                                      r.kept_layers) + router
        # The transient memory peaks at one of two moments that never overlap: the head's backward (everything the
        # forward kept, the final norm's input (fp32; bf16 with Liger) and output, the chunked head's buffers; no
        # block unsharded for backward yet) or a decoder layer's backward (the kept activations, one layer's rebuilt graph, a block's
        # unsharded gradients, and the head weight's bf16 gradient, which FSDP reduces only with the root's, after
        # the embedding's backward; none with LoRA's frozen head).
        head_moment = {"activations": kept + tokens * s.hidden * ((2 if r.liger else 4) + 2),
                       "log-prob head": self._logprob_head(micro_rows * response_len, grad=True, head_frozen=lora),
                       "unsharded params": self._fsdp_working(s, r.update_unshard_once, backward=False)}
        layer_moment = {"activations": self._train_activations(s, tokens, r.gradient_checkpointing,
                                                               r.activation_offload, r.liger, r.kept_layers) + router,
                        "log-prob head": 0 if lora else s.vocab * s.hidden * 2,
                        "unsharded params": self._fsdp_working(s, r.update_unshard_once, backward=True,
                                                               frozen=lora)}
        parts.update(max(head_moment, layer_moment, key=lambda m: sum(m.values())))
        step = self._optimizer_step(r.lora_params or s.num_params, r.master_bytes, r.shard)
        if r.lora_expert_bytes:
            parts["expert LoRA copies"] = self._expert_lora_copies(s)
        at_step = None
        if deferred:
            at_step = self._actor(grads=True, params_on_gpu=True, optim_on_gpu=True)
            at_step.update(self._others(ref_on_gpu=not r.ref_offload))
        return self._with_step("update_actor", parts, step, at_step)

    @staticmethod
    def _with_step(phase: str, parts: dict, step: int, at_step: dict | None) -> PhaseMemory:
        """An update's phase with its optimizer step's temporaries `step`: summed into the forward/backward's `parts`
        where the optimizer state stays on the GPU throughout (at_step None, the safe side); else the larger of those
        parts and the step's own moment `at_step` (what the step holds: state back, activations freed)."""
        if at_step is None:
            return PhaseMemory(phase, {**parts, "optimizer step": step})
        return PhaseMemory(phase, max(parts, {**at_step, "optimizer step": step}, key=lambda m: sum(m.values())))

    def _expert_lora_copies(self, s: ModelShape) -> int:
        """The update's rebuilt expert tensors (LoRA on experts): autograd keeps each MoE layer's W + scale·B·A for
        the experts' backward (tests/plan/test_moe_memory.py). Every MoE layer's copy without recompute, plus the
        layer at work's gradient of it; with recompute, those of the last layers that keep their activations (at
        most every MoE layer), plus two in the layer being rebuilt: B·A and W + B·A in its forward, the copy and its
        gradient in its backward."""
        r = self.r
        if not r.gradient_checkpointing:
            return (s.moe_layers + 1) * r.lora_expert_bytes
        return (min(r.kept_layers, s.moe_layers) + 2) * r.lora_expert_bytes

    def _optimizer_step(self, trained: int, master_bytes: int, shard: int) -> int:
        """Temporaries of the AdamW step beyond the state it updates (the step follows the last backward, whose
        activations are freed by then, so the larger of the two counts; summing them is the safe side)."""
        return 0 if self.r.fused_optimizer else trained * master_bytes // shard

    def critic_phase(self, phase: str, micro_rows: int, seq_len: int, unshard_once: bool,
                     kv_bytes: int, tokens: int | None = None) -> PhaseMemory:
        """tokens: of one micro-batch (None: micro_rows x seq_len; fewer with shared prompts). With the critic's
        optimizer offloaded and one optimizer step per update its state returns only for that step, as the actor's
        (update_actor): the update peaks at the larger of the forward/backward without it and the step with it."""
        r, c = self.r, self.r.critic
        train = phase == "update_critic"
        deferred = train and r.critic_optimizer_offload and r.critic_optimizer_steps == 1
        parts = self._actor(grads=False, params_on_gpu=True, optim_on_gpu=not r.optimizer_offload)
        parts.update(self._others(ref_on_gpu=not r.ref_offload, critic_grads=train, critic_on_gpu=True,
                                  critic_optim_on_gpu=False if deferred else None))
        parts.update(self._scheme_a_engine(kv_bytes))
        parts["unsharded params"] = self._fsdp_working(c, unshard_once and not train, backward=train)
        tokens = micro_rows * seq_len if tokens is None else tokens
        parts["activations"] = (self._train_activations(c, tokens, r.critic_gradient_checkpointing,
                                                        r.critic_activation_offload,
                                                        kept_layers=r.critic_kept_layers) if train
                                else tokens * c.infer_act_bytes_per_token)
        if not train:
            return PhaseMemory(phase, parts)
        at_step = None
        if deferred:
            at_step = self._actor(grads=False, params_on_gpu=True, optim_on_gpu=not r.optimizer_offload)
            at_step.update(self._others(ref_on_gpu=not r.ref_offload, critic_grads=True, critic_on_gpu=True))
            at_step.update(self._scheme_a_engine(kv_bytes))
        return self._with_step(phase, parts, self._optimizer_step(c.num_params, 4, r.critic_shard), at_step)

    def reward_model_phase(self, micro_rows: int, seq_len: int, unshard_once: bool, kv_bytes: int) -> PhaseMemory:
        """Scoring with the reward model: the actor as after a rollout (parameters back, optimizer state where the
        rollout left it), the reward model's shards on the GPU, and one no-grad micro-batch through it (the score
        head's output is one number a token)."""
        r, rm = self.r, self.r.reward_model
        parts = self._actor(grads=False, params_on_gpu=True, optim_on_gpu=not (r.hybrid and r.optimizer_offload))
        parts.update(self._others(ref_on_gpu=not r.ref_offload, rm_on_gpu=True))
        parts.update(self._scheme_a_engine(kv_bytes))
        parts["unsharded params"] = self._fsdp_working(rm, unshard_once, backward=False)
        parts["activations"] = micro_rows * seq_len * rm.infer_act_bytes_per_token
        return PhaseMemory("reward_model", parts)
