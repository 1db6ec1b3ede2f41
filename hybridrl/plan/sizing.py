"""What the role planners share (rollout_plan.py, actor_plan.py, critic_plan.py, reward_model_plan.py): the device
planned for, and `Sizing` — one run's config, shape, memory model and GPU budget, with the rules that pick a
pass's micro-batch size or token budget and the record of each automatic choice and each phase's predicted peak.

Automatic sizes: the largest micro-batch (a divisor of the per-GPU mini-batch for updates) whose tokens stay
within a throughput target (beyond it a GPU gains nothing and only memory grows) and whose predicted phase peak
fits `SAFETY` of the GPU. An explicit size keeps verl's meaning, and a plan whose predicted peak does not fit
is refused, naming the key and a value that fits.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from hybridrl.config.errors import ConfigError
from hybridrl.plan.host_memory import HOST_SAFETY
from hybridrl.plan.layout import Layout
from hybridrl.plan.memory import GiB, MemoryModel, PhaseMemory, Residency
from hybridrl.plan.model_shape import ModelShape
from hybridrl.training.fsdp import AUTO_UNSHARD_MAX_FRACTION

SAFETY = 0.9                    # fraction of a GPU's memory a phase may be planned to use
UPDATE_TOKENS_TARGET = 16384    # tokens per training micro-batch where an H200's GEMMs saturate
# A training micro-batch launches a fixed number of kernels per layer whatever its size, and the host needs about
# as long to launch them as a 1.5B's GPU needs for 16k tokens: on an H200 the 1.5B's update left the GPU idle 24%
# of the time at 16,384-token micro-batches and 5% at 32,768 (benchmarks/results/long_tail/update_ops.json). So on
# GPUs a micro-batch is given at least the work of 32k tokens of a 1.5B (training FLOPs 6 x params x tokens), up
# to MAX_UPDATE_TOKENS_TARGET for small models.
UPDATE_MICRO_FLOPS = 6 * 1.54e9 * 32768
MAX_UPDATE_TOKENS_TARGET = 65536
LOGPROB_TOKENS_TARGET = 32768   # tokens per no-grad log-prob micro-batch
MODEL = "actor_rollout_ref.model"
ACTOR_FSDP = "actor_rollout_ref.actor.fsdp_config"


@dataclass(frozen=True)
class DeviceSpec:
    type: str                   # "cuda" | "cpu"
    name: str
    total_bytes: int | None     # per GPU; None on CPU (no device memory to plan against)
    host_bytes: int | None = None   # host memory available on a GPU node when planned (host_memory.py); None:
                                    # unknown, the offloads' pinned host memory is not checked

    def __str__(self) -> str:
        if self.total_bytes is None:
            return f"{self.type} (no device memory model)"
        host = f", {self.host_bytes / GiB:.1f} GiB host memory available per node" if self.host_bytes else ""
        return f"{self.name}, {self.total_bytes / GiB:.1f} GiB per GPU{host}"


@dataclass(frozen=True)
class MicroBatching:
    """How one pass splits its per-GPU rows: `rows` per micro-batch, or (rows None) micro-batches of at most
    `max_tokens` tokens (use_dynamic_bsz); both None where the pass does not run. `unshard_once`: the pass gathers
    the sharded weights once for all its micro-batches (an update: once per mini-batch)."""
    rows: int | None = None
    max_tokens: int | None = None
    unshard_once: bool = False

    def __str__(self) -> str:
        if self.rows is not None:
            return f"{self.rows} rows"
        return f"<= {self.max_tokens} tokens" if self.max_tokens is not None else "-"


def is_auto(value) -> bool:
    return isinstance(value, str) and value == "auto"


def divisors_desc(n: int) -> list[int]:
    return sorted({d for i in range(1, int(math.isqrt(n)) + 1) if n % i == 0 for d in (i, n // i)}, reverse=True)


def shared_prompt_tokens(rows: int, n: int, prompt_len: int, response_len: int) -> int:
    """Tokens of a micro-batch of `rows` consecutive samples (each prompt's n samples adjacent) with each prompt
    once, at the longest lengths: a micro-batch of whole groups holds rows / n prompts, one inside a group one, any
    other at most rows // n + 2 (the window may start and end inside a group)."""
    prompts = rows // n if rows % n == 0 else 1 if n % rows == 0 else min(rows, rows // n + 2)
    return prompts * prompt_len + rows * response_len


def resolve_dynamic_bsz(value, micro, device_type: str, key: str, micro_key: str, choices: list[str]) -> bool:
    """`use_dynamic_bsz` (`key`): true / false as given; auto = token-budgeted micro-batches on GPUs where the
    pass's micro-batch size (`micro_key`) is left to the plan ('auto') or null, fixed rows where it is a number
    (verl's meaning of an explicit size) and on the CPU (the padded rows are the reference there)."""
    if value is True or value is False:
        return value
    if micro is None:
        return True
    on = is_auto(micro) and device_type != "cpu"
    choices.append(f"{key} = {str(on).lower()} (" + (
        "token-budgeted micro-batches at the step's actual lengths" if on else
        f"{micro_key} = {micro}" if not is_auto(micro) else "the CPU: fixed rows") + ")")
    return on


def resolve_remove_padding(value, dynamic: bool, sp: int) -> bool:
    """`use_remove_padding`: auto = packed where micro-batches are token-budgeted (a padded micro-batch of short
    rows would compute every row at the longest length) or split by Ulysses (which needs the packed row)."""
    return bool(value) if not is_auto(value) else bool(dynamic or sp > 1)


@dataclass
class Sizing:
    """One run's planning state, shared by the role planners in order: the resolved config (`get(dotted key)`), the
    layout, the device and its budget (SAFETY of its memory; None on CPU), the model's shape and what each GPU
    holds (`residency`, `memory`), the longest prompt and response; `choices` and `predicted` collect each
    automatic choice and each phase's peak (phase -> PhaseMemory) as the planners make them; `weighed`: the keys
    whose 'auto' the plan weighed both ways (a refusal does not tell the user to set them)."""
    get: Callable[[str], object]
    layout: Layout
    device: DeviceSpec
    shape: ModelShape
    residency: Residency
    memory: MemoryModel
    prompt_len: int
    response_len: int
    choices: list[str]
    predicted: dict[str, PhaseMemory]
    weighed: set[str] = field(default_factory=set)
    host_declined: str | None = None    # why the optimizer offload was left off for the node's host memory

    def reside(self, **changes) -> None:
        """Settle where state lives (an automatic offload): the residency and the memory model that counts it."""
        self.residency = replace(self.residency, **changes)
        self.memory = MemoryModel(self.shape, self.residency)

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.response_len

    @property
    def budget(self) -> float | None:
        return None if self.device.total_bytes is None else SAFETY * self.device.total_bytes

    def host_fits(self, pinned: PhaseMemory) -> bool:
        """Whether one rank's pinned host memory (host_memory.host_pinned), on every GPU of a node, fits the node;
        true where the host memory or the device is unknown."""
        if self.budget is None or not self.device.host_bytes:
            return True
        return pinned.total * self.layout.parallel.gpus_per_node <= HOST_SAFETY * self.device.host_bytes

    @property
    def update_tokens_target(self) -> int:
        """Tokens a training micro-batch aims for: UPDATE_TOKENS_TARGET, raised on GPUs to the power of two that
        gives it UPDATE_MICRO_FLOPS of work (at most MAX_UPDATE_TOKENS_TARGET) so the GPU's work hides the host's."""
        params = self.shape.active_params   # what one token runs through (an MoE's routed experts only)
        if self.device.type != "cuda" or params <= 0:
            return UPDATE_TOKENS_TARGET
        tokens = UPDATE_TOKENS_TARGET
        while tokens < MAX_UPDATE_TOKENS_TARGET and 6 * params * tokens < UPDATE_MICRO_FLOPS:
            tokens *= 2
        return tokens

    def micro_tokens(self, shared: bool) -> Callable[[int], int]:
        """rows -> tokens of a micro-batch, each prompt once with shared prompts."""
        if shared:
            return lambda rows: shared_prompt_tokens(rows, self.layout.n, self.prompt_len, self.response_len)
        return lambda rows: rows * self.seq_len

    def auto_unshard(self, model: ModelShape) -> bool:
        """fsdp.should_keep_unsharded's 'auto' rule, on the plan's GPU."""
        total = self.device.total_bytes
        return total is not None and model.num_params * 2 <= AUTO_UNSHARD_MAX_FRACTION * total

    def unshard(self, key: str, model: ModelShape) -> bool:
        value = self.get(key)
        return self.auto_unshard(model) if is_auto(value) else bool(value)

    def dynamic(self, key: str, micro_key: str) -> bool:
        return resolve_dynamic_bsz(self.get(key), self.get(micro_key), self.device.type, key, micro_key, self.choices)

    def fits_budget(self, peak: PhaseMemory) -> bool:
        return peak.total <= self.budget

    @property
    def budget_words(self) -> str:
        """The budget as the plan's messages name it."""
        return f"the device budget ({SAFETY:.0%} of {self.device.total_bytes / GiB:.1f} GiB)"

    def no_fit_hint(self, one: PhaseMemory) -> str:
        """What would let a pass that does not fit at a single row (or sequence) fit, as the keys to set: each only
        where it lowers that phase's predicted memory and is not already on, nor left to 'auto' (activation offload)
        or to an 'auto' the plan weighed both ways (`weighed`: optimizer offload); then more GPUs."""
        r, held, phase = self.residency, (lambda part: one.parts.get(part, 0) > 0), one.phase
        fixes = []
        if phase in ("update_actor", "update_critic"):
            model = MODEL if phase == "update_actor" else "critic.model"
            checkpointing, offload = ((r.gradient_checkpointing, r.activation_offload) if phase == "update_actor"
                                      else (r.critic_gradient_checkpointing, r.critic_activation_offload))
            offload_key = f"{model}.enable_activation_offload"
            offload_auto = is_auto(self.get(offload_key))
            if not checkpointing:
                fixes.append(f"gradient checkpointing ({model}.enable_gradient_checkpointing=true"
                             + ("; activation offload, left to auto, is then weighed too)" if offload_auto else ")"))
            if not offload and not offload_auto:   # auto: weighed by offload.py, or named beside checkpointing
                fixes.append(f"activation offload ({offload_key}=true"
                             + (", with checkpointing)" if not checkpointing else ")"))
        if held("actor params") and r.master_bytes == 4 and not r.lora_params:
            fixes.append(f"bf16 masters ({ACTOR_FSDP}.model_dtype=bf16)")
        optimizer_key = f"{ACTOR_FSDP}.optimizer_offload"
        if held("actor optimizer") and phase != "update_actor" and r.hybrid and optimizer_key not in self.weighed:
            fixes.append(f"optimizer offload ({optimizer_key}=true)")
        if held("ref params") and phase != "ref":
            fixes.append("the reference on the CPU between its passes (actor_rollout_ref.ref.fsdp_config.param_offload"
                         "=true)")
        critic_off = [k for part, k in (("critic params", "param_offload"), ("critic optimizer", "optimizer_offload"))
                      if held(part) and phase not in ("values", "update_critic")]
        if critic_off:
            fixes.append(" / ".join(f"critic.model.fsdp_config.{k}=true" for k in critic_off))
        if self.host_declined and held("actor optimizer"):
            fixes.append(f"more host memory per node (the optimizer offload was left off: {self.host_declined})")
        fixes.append("more GPUs (FSDP shards the training state over them)")
        return (f"it needs {one.total / GiB:.1f} GiB at 1 row ({one.describe()}): "
                + (f"{', '.join(fixes[:-1])} or " if len(fixes) > 1 else "") + fixes[-1])

    def over(self, key: str, value, peak: PhaseMemory) -> str:
        return (f"'{key}' = {value}: phase {peak.phase} is predicted to peak at {peak.total / GiB:.1f} GiB per GPU, "
                f"over {SAFETY:.0%} of {self.device.total_bytes / GiB:.1f} GiB; ")

    def pick(self, key: str, candidates: list[int], tokens_target: int, peak, seq_len: int | None = None,
             tokens=None) -> int:
        """`key`'s configured size, or the largest candidate within the token target that fits the budget;
        tokens(rows): a micro-batch's tokens (rows x seq_len if None)."""
        value, budget = self.get(key), self.budget
        seq_len = seq_len or self.seq_len
        tokens = tokens or (lambda rows: rows * seq_len)
        if not is_auto(value):
            if budget is not None and peak(value).total > budget:
                fit = next((d for d in candidates if peak(d).total <= budget), None)
                raise ConfigError([self.over(key, value, peak(value))
                                   + (f"set it to {fit} (or 'auto')" if fit else self.no_fit_hint(peak(1)))])
            return value
        within = [d for d in candidates if tokens(d) <= tokens_target] or [candidates[-1]]
        for d in within:
            if budget is None or peak(d).total <= budget:
                self.choices.append(f"{key} = {d} ({tokens(d)} tokens per micro-batch"
                                    + (f", predicted {peak(d).phase} peak {peak(d).total / GiB:.1f} GiB)"
                                       if budget is not None else ")"))
                return d
        raise ConfigError([f"'{key}' = auto: even 1 row per micro-batch is predicted to need "
                           f"{peak(1).total / GiB:.1f} GiB in phase {peak(1).phase}, over {SAFETY:.0%} of "
                           f"{self.device.total_bytes / GiB:.1f} GiB; " + self.no_fit_hint(peak(1))])

    def pick_tokens(self, key: str, tokens_target: int, peak, longest: int | None = None) -> int:
        """`key`'s configured token budget, or the throughput target raised to the longest sequence (`longest`,
        default prompt + response: a micro-batch must hold one), lowered while its predicted phase peak does not
        fit (never below that sequence)."""
        value, budget, longest = self.get(key), self.budget, longest or self.seq_len
        if not is_auto(value) and value < longest:
            raise ConfigError([f"'{key}' = {value} must be >= {longest} with dynamic batch size: a micro-batch must "
                               f"hold one sequence ({longest} tokens per GPU)"])
        if not is_auto(value):
            if budget is not None and peak(value).total > budget:
                raise ConfigError([self.over(key, value, peak(value))
                                   + f"lower it (at least {longest}) or set 'auto'"])
            return value
        tokens = max(tokens_target, longest)
        while budget is not None and tokens > longest and peak(tokens).total > budget:
            tokens = max(longest, tokens // 2)
        if budget is not None and peak(tokens).total > budget:
            raise ConfigError([f"'{key}' = auto: even one sequence of {longest} tokens is predicted to need "
                               f"{peak(tokens).total / GiB:.1f} GiB in phase {peak(tokens).phase}, over {SAFETY:.0%} "
                               f"of {self.device.total_bytes / GiB:.1f} GiB; " + self.no_fit_hint(peak(tokens))])
        # no peak quoted here: the recompute and offload choices made after this one change it (the table of
        # predicted peaks per phase has the final ones)
        self.choices.append(f"{key} = {tokens}" + ("" if tokens == max(tokens_target, longest) else
                                                   f" (lowered from {max(tokens_target, longest)} to fit memory)"))
        return tokens
