"""FlashAttention varlen segments of a packed row: on the CPU, attention computed segment by segment as the kernel
computes it (keys gathered by kv_index, causal mask aligned at the key segment's end) equals the document mask's
dense attention, shared prompts included; on a GPU, the kernel itself equals the dense reference, forward and
backward."""

import pytest
import torch
from test_shared_prompts import grouped_batch

from hybridrl.training.flash_segments import flash_segments, flash_usable, flash_varlen_attention
from hybridrl.training.packed_attention import _sdpa_block_diagonal
from hybridrl.training.packing import pack_inputs


def segmentwise_attention(q, k, v, seg, scale):
    """What the varlen kernel computes, one query segment at a time: q [1, H, T, D], k/v [1, Hkv, T, D]."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    if seg.kv_index is not None:
        k, v = k[:, :, seg.kv_index], v[:, :, seg.kv_index]
    out = torch.zeros_like(q)
    for i in range(seg.cu_q.numel() - 1):
        q0, q1, k0, k1 = (int(x) for x in (seg.cu_q[i], seg.cu_q[i + 1], seg.cu_k[i], seg.cu_k[i + 1]))
        lq, lk = q1 - q0, k1 - k0
        allowed = torch.arange(lk)[None, :] <= torch.arange(lq)[:, None] + (lk - lq)   # bottom-right causal
        scores = (q[:, :, q0:q1] @ k[:, :, k0:k1].transpose(-1, -2)) * scale
        out[:, :, q0:q1] = torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1) @ v[:, :, k0:k1]
    return out


def packed_qkv(packed, heads=4, kv_heads=2, dim=8, seed=0, **kw):
    g = torch.Generator().manual_seed(seed)
    total = packed.input_ids.shape[1]
    return [torch.randn(1, h, total, dim, generator=g, **kw) for h in (heads, kv_heads, kv_heads)]


@pytest.mark.parametrize("share", [False, True])
def test_segments_reproduce_the_document_mask(share):
    b = grouped_batch(prompt_rows=(0, 1, 0, 2, 1, 0, 3, 3), prompt_len=9, resp_len=7).batch
    packed = pack_inputs(b["input_ids"], b["attention_mask"], b["position_ids"], 9 if share else None)
    seg = packed.flash
    assert (seg.kv_index is not None) == share
    q, k, v = packed_qkv(packed)
    want = _sdpa_block_diagonal(q, k, v, packed.cu_seqlens, 0.3, packed.shared)
    torch.testing.assert_close(segmentwise_attention(q, k, v, seg, 0.3), want, atol=1e-5, rtol=1e-5)
    assert int(seg.cu_q[-1]) == packed.input_ids.shape[1]
    assert seg.max_q == int((seg.cu_q[1:] - seg.cu_q[:-1]).max())
    assert seg.max_k == int((seg.cu_k[1:] - seg.cu_k[:-1]).max())


def test_shared_segments_copy_each_prompt_once_per_response():
    b = grouped_batch(prompt_rows=(0, 0, 0, 1), prompt_len=5, resp_len=4).batch
    packed = pack_inputs(b["input_ids"], b["attention_mask"], b["position_ids"], 5)
    seg = packed.flash
    prompt_tokens = b["attention_mask"][:, :5].sum(1)
    response_tokens = b["attention_mask"][:, 5:].sum(1)
    nonempty = response_tokens > 0
    # keys: each prompt once for itself, once more for each non-empty response of its group
    expected = int(prompt_tokens[[0, 3]].sum() + (prompt_tokens + response_tokens)[nonempty].sum())
    assert seg.kv_index.numel() == expected == int(seg.cu_k[-1])


def test_unshared_segments_are_the_documents():
    cu = torch.tensor([0, 3, 10, 11], dtype=torch.int32)
    seg = flash_segments(cu)
    assert torch.equal(seg.cu_q, cu) and torch.equal(seg.cu_k, cu) and seg.max_q == seg.max_k == 7
    assert seg.kv_index is None


def assert_flash_equals_dense(share: bool, kv_heads: int, dim: int) -> None:
    """The varlen kernel HYBRIDRL_FLASH picks, on a packed row of grouped samples (shared prompts or not), against the
    dense document-mask reference in fp32: the output, then the q / k / v gradients of a random upstream gradient."""
    b = grouped_batch(prompt_rows=(0, 1, 0, 2, 1, 0, 3, 3) * 3, prompt_len=150, resp_len=90).batch
    packed = pack_inputs(b["input_ids"], b["attention_mask"], b["position_ids"], 150 if share else None)
    q, k, v = (t.cuda().requires_grad_() for t in packed_qkv(packed, heads=4, kv_heads=kv_heads, dim=dim,
                                                              dtype=torch.bfloat16))
    assert flash_usable(q)
    gpu = packed.to("cuda")
    out = flash_varlen_attention(q, k, v, gpu.flash, dim ** -0.5)
    ref_in = [t.detach().float().requires_grad_() for t in (q, k, v)]
    ref = _sdpa_block_diagonal(*ref_in, gpu.cu_seqlens, dim ** -0.5, gpu.shared)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
    grad = torch.randn_like(ref)
    out.backward(grad.to(out.dtype))
    ref.backward(grad)
    for name, got, want in zip("qkv", (q, k, v), ref_in):
        err = (got.grad.float() - want.grad).abs().max() / want.grad.abs().max().clamp(min=1e-6)
        assert err < 3e-2, f"d{name} at head_dim {dim}: relative error {float(err):.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("share", [False, True])
@pytest.mark.parametrize("kv_heads", [2, 4])
@pytest.mark.parametrize("impl,gqa", [("fa2", "varlen_attn"), ("fa2", "native"), ("fa4", "native")])
def test_flash_kernel_equals_dense_reference_forward_and_backward(share, kv_heads, impl, gqa, monkeypatch):
    from hybridrl.models.varlen_attention import _fa4_unfit

    if impl == "fa4" and (why := _fa4_unfit(torch.device("cuda"), 64)):
        pytest.skip(f"FlashAttention-4: {why}")
    monkeypatch.setenv("HYBRIDRL_FLASH", impl)
    monkeypatch.setenv("HYBRIDRL_GQA", gqa)
    assert_flash_equals_dense(share, kv_heads, 64)


@pytest.mark.gpu
@pytest.mark.parametrize("dim", [8, 16, 24, 32, 48, 64, 80, 96, 128, 192, 256])
def test_fa4_head_dims_equal_dense_reference_forward_and_backward(dim, monkeypatch):
    """Every head dim FlashAttention-4 can be taken for here (forced included: on an architecture whose gradients
    were never checked, this is the check), shared prompts and grouped K/V heads (the hard case)."""
    from hybridrl.models.varlen_attention import _fa4_unfit

    if why := _fa4_unfit(torch.device("cuda"), dim, forced=True):
        pytest.skip(f"FlashAttention-4: {why}")
    monkeypatch.setenv("HYBRIDRL_FLASH", "fa4")
    assert_flash_equals_dense(True, 2, dim)


def test_unknown_gqa_mode_is_refused_naming_the_variable_and_the_choices(monkeypatch):
    from hybridrl.models.varlen_attention import varlen_causal_attention

    monkeypatch.setenv("HYBRIDRL_GQA", "repeated")
    q, k = torch.zeros(4, 4, 8), torch.zeros(4, 2, 8)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"HYBRIDRL_GQA='repeated'.*native, varlen_attn"):
        varlen_causal_attention(q, k, k, cu, cu, 4, 4, None)


def test_query_heads_must_be_a_multiple_of_the_key_value_heads():
    from hybridrl.models.varlen_attention import varlen_causal_attention

    q, k = torch.zeros(4, 6, 8), torch.zeros(4, 4, 8)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(ValueError, match="6 query heads are not a multiple of 4"):
        varlen_causal_attention(q, k, k, cu, cu, 4, 4, None)
