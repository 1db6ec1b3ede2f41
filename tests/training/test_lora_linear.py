"""The fused LoRA linear against plain PyTorch and against peft's own forward: outputs and every gradient on random
inputs (fp32 tight, bf16 by its resolution), with and without bias and recompute; where it does not apply (adapters
off, mixed dtypes, dropout) peft's forward runs and gives peft's result."""

import pytest
import torch
from torch.utils.checkpoint import checkpoint
from transformers import AutoConfig, AutoModelForCausalLM

from hybridrl.training.lora import LoraSettings, adapters_disabled, apply_lora
from hybridrl.training.lora_linear import lora_linear

TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


def _reference(x, w, b, a, lb, s):
    return torch.nn.functional.linear(x, w, b) + torch.nn.functional.linear(torch.nn.functional.linear(x, a), lb) * s


def _leaves(dtype, bias, frozen_base, seed=0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *shape, scale=1.0: (torch.randn(*shape, generator=g) * scale).to(dtype)  # noqa: E731
    x = mk(3, 7, 24)
    w, a, lb = mk(40, 24, scale=0.2), mk(4, 24, scale=0.2), mk(40, 4, scale=0.2)
    bb = mk(40) if bias else None
    leaves = [x, w, bb, a, lb]
    for i, t in enumerate(leaves):
        if t is not None and not (frozen_base and i in (1, 2)):
            t.requires_grad_(True)
    return leaves


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("frozen_base", [True, False])
def test_lora_linear_matches_plain_pytorch(dtype, bias, frozen_base):
    s = 2.5
    ours, ref = _leaves(dtype, bias, frozen_base), _leaves(dtype, bias, frozen_base)
    y, y_ref = lora_linear(*ours, s), _reference(*ref, s)
    assert y.shape == y_ref.shape == (3, 7, 40) and y.dtype == dtype
    torch.testing.assert_close(y, y_ref, **TOL[dtype])
    up = torch.randn(y.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    (y * up).sum().backward()
    (y_ref * up).sum().backward()
    for name, t, r in zip(("x", "W", "bias", "A", "B"), ours, ref):
        if r is None or not r.requires_grad:
            assert t is None or t.grad is None, name
            continue
        assert t.grad is not None, name
        scale = r.grad.abs().max().item() or 1.0      # bf16 gradients: compare at the tensor's magnitude
        torch.testing.assert_close(t.grad / scale, r.grad / scale, **TOL[dtype], msg=name)


def test_lora_linear_under_recompute_gives_the_same_gradients():
    s = 0.5
    ours, ref = _leaves(torch.float32, True, True), _leaves(torch.float32, True, True)
    checkpoint(lora_linear, *ours, s, use_reentrant=False).square().sum().backward()
    _reference(*ref, s).square().sum().backward()
    for t, r in zip(ours, ref):
        if r is not None and r.requires_grad:
            torch.testing.assert_close(t.grad, r.grad, rtol=1e-5, atol=1e-5)


def _model(dtype=torch.float32):
    cfg = AutoConfig.for_model("qwen2", hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, vocab_size=64)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, dtype=dtype)


def _with_trained_adapters(model, adapter_dtype=None):
    apply_lora(model, LoraSettings(4, 8.0, "all-linear"), adapter_dtype=adapter_dtype)
    torch.manual_seed(1)
    for n, p in model.named_parameters():
        if "lora_B" in n:   # peft starts B at zero; a trained adapter's B is not
            p.data.normal_(0, 0.1)
    return model


def _peft_forward(model):
    """The same model computing through peft's own lora.Linear.forward (the fused class's base)."""
    for m in model.modules():
        if type(m).__name__ == "FusedLoraLinear":
            m.__class__ = type(m).__bases__[0]
    return model


def _loss_and_grads(model, ids):
    model.zero_grad(set_to_none=True)
    logits = model(ids).logits
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 64).float(), ids[:, 1:].reshape(-1))
    loss.backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def test_fused_model_matches_peft_forward_and_gradients():
    fused = _with_trained_adapters(_model())
    kinds = {type(m).__name__ for m in fused.modules()}
    assert "FusedLoraLinear" in kinds and "Linear" in kinds   # adapters switched; lm_head and A/B are plain
    peft = _peft_forward(_with_trained_adapters(_model()))
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(2))
    seen = []
    fused.model.layers[0].mlp.up_proj.register_forward_hook(lambda m, i, o: seen.append(type(o.grad_fn).__name__))
    (l1, g1), (l2, g2) = _loss_and_grads(fused, ids), _loss_and_grads(peft, ids)
    torch.testing.assert_close(l1, l2, rtol=1e-5, atol=1e-5)
    assert seen == ["_LoraLinearBackward"]   # the fused function ran, not peft's fallback
    assert g1.keys() == g2.keys() and all("lora_" in n for n in g1) and len(g1) == 2 * 7 * 2
    for n in g1:
        torch.testing.assert_close(g1[n], g2[n], rtol=1e-4, atol=1e-6, msg=n)
    assert fused.state_dict().keys() == peft.state_dict().keys()


def test_where_fusion_does_not_apply_peft_forward_runs():
    base = _model()
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(3))
    base_logits = base(ids).logits
    fused = _with_trained_adapters(_model())
    with adapters_disabled(fused):   # the reference policy: the base model exactly
        torch.testing.assert_close(fused(ids).logits, base_logits, rtol=0, atol=0)
    assert not torch.allclose(fused(ids).logits, base_logits)
    # a bf16 base with fp32 adapters (mixed dtypes): peft's cast-and-add path, same result as peft
    mixed, peft_mixed = (_with_trained_adapters(_model(torch.bfloat16), adapter_dtype=torch.float32) for _ in "ab")
    _peft_forward(peft_mixed)
    torch.testing.assert_close(mixed(ids).logits, peft_mixed(ids).logits, rtol=0, atol=0)
