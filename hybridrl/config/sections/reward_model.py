"""The `reward_model` and `custom_reward_function` sections: how responses are scored."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hybridrl.config.sections.base import Section
from hybridrl.config.sections.values import Auto, Truncation


@dataclass(frozen=True)
class CustomRewardFunctionConfig(Section):
    """`custom_reward_function`."""

    path: str | None
    """a Python file with compute_score(data_source, solution_str, ground_truth, extra_info=None)"""
    name: str
    """the function's name in that file"""


@dataclass(frozen=True)
class RewardModelConfig(Section):
    """`reward_model`."""

    enable: bool
    """score responses with a model (style picks which): its score is the reward at the last response token; with custom_reward_function the function gets it as rm_score and returns the combined score (docs/config.md, "Reward models")"""
    style: Literal["model", "judge"]
    """model (a sequence-classification reward model at model.path, colocated on the training GPUs) | judge (the policy itself judges through the rollout engine, prompted with judge.prompt_template)"""
    model: RewardModelWeightsConfig
    micro_batch_size: int | None
    """deprecated global form; use micro_batch_size_per_gpu"""
    micro_batch_size_per_gpu: Auto | int
    """sequences per reward-model forward per GPU; auto = the run plan's choice"""
    max_length: int | None
    """reward-model input tokens at most; null = data.max_prompt_length + data.max_response_length"""
    truncation: Truncation
    """an input over max_length: left (drop its head, keep the end where the score is read) | right | error; cut inputs are counted in reward_model/truncated"""
    judge: JudgeConfig
    reward_manager: Literal["naive", "batch"]
    """naive (per sample) | batch; verl's dapo is read as naive (the overlong buffer works with either)"""
    timeout_s: float | None
    """per-sample scorer time limit; over it the score is 0 and counted; null = no limit (scored in-process)"""
    max_error_fraction: float | None
    """stop the run once this share of the samples of the last error_window_steps failed to score (raised, non-finite or non-number score, timeout, no ground truth: each scored 0 and counted in reward/errors, reward/timeouts); 1.0 = only when all did; null = never"""
    error_window_steps: int
    """steps the max_error_fraction share is taken over"""
    sandbox: SandboxConfig
    overlong_buffer: OverlongBufferConfig


@dataclass(frozen=True)
class OverlongBufferConfig(Section):
    """`reward_model.overlong_buffer`."""

    enable: bool
    """DAPO's soft overlong punishment, added to every reward (training and validation)"""
    len: int
    """buffer B in tokens, in (0, data.max_response_length]: responses longer than max_response_length - B get a penalty growing linearly with the excess"""
    penalty_factor: float
    """the penalty at max_response_length tokens (it is -penalty_factor there)"""
    log: bool
    """also put verl's overlong_reward and overlong in the reward extra info (validation metrics)"""


@dataclass(frozen=True)
class SandboxConfig(Section):
    """`reward_model.sandbox`."""

    required_layers: list[str] | str
    """sandbox layers the code_exec reward must run under, or it refuses to start (a start-up error naming the layers this machine lacks and why): names from net_namespace, mount_namespace, uid_dropped, user_namespace, capabilities_dropped, no_new_privs, landlock, seccomp, or all (every one but uid_dropped/user_namespace); [] = run with whatever the machine allows (logged at start-up, counted per layer in sandbox/layer/NAME)"""


@dataclass(frozen=True)
class JudgeConfig(Section):
    """`reward_model.judge`."""

    prompt_template: str
    """user message the policy judges; placeholders {response} (required), {prompt} (the last user message; needs data.return_raw_chat=true), {ground_truth}"""
    score_pattern: str
    """regex with one group read as the score (its last match in the judge's output); no match = scored 0 and counted in reward_model/judge_failures"""
    max_tokens: int
    """tokens the judge may generate (<= data.max_response_length)"""


@dataclass(frozen=True)
class RewardModelWeightsConfig(Section):
    """`reward_model.model`."""

    path: str | None
    """reward model directory: an AutoModelForSequenceClassification checkpoint with num_labels=1 and its tokenizer"""
    input_tokenizer: str | None
    """the policy's tokenizer (e.g. ${actor_rollout_ref.model.path}): responses are decoded with it and prompt + response re-rendered with the reward model's own chat template (needs data.return_raw_chat=true); null = the reward model reads the policy's token ids, so its tokenizer must be the policy's"""
    trust_remote_code: bool
    """passed to transformers' from_pretrained"""
    override_config: dict
    """free dict merged into the reward model's HF config"""
    fsdp_config: RewardModelFSDPConfig


@dataclass(frozen=True)
class RewardModelFSDPConfig(Section):
    """`reward_model.model.fsdp_config`."""

    param_offload: bool
    """shards on CPU except during the reward pass (false: resident on the GPUs in every phase)"""
    fsdp_size: int
    """-1 = shard over all ranks; smaller = HSDP"""
