"""Sequence-classification reward model: scores against HF's own forward, its inputs (policy ids or the chat
re-rendered with the reward model's template), the token-level placement and how the reward manager uses it."""

import shutil

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from hybridrl.protocol import DataProto
from hybridrl.rewards.reward_manager import RewardManager
from hybridrl.rewards.rm_inputs import rm_token_lists
from hybridrl.rewards.token_level import place_at_last_token
from hybridrl.training.reward_model import score_batch, score_sequences

RM_TEMPLATE = "{% for m in messages %}### {{ m['role'] }}: {{ m['content'] }}\n{% endfor %}### end"


@pytest.fixture(scope="module")
def rm(tiny_reward_model_dir):
    return AutoModelForSequenceClassification.from_pretrained(tiny_reward_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tok(tiny_reward_model_dir):
    return AutoTokenizer.from_pretrained(tiny_reward_model_dir)


def hf_last_token_scores(rm, sequences):
    """HF's forward, one unpadded sequence at a time, read at the last token (pad_token_id None: no pad search)."""
    pad = rm.config.pad_token_id
    rm.config.pad_token_id = None
    try:
        with torch.no_grad():
            return torch.stack([rm(input_ids=torch.tensor([s])).logits[0, 0] for s in sequences])
    finally:
        rm.config.pad_token_id = pad


def test_scores_equal_hf_forward_with_micro_batches_and_either_padding(rm, tok):
    texts = ["What is 3 + 4?", "7", "The answer is 12 because 5 + 7 = 12.", "no", "2 * 3 = 6, so #### 6"]
    # the last sequence ends with the pad id, as an eos-padded reward model's inputs do: HF's own pooling would
    # skip it; the mask-based read must not
    sequences = [tok.encode(t) for t in texts] + [tok.encode("hi") + [tok.pad_token_id]]
    want = hf_last_token_scores(rm, sequences)
    assert want.std() > 1e-3  # distinct texts score differently, so a misplaced read would show
    for micro in (1, 2, 4, 6):
        got = score_sequences(rm, sequences, micro, tok.pad_token_id, "cpu")
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    longest = max(map(len, sequences))
    for budget in (longest, 2 * longest, 100 * longest):   # one input a forward .. all of them in one
        got = score_sequences(rm, sequences, None, tok.pad_token_id, "cpu", max_tokens=budget)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match=r"reward_model.forward_max_token_len_per_gpu=\d+ is smaller than a "
                                         rf"sequence of {longest} tokens"):
        score_sequences(rm, sequences, None, tok.pad_token_id, "cpu", max_tokens=longest - 1)
    width = max(map(len, sequences))
    for left in (True, False):
        gaps = [[tok.pad_token_id] * (width - len(s)) for s in sequences]
        ids = torch.tensor([g + s if left else s + g for g, s in zip(gaps, sequences)])
        mask = torch.tensor([[0] * len(g) + [1] * len(s) if left else [1] * len(s) + [0] * len(g)
                             for g, s in zip(gaps, sequences)])
        torch.testing.assert_close(score_batch(rm, ids, mask), want, atol=1e-5, rtol=1e-5)


def rollout_batch(tok, chats, responses, response_length=12, prompt_length=40):
    """A rollout-shaped batch: left-padded prompts (the policy's chat template), right-padded responses."""
    rows = []
    for chat, resp in zip(chats, responses):
        p = tok.encode(tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False))
        rows.append((p, resp))
    pad = tok.pad_token_id
    prompts = torch.tensor([[pad] * (prompt_length - len(p)) + p for p, _ in rows])
    resp = torch.tensor([r + [pad] * (response_length - len(r)) for _, r in rows])
    pmask = (torch.arange(prompt_length) >= prompt_length - torch.tensor([len(p) for p, _ in rows])[:, None]).long()
    rmask = (torch.arange(response_length) < torch.tensor([len(r) for _, r in rows])[:, None]).long()
    return DataProto({"input_ids": torch.cat([prompts, resp], 1), "attention_mask": torch.cat([pmask, rmask], 1),
                      "responses": resp, "response_mask": rmask},
                     {"raw_prompt": chats, "data_source": ["arith"] * len(rows),
                      "reward_model": [{"style": "model", "ground_truth": g} for g in ("7", "12")[:len(rows)]]})


CHATS = [[{"role": "user", "content": "What is 3 + 4?"}], [{"role": "user", "content": "5 + 7 = ?"}]]


def test_policy_ids_read_directly_when_the_tokenizer_is_shared(tok):
    responses = [tok.encode("7") + [tok.eos_token_id], tok.encode("It is 12")]
    batch = rollout_batch(tok, CHATS, responses)
    lists, cut = rm_token_lists(batch, tok, None, max_length=64, truncation="left")
    assert cut == 0
    assert lists[0] == tok.encode(tok.apply_chat_template(CHATS[0], add_generation_prompt=True, tokenize=False)) + \
        responses[0]
    lists, cut = rm_token_lists(batch, tok, None, max_length=10, truncation="left")
    assert cut == 2 and lists[1] == (batch.batch["input_ids"][1][batch.batch["attention_mask"][1].bool()]).tolist()[-10:]
    lists, _ = rm_token_lists(batch, tok, None, max_length=10, truncation="right")
    assert lists[0] == batch.batch["input_ids"][0][batch.batch["attention_mask"][0].bool()].tolist()[:10]
    with pytest.raises(ValueError, match="reward_model.max_length=10"):
        rm_token_lists(batch, tok, None, max_length=10, truncation="error")


def test_chat_rerendered_with_the_reward_models_own_template(tok, tiny_reward_model_dir, tmp_path):
    other = tmp_path / "rm_other_template"
    shutil.copytree(tiny_reward_model_dir, other)
    rm_tok = AutoTokenizer.from_pretrained(other)
    rm_tok.chat_template = RM_TEMPLATE
    rm_tok.save_pretrained(other)
    rm_tok = AutoTokenizer.from_pretrained(other)
    responses = [tok.encode("7") + [tok.eos_token_id], tok.encode("It is 12")]
    lists, _ = rm_token_lists(rollout_batch(tok, CHATS, responses), rm_tok, tok, max_length=256, truncation="left")
    # the policy's eos (<|im_end|>) is a special token: decoded away, the reward model's template ends the turn
    assert rm_tok.decode(lists[0]) == "### user: What is 3 + 4?\n### assistant: 7\n### end"
    assert lists[1] == rm_tok.encode("### user: 5 + 7 = ?\n### assistant: It is 12\n### end", add_special_tokens=False)
    no_chat = rollout_batch(tok, CHATS, responses)
    no_chat.non_tensor_batch.pop("raw_prompt")
    with pytest.raises(ValueError, match="data.return_raw_chat=true"):
        rm_token_lists(no_chat, rm_tok, tok, max_length=256, truncation="left")


def test_score_sits_on_the_last_valid_response_token():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 0, 1, 0]])  # last: a masked tool span
    rewards, empty = place_at_last_token(torch.tensor([0.5, -1.0, 2.0, 3.0]), mask)
    assert empty == 1
    assert torch.equal(rewards, torch.tensor([[0, 0, 0.5, 0], [-1.0, 0, 0, 0], [2.0, 0, 0, 0], [0, 0, 3.0, 0]]))


def with_rm_scores(batch, scores):
    batch.batch["rm_scores"], _ = place_at_last_token(torch.tensor(scores), batch.batch["response_mask"])
    return batch


def test_reward_model_score_is_the_reward_and_no_rule_runs(tok):
    responses = [tok.encode("7") + [tok.eos_token_id], tok.encode("It is 12")]
    batch = with_rm_scores(rollout_batch(tok, CHATS, responses), [0.25, float("nan")])
    batch.non_tensor_batch["reward_model"] = [{"style": "model"}, {"style": "model"}]  # no ground truth needed
    out = RewardManager(tok, timeout_s=None)(batch)
    assert torch.equal(out["reward_tensor"], torch.tensor([[0, 0.25] + [0.0] * 10, [0.0] * 12]))
    # a non-finite score is an error scored 0, counted (the error guard sees it)
    assert out["metrics"]["reward/errors"] == 1 and out["metrics"]["reward/missing_ground_truths"] == 0


def combined(data_source, solution_str, ground_truth, extra_info=None, rm_score=None):
    return (1.0 if solution_str.strip().endswith(ground_truth) else 0.0) + 0.5 * rm_score


def test_custom_function_with_rm_score_combines_rule_and_model(tok):
    responses = [tok.encode("7") + [tok.eos_token_id], tok.encode("It is 13")]
    batch = with_rm_scores(rollout_batch(tok, CHATS, responses), [0.25, -2.0])
    out = RewardManager(tok, compute_score=combined, timeout_s=None)(batch)
    # sample 0: right (1) + 0.5 * 0.25 at its eos; sample 1: wrong (0) + 0.5 * -2 at its last token
    assert out["reward_tensor"][0, 1].item() == pytest.approx(1.125)
    assert out["reward_tensor"][1, len(responses[1]) - 1].item() == pytest.approx(-1.0)
    assert out["reward_tensor"].abs().sum().item() == pytest.approx(2.125)
