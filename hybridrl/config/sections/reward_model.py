"""The `reward_model` and `custom_reward_function` sections: how responses are scored."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from hybridrl.config.sections.base import Section
from hybridrl.config.sections.rules import Findings
from hybridrl.config.sections.values import Auto, RewardTruncation
from hybridrl.config.tokenizer_files import same_tokenizer

RM = "reward_model"


@dataclass(frozen=True)
class CustomRewardFunctionConfig(Section):
    """`custom_reward_function`."""

    path: str | None
    """a Python file with compute_score(data_source, solution_str, ground_truth, extra_info=None); an `async def`
    function is awaited"""
    name: str
    """the function's name in that file"""
    reward_kwargs: dict
    """keyword arguments added to every call of that function, over the call's own (verl's key:
    +custom_reward_function.reward_kwargs.bonus=0.5)"""


@dataclass(frozen=True)
class RewardModelConfig(Section):
    """`reward_model`."""

    enable: bool
    """score responses with a model (style picks which): its score is the reward at the last response token; with
    custom_reward_function the function gets it as rm_score and returns the combined score (docs/config.md, "Reward
    models")"""
    style: Literal["model", "judge"]
    """model (a sequence-classification reward model at model.path, colocated on the training GPUs) | judge (the policy
    itself judges through the rollout engine, prompted with judge.prompt_template)"""
    model: RewardModelWeightsConfig
    micro_batch_size: int | None
    """deprecated global form; use micro_batch_size_per_gpu"""
    micro_batch_size_per_gpu: Auto | int
    """sequences per reward-model forward per GPU, without use_dynamic_bsz; auto = the run plan's choice"""
    use_dynamic_bsz: Auto | bool
    """micro-batches by tokens instead of rows: the inputs sorted by length, each forward as many of them as fit
    forward_max_token_len_per_gpu counted at its longest (rows x longest: the padded batch it runs). auto = on on
    GPUs where micro_batch_size_per_gpu is auto (an explicit size keeps fixed rows), off on CPU"""
    forward_max_token_len_per_gpu: Auto | int
    """token budget of a forward with use_dynamic_bsz (at least the longest input: max_length, or prompt + response);
    auto = the run plan's choice"""
    max_length: int | None
    """reward-model input tokens at most; null = data.max_prompt_length + data.max_response_length"""
    truncation: RewardTruncation
    """an input over max_length: left (drop its head, keep the end where the score is read) | right | error; cut inputs
    are counted in reward_model/truncated"""
    judge: JudgeConfig
    reward_manager: Literal["naive", "batch"]
    """naive (per sample) | batch; verl's dapo is read as naive (the overlong buffer works with either)"""
    timeout_s: float | None
    """per-sample scorer time limit; over it the score is 0 and counted; null = no limit (scored in-process)"""
    scorer_workers: Auto | int
    """worker processes scoring a step's samples at once (naive manager with a timeout_s; verl's prime manager scores
    in parallel too); auto = the driver's CPUs, at most 16"""
    launch_reward_fn_async: bool
    """the reward function scores the step's samples in a driver thread while the old-log-prob, reference and value
    passes run, joined before the advantages (timing_s/reward_wait: what the step still waited); not with dynamic
    sampling, the KL in the reward or partial rollouts, which read the scores sooner"""
    max_error_fraction: float | None
    """stop the run once this share of the samples of the last error_window_steps failed to score (raised, non-finite or
    non-number score, timeout, no ground truth: each scored 0 and counted in reward/errors, reward/timeouts); 1.0 = only
    when all did; null = never"""
    error_window_steps: int
    """steps the max_error_fraction share is taken over"""
    sandbox: SandboxConfig
    overlong_buffer: OverlongBufferConfig

    def check_sizes(self, found: Findings) -> None:
        found.positive(self, RM, ("error_window_steps",))

    def input_limit(self, data) -> int:
        """The longest input the reward model scores: max_length, else prompt + response."""
        return self.max_length or data.max_prompt_length + data.max_response_length

    def check(self, cfg, found: Findings) -> None:
        """Limits and the scorers' sandbox always; the model's or the judge's keys with `enable` (none is read
        otherwise); the overlong buffer with its own `enable`."""
        from hybridrl.tools.sandbox import parse_required_layers

        if self.timeout_s is not None and self.timeout_s <= 0:
            found.errors.append(f"'{RM}.timeout_s' must be > 0 or null (no limit), got {self.timeout_s}")
        if self.scorer_workers != "auto" and self.scorer_workers < 1:
            found.errors.append(f"'{RM}.scorer_workers' must be auto or >= 1, got {self.scorer_workers}")
        if self.launch_reward_fn_async:
            sooner = [key for key, on in (("algorithm.filter_groups.enable", cfg.algorithm.filter_groups.enable),
                                          ("algorithm.use_kl_in_reward", cfg.algorithm.use_kl_in_reward),
                                          ("actor_rollout_ref.rollout.partial_rollout.enable",
                                           cfg.actor_rollout_ref.rollout.partial_rollout.enable),
                                          ("actor_rollout_ref.actor.early_update",
                                           cfg.actor_rollout_ref.actor.early_update is True)) if on]
            if sooner:
                found.errors.append(f"'{RM}.launch_reward_fn_async' = true scores beside the passes after the rollout, "
                                    f"but '{sooner[0]}' = true needs the scores before them: set one of the two off")
        if self.max_error_fraction is not None and not 0 < self.max_error_fraction <= 1:
            found.errors.append(f"'{RM}.max_error_fraction' must be in (0, 1] or null (never stop), got "
                                f"{self.max_error_fraction}")
        try:
            parse_required_layers(self.sandbox.required_layers, f"{RM}.sandbox.required_layers")
        except ValueError as e:
            found.errors.append(str(e))
        if self.enable:
            found.errors += self.judge.errors(cfg.data) if self.style == "judge" else self._model_errors(cfg)
        self.overlong_buffer.check(cfg.data.max_response_length, found)

    def _model_errors(self, cfg) -> list[str]:
        errors = []
        path = self.model.path
        if path is None:
            errors.append(f"'{RM}.model.path' is null: with {RM}.enable=true and style=model it must name a reward "
                          "model directory (an AutoModelForSequenceClassification checkpoint with num_labels=1)")
        micro = self.micro_batch_size_per_gpu
        if micro != "auto" and not (isinstance(micro, int) and micro > 0):
            errors.append(f"'{RM}.micro_batch_size_per_gpu' = {micro!r} must be 'auto' or a positive integer")
        if self.max_length is not None and self.max_length <= 0:
            errors.append(f"'{RM}.max_length' = {self.max_length} must be > 0 or null (prompt + response length)")
        budget, longest = self.forward_max_token_len_per_gpu, self.input_limit(cfg.data)
        if budget != "auto" and not (isinstance(budget, int) and budget >= longest):
            errors.append(f"'{RM}.forward_max_token_len_per_gpu' = {budget!r} must be 'auto' or an integer >= the "
                          f"longest reward-model input, {longest} tokens ({RM}.max_length, else max_prompt_length + "
                          "max_response_length): a forward holds at least one input")
        fsdp, world = self.model.fsdp_config.fsdp_size, cfg.trainer.world_size
        if fsdp != -1 and (fsdp <= 0 or world % fsdp):
            errors.append(f"'{RM}.model.fsdp_config.fsdp_size' = {fsdp} must be -1 (all ranks) or a positive divisor "
                          f"of the world size {world}")
        input_tok = self.model.input_tokenizer
        policy_tok = cfg.data.tokenizer or cfg.actor_rollout_ref.model.path
        if path is not None and not os.path.isdir(os.path.expanduser(path)):
            return errors + [f"'{RM}.model.path' = {path!r} is not a directory (a HF reward model directory: "
                             "config.json, weights, tokenizer)"]
        if input_tok is not None and not cfg.data.return_raw_chat:
            errors.append(f"'{RM}.model.input_tokenizer' = {input_tok!r} re-renders each chat with the reward model's "
                          "template, which needs the chat itself: set 'data.return_raw_chat' = true")
        if input_tok is not None and not same_tokenizer(input_tok, policy_tok):
            errors.append(f"'{RM}.model.input_tokenizer' = {input_tok!r} must be the policy's tokenizer {policy_tok!r} "
                          "(data.tokenizer, else actor_rollout_ref.model.path): it decodes the policy's responses")
        if input_tok is None and path is not None:
            differs = ("tokenizer" if not same_tokenizer(path, policy_tok) else
                       "chat template" if chat_template(path) != chat_template(policy_tok) else None)
            if differs:
                errors.append(f"'{RM}.model.input_tokenizer' is null, so the reward model at {path!r} would read the "
                              f"policy's token ids, but its {differs} differs from the policy's ({policy_tok!r}): set "
                              f"{RM}.model.input_tokenizer to the policy's tokenizer path (and "
                              "data.return_raw_chat=true) to re-render each chat with the reward model's own "
                              "tokenizer and template")
        return errors


def chat_template(path: str) -> str | None:
    """The chat template a HF tokenizer directory holds (chat_template.jinja, else tokenizer_config.json's)."""
    where = Path(os.path.expanduser(path))
    if (where / "chat_template.jinja").is_file():
        return (where / "chat_template.jinja").read_text()
    config = where / "tokenizer_config.json"
    return json.loads(config.read_text()).get("chat_template") if config.is_file() else None


@dataclass(frozen=True)
class OverlongBufferConfig(Section):
    """`reward_model.overlong_buffer`."""

    enable: bool
    """DAPO's soft overlong punishment, added to every reward (training and validation)"""
    len: int
    """buffer B in tokens, in (0, data.max_response_length]: responses longer than max_response_length - B get a penalty
    growing linearly with the excess"""
    penalty_factor: float
    """the penalty at max_response_length tokens (it is -penalty_factor there)"""
    log: bool
    """also put verl's overlong_reward and overlong in the reward extra info (validation metrics)"""

    def check(self, max_response_length: int, found: Findings) -> None:
        ob = f"{RM}.overlong_buffer"
        if not self.enable:
            return
        if not 0 < self.len <= max_response_length:
            found.errors.append(f"'{ob}.len' = {self.len} must be in (0, data.max_response_length = "
                                f"{max_response_length}]")
        if self.penalty_factor < 0:
            found.errors.append(f"'{ob}.penalty_factor' = {self.penalty_factor} must be >= 0")


@dataclass(frozen=True)
class SandboxConfig(Section):
    """`reward_model.sandbox`."""

    required_layers: list[str] | str
    """sandbox layers the code rewards (code_exec, verl's code sources) must run under, or it refuses to start (a
    start-up error naming the layers this machine lacks and why): names from net_namespace, mount_namespace,
    uid_dropped, user_namespace, capabilities_dropped, no_new_privs, landlock, seccomp, or all (every one but
    uid_dropped/user_namespace); [] = run with whatever the machine allows (logged at start-up, counted per layer in
    sandbox/layer/NAME)"""


@dataclass(frozen=True)
class JudgeConfig(Section):
    """`reward_model.judge`."""

    prompt_template: str
    """user message the policy judges; placeholders {response} (required), {prompt} (the last user message; needs
    data.return_raw_chat=true), {ground_truth}"""
    score_pattern: str
    """regex with one group read as the score (its last match in the judge's output); no match = scored 0 and counted in
    reward_model/judge_failures"""
    max_tokens: int
    """tokens the judge may generate (<= data.max_response_length)"""

    def errors(self, data) -> list[str]:
        """The template's placeholders, the score pattern, and a generation budget the engine can give
        (`data`: the data section)."""
        from hybridrl.rewards.judge import judge_template_errors, score_pattern_errors, template_fields

        errors = judge_template_errors(self.prompt_template) + score_pattern_errors(self.score_pattern)
        if not errors and "prompt" in template_fields(self.prompt_template) and not data.return_raw_chat:
            errors.append(f"'{RM}.judge.prompt_template' uses {{prompt}} (the sample's last user message), which "
                          "needs the chat itself: set 'data.return_raw_chat' = true")
        if not 0 < self.max_tokens <= data.max_response_length:
            errors.append(f"'{RM}.judge.max_tokens' = {self.max_tokens} must be in [1, data.max_response_length = "
                          f"{data.max_response_length}] (the engine's responses are at most that long)")
        return errors


@dataclass(frozen=True)
class RewardModelWeightsConfig(Section):
    """`reward_model.model`."""

    path: str | None
    """reward model directory: an AutoModelForSequenceClassification checkpoint with num_labels=1 and its tokenizer"""
    input_tokenizer: str | None
    """the policy's tokenizer (e.g. ${actor_rollout_ref.model.path}): responses are decoded with it and prompt +
    response re-rendered with the reward model's own chat template (needs data.return_raw_chat=true); null = the reward
    model reads the policy's token ids, so its tokenizer must be the policy's (verl's default: the policy's
    path, which needs data.return_raw_chat=true)"""
    trust_remote_code: bool
    """passed to transformers' from_pretrained"""
    override_config: dict
    """free dict merged into the reward model's HF config"""
    fsdp_config: RewardModelFSDPConfig


@dataclass(frozen=True)
class RewardModelFSDPConfig(Section):
    """`reward_model.model.fsdp_config`."""

    param_offload: bool
    """shards on CPU except during the reward pass (false: resident on the GPUs in every phase; verl's default:
    false)"""
    fsdp_size: int
    """-1 = shard over all ranks; smaller = HSDP"""
