"""SamplingParams and the output types of `generate`, shaped like vLLM's so adapters stay thin.

Choices: greedy is `temperature == 0` (or `do_sample=False`, verl's switch); `top_k=-1` / `top_p=1.0`
mean off; `seed` seeds one torch.Generator per `generate` call, so the same seed with the same batch
gives the same outputs. Invalid values raise ValueError naming the field, the value and the rule.
Partial rollouts: `token_budget` caps the tokens a sequence samples in one `generate` call; one that reaches it
unfinished ends the call with finish_reason BUDGET, and a later call may go on from it (a `Continuation`: the
prompt, the tokens so far and their log-probs; `max_tokens` counts those tokens too).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 16
    do_sample: bool = True
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    logprobs: int | None = 0  # log-prob of each sampled token is always returned; kept for vLLM parity
    seed: int | None = None
    token_budget: int | None = None  # new tokens per sequence in this call at most (partial rollouts); None = off

    def __post_init__(self):
        rules = [
            ("n", self.n, self.n >= 1, "must be >= 1"),
            ("temperature", self.temperature, self.temperature >= 0, "must be >= 0"),
            ("top_p", self.top_p, 0 < self.top_p <= 1, "must be in (0, 1]"),
            ("top_k", self.top_k, self.top_k == -1 or self.top_k >= 1, "must be -1 (off) or >= 1"),
            ("max_tokens", self.max_tokens, self.max_tokens >= 1, "must be >= 1"),
            ("token_budget", self.token_budget, self.token_budget is None or self.token_budget >= 1,
             "must be None (off) or >= 1"),
        ]
        for name, value, ok, rule in rules:
            if not ok:
                raise ValueError(f"SamplingParams.{name}={value!r} {rule}")
        self.stop_token_ids = list(self.stop_token_ids or [])

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or not self.do_sample


BUDGET = "budget"  # finish_reason of a sequence stopped unfinished by SamplingParams.token_budget


@dataclass
class Continuation:
    """A sample to go on from: its prompt, the tokens sampled so far and their log-probs (partial rollouts)."""
    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]


@dataclass
class CompletionOutput:
    index: int
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (eos / stop token), "length" (max_tokens / max_model_len) or BUDGET (unfinished)
    response_mask: list[int] | None = None  # multi-turn: 1 = sampled by the model, 0 = appended (tool messages)
    turn_stats: dict | None = None  # multi-turn: the agent's per-trajectory counts (turns, tool calls, ...)
    routed_experts: object = None   # record_routed_experts: [prompt + completion tokens, MoE layers, k] expert ids
                                    # (torch, on CPU); the last token's row (never run) holds moe.not_routed(E)


@dataclass
class RequestOutput:
    request_id: int
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
