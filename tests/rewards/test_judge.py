"""LLM-as-judge: template and pattern checks, score parsing, and one judging call against a stand-in rollout group
that answers with fixed verdicts (unparsable and overlong ones scored 0 and counted)."""

import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoTokenizer

from hybridrl.protocol import DataProto
from hybridrl.rewards.judge import (
    JudgeRewardModel,
    judge_template_errors,
    parse_judge_score,
    score_pattern_errors,
)

PATTERN = r"Score:\s*(-?\d+(?:\.\d+)?)"


@pytest.mark.parametrize("text, want", [
    ("Score: 7", 7.0), ("meh. Score: 3\nOn reflection Score: -2.5", -2.5), ("score: 7", None), ("Score: ", None),
    ("nothing here", None),
])
def test_parse_takes_the_last_match(text, want):
    assert parse_judge_score(text, PATTERN) == want


def test_parse_refuses_non_finite_and_non_numbers():
    loose = r"Score:\s*(\S+)"
    assert parse_judge_score("Score: 1e999", loose) is None and parse_judge_score("Score: nan", loose) is None
    assert parse_judge_score("Score: high", loose) is None and parse_judge_score("Score: 2e1", loose) == 20.0


def test_template_and_pattern_errors_name_the_key_and_rule():
    assert judge_template_errors("Q: {prompt} A: {response} ({ground_truth})") == []
    assert "has no {response}" in judge_template_errors("Q: {prompt}")[0]
    assert "placeholders are" in judge_template_errors("{response} {answer}")[0]
    assert "not a format string" in judge_template_errors("{response")[0]
    assert all("reward_model.judge.prompt_template" in e for e in judge_template_errors("{x"))
    assert "needs exactly one" in score_pattern_errors(r"(\d+) of (\d+)")[0]
    assert "not a regular expression" in score_pattern_errors("(")[0]


class FixedVerdicts:
    """A rollout worker group whose judge answers are given in advance; records what it was asked."""

    def __init__(self, tok, verdicts):
        self.tok, self.verdicts, self.calls = tok, verdicts, []

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        self.calls.append(prompts)
        ids = [self.tok.encode(v) + [self.tok.eos_token_id] for v in self.verdicts[:len(prompts)]]
        width = max(map(len, ids))
        return DataProto({"responses": torch.tensor([r + [0] * (width - len(r)) for r in ids]),
                          "response_mask": torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in ids])},
                         meta_info={"metrics": {"timing_s/gen_engine": [0.1]}})


def config(max_prompt_length=64, max_response_length=16, max_tokens=8):
    return OmegaConf.create({
        "data": {"max_prompt_length": max_prompt_length, "max_response_length": max_response_length},
        "reward_model": {"judge": {"prompt_template": "Q: {prompt}\nA: {response}\nTruth: {ground_truth}",
                                   "score_pattern": PATTERN, "max_tokens": max_tokens}}})


def batch(tok, responses):
    mask = torch.tensor([[1] * len(r) + [0] * (6 - len(r)) for r in responses])
    return DataProto({"responses": torch.tensor([r + [0] * (6 - len(r)) for r in responses]), "response_mask": mask},
                     {"raw_prompt": [[{"role": "user", "content": f"What is {i} + 1?"}] for i in range(len(responses))],
                      "reward_model": [{"ground_truth": str(i + 1)} for i in range(len(responses))]})


def test_judge_scores_parsable_verdicts_and_counts_the_rest(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    responses = [tok.encode("1"), tok.encode("3"), tok.encode("33") + [tok.eos_token_id]]
    wg = FixedVerdicts(tok, ["Score: 9", "I cannot say", "Score: 4.5"])
    out = JudgeRewardModel(wg, tok, config()).compute_rm_score(batch(tok, responses))
    sent = wg.calls[0]
    assert sent.meta_info["do_sample"] is False and sent.meta_info["n"] == 1 and sent.meta_info["max_tokens"] == 8
    # the judge reads the rendered template as a user turn of the policy's chat template
    want = tok.apply_chat_template([{"role": "user", "content": "Q: What is 2 + 1?\nA: 33\nTruth: 3"}],
                                   add_generation_prompt=True, tokenize=False)
    assert list(sent.non_tensor_batch["raw_prompt_ids"][2]) == tok.encode(want, add_special_tokens=False)
    mask = sent.batch["attention_mask"][2].bool()
    assert sent.batch["input_ids"][2][mask].tolist() == tok.encode(want, add_special_tokens=False)
    scores = out.batch["rm_scores"]
    assert scores[0, len(responses[0]) - 1] == 9.0 and scores[2, len(responses[2]) - 1] == 4.5
    assert scores.abs().sum() == 13.5  # the unparsable verdict scores 0
    assert out.meta_info["metrics"] == {"reward_model/judge_failures": [1.0], "reward_model/judge_overlong": [0.0]}


def test_a_judge_prompt_too_long_for_the_engine_is_not_sent(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    responses = [tok.encode("1"), tok.encode("2 + 1 = 3, as 2 and 1 make 3")[:6]]
    cfg = config()
    limit = len(JudgeRewardModel(FixedVerdicts(tok, []), tok, cfg).judge_prompts(batch(tok, responses))[0])
    # prompt + response budget = the shorter judge prompt + max_tokens: the longer one cannot fit
    cfg = config(max_prompt_length=limit + 8 - 16, max_response_length=16, max_tokens=8)
    wg = FixedVerdicts(tok, ["Score: 2"])
    out = JudgeRewardModel(wg, tok, cfg).compute_rm_score(batch(tok, responses))
    assert len(wg.calls[0]) == 1
    assert out.batch["rm_scores"].sum() == 2.0
    assert out.meta_info["metrics"] == {"reward_model/judge_failures": [1.0], "reward_model/judge_overlong": [1.0]}
