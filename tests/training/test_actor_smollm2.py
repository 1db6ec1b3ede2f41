"""The actor's log-probs on the real SmolLM2-135M-Instruct equal HF's plain forward, and RLHFDataset renders its
chat template as HF does. Prompts come from the example recipe's data (examples/smollm2_arith/make_data.py)."""

import pytest
import torch
import transformers
from typed_sections import actor_section

from hybridrl.data.rl_dataset import RLHFDataset, collate_fn
from hybridrl.protocol import DataProto
from hybridrl.training import DataParallelPPOActor
from hybridrl.training.packed_attention import register_varlen_attention

pytestmark = pytest.mark.slow

TEMPERATURE = 0.8
ROWS = 6


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    return transformers.AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="module")
def dataset(tokenizer, smollm2_add_task, tmp_path_factory):
    paths = smollm2_add_task.write_task(smollm2_add_task.TASK, tmp_path_factory.mktemp("add"), ROWS, 0, seed=0)
    return RLHFDataset(str(paths["train"]), tokenizer, {"max_prompt_length": 64})


def test_dataset_renders_the_real_chat_template_as_hf_does(dataset, tokenizer):
    for row, ids in zip(dataset.rows, dataset.prompt_ids):
        messages = [dict(m) for m in row["prompt"]]
        hf_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        assert ids == list(hf_ids)
        text = tokenizer.decode(ids)
        assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")  # its default
        assert text.endswith(f"<|im_start|>user\n{messages[0]['content']}<|im_end|>\n<|im_start|>assistant\n")
    item = dataset[0]
    assert item["input_ids"][item["attention_mask"].bool()].tolist() == dataset.prompt_ids[0]


def make_batch(dataset, tokenizer) -> DataProto:
    """Left-padded prompts + the reference answers ("a + b = c<|im_end|>") right-padded, verl's rollout layout."""
    prompts = collate_fn([dataset[i] for i in range(len(dataset))])
    eos = tokenizer.eos_token_id
    answers = [tokenizer.encode(f"The answer is {row['reward_model']['ground_truth']}.", add_special_tokens=False)
               + [eos] for row in dataset.rows]
    width = max(len(a) for a in answers) + 2
    responses = torch.tensor([a + [eos] * (width - len(a)) for a in answers])
    response_mask = torch.tensor([[1] * len(a) + [0] * (width - len(a)) for a in answers])
    attention_mask = torch.cat([prompts.batch["attention_mask"], response_mask], 1)
    return DataProto.from_dict({
        "responses": responses, "input_ids": torch.cat([prompts.batch["input_ids"], responses], 1),
        "attention_mask": attention_mask, "position_ids": (attention_mask.cumsum(1) - 1).clamp(min=0),
        "response_mask": response_mask}, meta_info={"temperature": TEMPERATURE, "micro_batch_size": 3})


def hf_log_probs(model, prompt_ids, response_ids):
    """Reference: one unpadded sequence through HF's own forward, log_softmax(logits / T) at the response tokens."""
    ids = torch.tensor([prompt_ids + response_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1:-1].float() / TEMPERATURE
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(response_ids)[:, None])[:, 0]


def hf_reference(model, dataset, data) -> torch.Tensor:
    mask = data.batch["response_mask"].bool()
    want = torch.zeros(mask.shape)
    for i, prompt in enumerate(dataset.prompt_ids):
        n = int(mask[i].sum())
        want[i, :n] = hf_log_probs(model, prompt, data.batch["responses"][i, :n].tolist())
    return want


def actor_log_probs(model, data, packed: bool) -> torch.Tensor:
    model.set_attn_implementation(register_varlen_attention())
    return DataParallelPPOActor(actor_section(), model, use_remove_padding=packed).compute_log_prob(data)[0]


def test_actor_log_probs_equal_hf_in_fp32_and_match_hf_accuracy_in_bf16(smollm2_dir, dataset, tokenizer):
    data = make_batch(dataset, tokenizer)
    mask = data.batch["response_mask"].bool()
    load = lambda dtype: transformers.AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=dtype).eval()  # noqa: E731
    fp32 = load(torch.float32)
    want = hf_reference(fp32, dataset, data)
    assert want[mask].mean() > -1.5  # the model finds its own answer format likely: real weights, converted right
    for packed in (True, False):  # packed rows (varlen attention) and the padded batch: same math, other order
        got = actor_log_probs(fp32, data, packed)
        torch.testing.assert_close(got[mask], want[mask], atol=2e-4, rtol=0, msg=f"use_remove_padding={packed}")
    # bf16 (the checkpoint's dtype) rounds through 30 layers; the actor must be as close to the fp32 truth as HF's
    # own bf16 forward is (which also rounds the logits to bf16)
    bf16 = load(torch.bfloat16)
    hf_error = (hf_reference(bf16, dataset, data) - want)[mask].abs().mean()
    actor_error = (actor_log_probs(bf16, data, packed=True) - want)[mask].abs().mean()
    assert actor_error <= 1.25 * hf_error, (actor_error.item(), hf_error.item())
    assert actor_error < 0.1  # nats per token
