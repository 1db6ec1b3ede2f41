"""The native engine on the real SmolLM2-135M-Instruct (bf16 weights, run in fp32 on CPU) against HF `generate`:
greedy tokens for a batch of chat prompts, stopping at `<|im_end|>`, and the response mask that follows."""

import pytest
import torch
import transformers

from hybridrl.protocol import DataProto
from hybridrl.rollout.config import EngineConfig
from hybridrl.rollout.engine import LLMEngine
from hybridrl.rollout.sampling_params import SamplingParams
from hybridrl.rollout.to_dataproto import outputs_to_dataproto

pytestmark = pytest.mark.slow

# three answers end at <|im_end|> within MAX_TOKENS, two run on (the "length" path)
QUESTIONS = ["What is 7 + 5?", "What is 38 + 41?", "What is the capital of France?", "What is 2 + 2?",
             "Name one primary color."]
MAX_TOKENS = 32
TIE = 1e-3  # fp32 logits: the engine and HF differ by ~1e-5, so only a near-tie may flip a greedy choice


@pytest.fixture(scope="module")
def smollm2(smollm2_dir):
    tokenizer = transformers.AutoTokenizer.from_pretrained(smollm2_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    return tokenizer, model


def chat_ids(tokenizer, question):
    text = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                         tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def hf_greedy_to_eos(model, prompt, eos):
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_TOKENS, do_sample=False,
                             eos_token_id=eos, pad_token_id=eos)
    return out[0, len(prompt):].tolist()


def tie_gap(model, prompt, hf_tokens, ours, i):
    """|logit(HF's token) - logit(ours)| in HF's fp32 logits where the two first differ."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + hf_tokens[:i]])).logits[0, -1].float()
    return (logits[hf_tokens[i]] - logits[ours[i]]).abs().item()


def test_greedy_chat_tokens_equal_hf_generate_and_stop_at_im_end(smollm2):
    tokenizer, model = smollm2
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokenizer.eos_token_id == eos == model.config.eos_token_id
    prompts = [chat_ids(tokenizer, q) for q in QUESTIONS]
    config = EngineConfig(dtype=torch.float32, block_size=16, num_kv_blocks=64, max_num_seqs=len(prompts),
                          max_model_len=128, max_num_batched_tokens=512, enforce_eager=True)
    engine = LLMEngine(model.config, config, device="cpu")
    engine.wake_up(("weights",))
    engine.load_weights(model.state_dict().items())
    engine.wake_up(("kv_cache",))
    results = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_TOKENS))
    engine.sleep()
    outs = [r.outputs[0] for r in results]
    exact = 0
    for prompt, out in zip(prompts, outs):
        ours, theirs = out.token_ids, hf_greedy_to_eos(model, prompt, eos)
        if ours == theirs:
            exact += 1
        else:
            i = next((k for k, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
            assert i is not None, f"same tokens but lengths {len(ours)} vs HF {len(theirs)}: the stop differs"
            gap = tie_gap(model, prompt, theirs, ours, i)
            assert gap < TIE, f"diverged from HF at token {i} without a near-tie (logit gap {gap:.2e})"
        stopped = out.finish_reason == "stop"
        assert stopped == (ours[-1] == eos) and eos not in ours[:-1], "a sequence must end at its first <|im_end|>"
    assert exact >= len(prompts) - 1, f"only {exact}/{len(prompts)} equal HF token for token"
    reasons = [o.finish_reason for o in outs]
    assert "stop" in reasons and "length" in reasons, f"both ends must be exercised: {reasons}"
    assert "12" in tokenizer.decode(outs[0].token_ids)  # "What is 7 + 5?": the converted weights answer it

    # the rollout batch: the mask covers each response up to and including its <|im_end|>, nothing after
    width = max(len(p) for p in prompts)
    batch = {"input_ids": torch.tensor([[eos] * (width - len(p)) + p for p in prompts]),
             "attention_mask": torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])}
    batch["position_ids"] = (batch["attention_mask"].cumsum(1) - 1).clamp(min=0)
    data = outputs_to_dataproto(DataProto.from_dict(batch), results, response_length=MAX_TOKENS, pad_token_id=eos)
    for row, out in enumerate(outs):
        mask = data.batch["response_mask"][row]
        assert mask.sum().item() == len(out.token_ids) and mask[: len(out.token_ids)].all()
