"""The chunked log-prob head against plain PyTorch (logits -> log_softmax) on random inputs: values and gradients
of hidden states and head weight, with entropy, several chunks, by dtype; and inside the actor on a tiny model."""

import pytest
import torch

from hybridrl.algorithms import chunked_logprob as C
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
    monkeypatch.setattr(C, "CHUNK_BYTES", 4 * V * 8)  # 8 rows a chunk: 5 chunks, the last one partial
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


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
def test_entropy_without_gradient_is_a_detached_measurement(monkeypatch, dtype, tol):
    """entropy_grad=False: the same values, the entropy detached, and the gradients of the log-probs alone
    (what plain PyTorch gives with the entropy detached) — though the loss is handed the entropy too."""
    torch.manual_seed(2)
    K, H, V = 29, 16, 50
    monkeypatch.setattr(C, "CHUNK_BYTES", 4 * V * 8)
    h = (torch.randn(K, H) * 2).to(dtype).requires_grad_()
    w = torch.randn(V, H).to(dtype).requires_grad_()
    t = torch.randint(0, V, (K,))
    g = torch.randn(K, 2)
    out = F.fused_logprob_entropy(h, w, t, 0.7, True, entropy_grad=False)
    assert out[:, 0].requires_grad
    (out * g).sum().backward()
    gh, gw = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    ref = reference(h, w, t, 0.7)
    torch.testing.assert_close(out.detach(), ref.detach(), atol=tol, rtol=tol)
    (ref[:, 0] * g[:, 0] + ref[:, 1].detach() * g[:, 1]).sum().backward()
    scale = lambda x: x.abs().max().item()  # noqa: E731
    assert (gh - h.grad).abs().max().item() <= tol * max(1.0, scale(h.grad))
    assert (gw - w.grad).abs().max().item() <= tol * max(1.0, scale(w.grad))
    h.grad = w.grad = None
    (F.fused_logprob_entropy(h, w, t, 0.7, True) * g).sum().backward()   # with its gradient: a different one
    assert (gh.float() - h.grad.float()).abs().max().item() > 0.1 * scale(h.grad)


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


def _weight_grad_inputs(device, K=37, H=16, V=50):
    torch.manual_seed(1)
    return (torch.randn(K, V, device=device).to(torch.bfloat16), torch.randn(K, H, device=device).to(torch.bfloat16),
            torch.randn(V, H, device=device))   # a chunk's logit grads, its hidden states, the fp32 gradient


def test_weight_grad_paths_sum_into_fp32():
    """Both ways of adding a bf16 chunk's [V, K] @ [K, H] to the fp32 head gradient give the fp32 product of the
    bf16 inputs (the product path rounds it to bf16 once first)."""
    dz, h, acc = _weight_grad_inputs("cpu")
    exact = acc + dz.float().t() @ h.float()
    via_product = acc.clone()
    F._add_product(via_product, dz, h)
    torch.testing.assert_close(via_product, exact, atol=3e-2, rtol=1e-2)
    same_dtype = acc.clone()
    F.add_weight_grad(same_dtype, dz.float(), h.float())   # fp32 chunks (the CPU's compute dtype): addmm_
    torch.testing.assert_close(same_dtype, exact, atol=1e-4, rtol=1e-5)


@pytest.mark.gpu
def test_weight_grad_in_gemm_on_cuda():
    """On CUDA the bf16 chunk is summed into the fp32 gradient inside the GEMM: the fp32 product of the bf16
    inputs to fp32 accuracy (closer than the product path, which rounds to bf16 first)."""
    dz, h, acc = _weight_grad_inputs("cuda", K=441, H=256, V=3000)
    exact = acc + dz.double().t() @ h.double()
    in_gemm, via_product = acc.clone(), acc.clone()
    F.add_weight_grad(in_gemm, dz, h)
    F._add_product(via_product, dz, h)
    assert in_gemm.dtype == torch.float32
    err_gemm = (in_gemm.double() - exact).abs().max().item()
    err_product = (via_product.double() - exact).abs().max().item()
    assert err_gemm < 1e-3 * exact.abs().max().item(), err_gemm
    assert err_gemm < err_product


@pytest.mark.gpu
def test_sum_pi_squared_on_cuda_at_a_real_vocabulary():
    """Σπ² of the chunked head on CUDA, bf16 inputs at Qwen2.5's vocabulary (151,936 columns), against softmax² in
    fp64 of the same bf16 logits: values in [1/V, 1], within 1e-3 relative."""
    torch.manual_seed(5)
    K, H, V = 300, 256, 151_936
    h = (torch.randn(K, H, device="cuda") * 0.5).to(torch.bfloat16)
    h[:3] *= 40  # three rows nearly one-hot
    w = (torch.randn(V, H, device="cuda") * 0.05).to(torch.bfloat16)
    out = F.fused_sum_pi_squared(h, w, 0.9)
    z = (h @ w.t()).double() / 0.9
    expected = torch.softmax(z, -1).pow(2).sum(-1)
    assert out.shape == (K,) and torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), expected, atol=1e-6, rtol=1e-3)
    assert expected[:3].min() > 0.1 and expected[3:].max() < 1e-3  # both ends of the range are exercised
