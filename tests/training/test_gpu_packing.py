"""GPU only: packed FlexAttention (document mask) log-probs equal the padded SDPA path in bf16 and fp32."""

import pytest
import torch
import transformers
from _training_tiny import make_ppo_batch, tiny_qwen2_config

from hybridrl.training import DataParallelPPOActor
from hybridrl.training.packing import register_varlen_attention


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_flex_packed_equals_padded_on_cuda(dtype):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(tiny_qwen2_config(), dtype=dtype).cuda()
    model.set_attn_implementation(register_varlen_attention())
    data = make_ppo_batch(batch=6, prompt_len=40, resp_len=33)
    data.meta_info["micro_batch_size"] = 3
    cfg = {"ppo_mini_batch_size": 6}
    packed, _ = DataParallelPPOActor(cfg, model, use_remove_padding=True).compute_log_prob(data)
    padded, _ = DataParallelPPOActor(cfg, model, use_remove_padding=False).compute_log_prob(data)
    mask = data.batch["response_mask"].bool()
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(packed[mask], padded[mask], atol=tol, rtol=tol)
