"""LLM-as-judge rewards (`reward_model.enable=true`, `reward_model.style=judge`): the policy itself, through the
rollout engine, reads each response and writes a verdict from which a score is parsed.

Choices:
- The judge is the policy being trained (no second model in memory): its prompt is `judge.prompt_template` with
  {response} (the decoded response, special tokens skipped), {prompt} (the last user message of the sample's
  chat, from data.return_raw_chat) and {ground_truth}, sent as one user message through the policy's chat
  template. It generates greedily (n=1, at most `judge.max_tokens` tokens), so a verdict is reproducible.
- The score is the last match of `judge.score_pattern`'s one group in the verdict, as a float. No match, a
  non-finite number, or a judge prompt too long for the engine (prompt + max_tokens over
  data.max_prompt_length + data.max_response_length: not sent) scores 0 and is counted in
  `reward_model/judge_failures` (the overlong ones also in `reward_model/judge_overlong`); the reward error
  guard counts them as failed samples.
- Its output has the reward-model worker's shape: `rm_scores` [B, R], the score at the last valid response token
  (rewards/token_level.py), so the trainer and the reward manager treat both styles alike.
"""

from __future__ import annotations

import math
import re
import string

import torch

from hybridrl.protocol import DataProto
from hybridrl.rewards.token_level import ground_truths, last_user_message, place_at_last_token

__all__ = ["JudgeRewardModel", "judge_template_errors", "parse_judge_score", "render_judge_prompt",
           "score_pattern_errors", "template_fields"]

TEMPLATE_FIELDS = ("prompt", "response", "ground_truth")


def template_fields(template: str) -> list[str]:
    """The placeholders of a judge template; ValueError when it is not a format string."""
    return [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]


def judge_template_errors(template: str) -> list[str]:
    """What is wrong with `reward_model.judge.prompt_template` (empty list: usable)."""
    key = "reward_model.judge.prompt_template"
    try:
        fields = template_fields(template)
    except ValueError as e:
        return [f"'{key}' = {template!r} is not a format string ({e}); write a literal brace as {{{{ or }}}}"]
    unknown = sorted({f for f in fields if f not in TEMPLATE_FIELDS})
    errors = []
    if unknown:
        errors.append(f"'{key}' uses {unknown}: the placeholders are {{prompt}}, {{response}} and {{ground_truth}}")
    if "response" not in fields:
        errors.append(f"'{key}' = {template!r} has no {{response}}: the judge must see the response it scores")
    return errors


def score_pattern_errors(pattern: str) -> list[str]:
    key = "reward_model.judge.score_pattern"
    try:
        groups = re.compile(pattern).groups
    except re.error as e:
        return [f"'{key}' = {pattern!r} is not a regular expression: {e}"]
    if groups != 1:
        return [f"'{key}' = {pattern!r} has {groups} groups; it needs exactly one, the score"]
    return []


def render_judge_prompt(template: str, prompt: str, response: str, ground_truth) -> str:
    return template.format(prompt=prompt, response=response, ground_truth="" if ground_truth is None else ground_truth)


def parse_judge_score(text: str, pattern: str | re.Pattern) -> float | None:
    """The last match's group as a float; None when nothing matches or the number is not finite."""
    matches = re.findall(pattern, text)
    if not matches:
        return None
    try:
        score = float(matches[-1])
    except ValueError:
        return None
    return score if math.isfinite(score) else None


class JudgeRewardModel:
    """Scores a batch by asking the policy (`actor_rollout_wg.generate_sequences`) to judge each response.
    `compute_rm_score(batch)` returns a DataProto with `rm_scores` and `meta_info['metrics']`, like the
    reward-model worker group."""

    def __init__(self, actor_rollout_wg, tokenizer, config):
        judge = config.reward_model.judge
        errors = judge_template_errors(judge.prompt_template) + score_pattern_errors(judge.score_pattern)
        if errors:
            raise ValueError("; ".join(errors))
        self.wg, self.tokenizer = actor_rollout_wg, tokenizer
        self.template, self.pattern = str(judge.prompt_template), re.compile(judge.score_pattern)
        self.max_tokens = int(judge.max_tokens)
        self.max_prompt_tokens = config.data.max_prompt_length + config.data.max_response_length - self.max_tokens

    def judge_prompts(self, batch: DataProto) -> list[list[int]]:
        """Token ids of each sample's judge prompt (the policy's chat template, generation prompt added)."""
        responses, mask = batch.batch["responses"], batch.batch["response_mask"].bool()
        raw = batch.non_tensor_batch.get("raw_prompt")
        truths = ground_truths(batch.non_tensor_batch, len(batch))
        out = []
        for i in range(len(batch)):
            response = self.tokenizer.decode(responses[i][mask[i]].tolist(), skip_special_tokens=True)
            prompt = last_user_message(raw[i]) if raw is not None else ""
            text = render_judge_prompt(self.template, prompt, response, truths[i])
            chat = self.tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                      add_generation_prompt=True, tokenize=False)
            out.append(list(self.tokenizer.encode(chat, add_special_tokens=False)))
        return out

    def compute_rm_score(self, batch: DataProto) -> DataProto:
        prompts = self.judge_prompts(batch)
        sendable = [i for i, p in enumerate(prompts) if 0 < len(p) <= self.max_prompt_tokens]
        scores = torch.zeros(len(batch), dtype=torch.float32)
        parsed = 0
        if sendable:
            out = self.wg.generate_sequences(self._gen_batch([prompts[i] for i in sendable]))
            out.meta_info.pop("metrics", None)  # the engine's own (the reward phase is timed by the trainer)
            verdicts = self.tokenizer.batch_decode(
                [r[m.bool()].tolist() for r, m in zip(out.batch["responses"], out.batch["response_mask"])],
                skip_special_tokens=True)
            for i, verdict in zip(sendable, verdicts):
                score = parse_judge_score(verdict, self.pattern)
                if score is not None:
                    scores[i], parsed = score, parsed + 1
        rm_scores, _ = place_at_last_token(scores, batch.batch["response_mask"])
        stats = {"reward_model/judge_failures": float(len(batch) - parsed),
                 "reward_model/judge_overlong": float(len(batch) - len(sendable))}
        return DataProto({"rm_scores": rm_scores}, meta_info={"metrics": {k: [v] for k, v in stats.items()}})

    def _gen_batch(self, prompts: list[list[int]]) -> DataProto:
        """Left-padded judge prompts with greedy single-sample meta_info for generate_sequences."""
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        width = max(map(len, prompts))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], dtype=torch.long)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], dtype=torch.long)
        tensors = {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}
        meta = {"eos_token_id": self.tokenizer.eos_token_id, "pad_token_id": pad, "do_sample": False, "n": 1,
                "max_tokens": self.max_tokens}
        return DataProto(tensors, {"raw_prompt_ids": prompts}, meta)
