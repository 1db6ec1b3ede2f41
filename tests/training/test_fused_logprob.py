"""The chunked log-prob head against plain PyTorch (logits -> log_softmax) on random inputs: values and gradients
of hidden states and head weight, with entropy, several chunks, by dtype; and inside the actor on a tiny model."""

import pytest
import torch

from hybridrl.training import fused_logprob as F


def reference(h, w, t, temperature):
    z = (h @ w.t()).float() / temperature
    lp = torch.log_softmax(z, -1)
    return torch.stack([lp.gather(1, t[:, None]).squeeze(1), -(lp.exp() * lp).sum(-1)], -1)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("with_entropy", [True, False])
def test_fused_matches_plain_log_softmax(monkeypatch, dtype, tol, with_entropy):
    torch.manual_seed(0)
    K, H, V = 37, 16, 50
    monkeypatch.setattr(F, "CHUNK_BYTES", 4 * V * 8)  # 8 rows a chunk: 5 chunks, the last one partial
    h = (torch.randn(K, H) * 2).to(dtype).requires_grad_()
    w = torch.randn(V, H).to(dtype).requires_grad_()
    t = torch.randint(0, V, (K,))
    g = torch.randn(K, 2) if with_entropy else torch.cat([torch.randn(K, 1), torch.zeros(K, 1)], -1)
    out = F.fused_logprob_entropy(h, w, t, 0.7, with_entropy)
    (out * g).sum().backward()
    gh, gw = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    ref = reference(h, w, t, 0.7)
    (ref * g).sum().backward()
    cols = slice(None) if with_entropy else slice(0, 1)
    torch.testing.assert_close(out[:, cols], ref[:, cols], atol=tol, rtol=tol)
    scale = lambda x: x.abs().max().item()  # noqa: E731
    assert (gh - h.grad).abs().max().item() <= tol * max(1.0, scale(h.grad))
    assert (gw - w.grad).abs().max().item() <= tol * max(1.0, scale(w.grad))
    if not with_entropy:
        assert (out[:, 1] == 0).all()


def test_shifted_logits_and_one_hot_rows_stay_finite():
    h = torch.zeros(3, 4)
    h[:, 0] = torch.tensor([1.0, 100.0, 1000.0])
    w = torch.zeros(6, 4)
    w[2, 0] = 1.0   # row 3: logit 1000 on token 2, 0 elsewhere -> a one-hot distribution
    out = F.fused_logprob_entropy(h, w, torch.tensor([2, 2, 2]), 1.0, True)
    assert torch.isfinite(out).all() and (out[:, 1] >= 0).all()
    assert out[2, 0].abs() < 1e-6 and out[2, 1].abs() < 1e-6


def test_plain_linear_head_detection():
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model("qwen2", hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                               num_attention_heads=2, num_key_value_heads=1, vocab_size=40)
    assert F.plain_linear_head(AutoModelForCausalLM.from_config(cfg))
    cfg.final_logit_softcapping = 30.0
    assert not F.plain_linear_head(AutoModelForCausalLM.from_config(cfg))
