"""GPU only: Liger's kernels (training/liger.py) compute what HF's Qwen2 computes — logits and every gradient of a
bf16 model within bf16 resolution, with LoRA's fused linear and with recompute — before they are timed. The
architecture's module-level patches are undone after the test."""

import copy

import pytest
import torch
import transformers

pytest.importorskip("liger_kernel")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12)).item()


def _run(model, ids):
    model.zero_grad(set_to_none=True)
    logits = model(ids).logits
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
    loss.backward()
    return logits.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.gpu
@pytest.mark.parametrize("lora, recompute", [(False, False), (True, True)])
def test_liger_matches_hf_in_bf16(lora, recompute):
    from transformers.models.qwen2 import modeling_qwen2

    from hybridrl.training.fsdp import set_recompute
    from hybridrl.training.liger import apply_liger
    from hybridrl.training.lora import LoraSettings, apply_lora

    saved = {k: getattr(modeling_qwen2, k) for k in ("apply_rotary_pos_emb", "Qwen2RMSNorm", "Qwen2MLP")}
    try:
        cfg = transformers.Qwen2Config(hidden_size=256, intermediate_size=704, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                                       max_position_embeddings=512, tie_word_embeddings=False)
        torch.manual_seed(0)
        plain = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).cuda()
        if lora:
            apply_lora(plain, LoraSettings(8, 16.0, "all-linear"))
            for n, p in plain.named_parameters():
                if "lora_B" in n:
                    p.data.normal_(0, 0.05)
        if recompute:
            set_recompute(plain, True)
        plain.train()
        fused = copy.deepcopy(plain)
        ids = torch.randint(0, 512, (4, 96), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
        logits_ref, grads_ref = _run(plain, ids)     # before the patch: HF's own kernels
        apply_liger(fused)
        layer = fused.model.layers[0]
        assert (fused.model.norm._get_name(), layer.mlp._get_name()) == ("LigerRMSNorm", "LigerSwiGLUMLP")
        assert plain.model.norm._get_name() == "Qwen2RMSNorm"   # the instance patch left the reference alone
        logits, grads = _run(fused, ids)
        assert _rel(logits, logits_ref) < 2e-2
        assert grads.keys() == grads_ref.keys() and grads
        for name in grads:
            assert _rel(grads[name], grads_ref[name]) < 5e-2, name
    finally:
        for k, v in saved.items():
            setattr(modeling_qwen2, k, v)
