"""GPU only: packed FlexAttention (document mask) log-probs equal the padded SDPA path in bf16 and fp32."""

import pytest
import torch
import transformers
from _training_tiny import TINY_ACTOR_CFG, make_ppo_batch, tiny_qwen2_config

from hybridrl.training import DataParallelPPOActor
from hybridrl.training.packed_attention import register_varlen_attention


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_flex_packed_equals_padded_on_cuda(dtype):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(tiny_qwen2_config(), dtype=dtype).cuda()
    model.set_attn_implementation(register_varlen_attention())
    data = make_ppo_batch(batch=6, prompt_len=40, resp_len=33)
    data.meta_info["micro_batch_size"] = 3
    cfg = TINY_ACTOR_CFG
    packed, _ = DataParallelPPOActor(cfg, model, use_remove_padding=True).compute_log_prob(data)
    padded, _ = DataParallelPPOActor(cfg, model, use_remove_padding=False).compute_log_prob(data)
    mask = data.batch["response_mask"].bool()
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(packed[mask], padded[mask], atol=tol, rtol=tol)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_flex_shared_prompts_equal_padded_on_cuda(dtype):
    """FlexAttention with the shared-prompt mask: log-probs and gradients equal the padded path's, over several
    micro-batches of different packed lengths (one compiled kernel, a block mask each)."""
    from test_shared_prompts import grouped_batch

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(tiny_qwen2_config(), dtype=dtype).cuda()
    model.set_attn_implementation(register_varlen_attention())
    data = grouped_batch(prompt_rows=(0, 0, 0, 1, 1, 2, 2, 2, 2, 3, 3, 0), prompt_len=150, resp_len=90)
    data.meta_info["micro_batch_size"] = 4
    cfg = TINY_ACTOR_CFG
    shared, _ = DataParallelPPOActor(cfg, model, share_prompts=True).compute_log_prob(data)
    padded, _ = DataParallelPPOActor(cfg, model, use_remove_padding=False).compute_log_prob(data)
    mask = data.batch["response_mask"].bool()
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(shared[mask], padded[mask], atol=tol, rtol=tol)

    def grads(share):
        model.zero_grad()
        b = {k: v.cuda() for k, v in data.batch.items()}
        from hybridrl.training.response_forward import forward_response_logits

        out = forward_response_logits(model, b["input_ids"], b["attention_mask"], b["position_ids"], 90, False,
                                      share_prompts=share)
        lp = torch.log_softmax(out.float(), -1).gather(-1, b["responses"][..., None])[..., 0]
        (lp * b["response_mask"]).sum().backward()
        return [p.grad.float().clone() for p in model.parameters()]

    for g_shared, g_padded in zip(grads(True), grads(False)):
        scale = g_padded.abs().max().clamp(min=1e-6)
        assert ((g_shared - g_padded).abs().max() / scale) < (1e-3 if dtype == torch.float32 else 5e-2)
