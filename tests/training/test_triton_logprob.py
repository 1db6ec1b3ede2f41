"""The fused head's Triton kernels (training/triton_logprob.py) against the torch formulas of the finite path
(algorithms/chunked_logprob.py): the kernels alone and the whole fused head with them, on CPU under the Triton
interpreter (TRITON_INTERPRET=1, HYBRIDRL_FUSED=force), and the fused head at the update's shape on a GPU, each
against the torch path (HYBRIDRL_FUSED=0)."""

import os

import pytest
import torch

from hybridrl.algorithms import chunked_logprob as C
from hybridrl.training import fused_logprob as F

pytest.importorskip("triton", reason="triton is not installed: the torch path is the only one")
from hybridrl.training import triton_logprob as TL  # noqa: E402

interpreted = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="the kernels run on CPU only under the Triton interpreter: TRITON_INTERPRET=1")


def torch_formulas(z, targets, temperature, g_lp, g_h):
    """lse, log p of the targets, entropy and dz of raw logits z: the finite torch path's formulas, in fp64 (the
    fp32 torch path's entropy is itself off by up to 5e-5 here, from its vecdot of p with logits near 30)."""
    x = z.double() / temperature
    g_lp, g_h = g_lp.double(), g_h.double()
    lse = torch.logsumexp(x, -1)
    log_p = x - lse[:, None]
    p = log_p.exp()
    ent = lse - torch.linalg.vecdot(p, x)
    onehot = torch.zeros_like(p).scatter_(1, targets[:, None], 1.0)
    dz = (g_lp[:, None] * (onehot - p) - g_h[:, None] * p * (log_p + ent[:, None])) / temperature
    return lse, log_p.gather(1, targets[:, None]).squeeze(1), ent, dz


@interpreted
@pytest.mark.parametrize("vocab", [1000, 4099])   # one partial tile; two tiles, the second with 3 live entries
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("terms", ["both", "log_p", "entropy"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_kernels_match_the_torch_formulas(vocab, temperature, terms, dtype):
    """Forward: lse, target log-probs and entropies to fp32 rounding of the row sums (with and without entropy);
    backward: dz, written over z in its dtype, to one rounding (given the exact lse and H) — with either upstream
    gradient absent."""
    g = torch.Generator().manual_seed(vocab)
    k = 5
    z = (torch.randn(k, vocab, generator=g) * 3 + 20).to(dtype)   # an offset: the online max is exercised
    targets = torch.randint(0, vocab, (k,), generator=g)
    g_lp, g_h = torch.randn(k, generator=g), torch.randn(k, generator=g)
    with_log_p, with_entropy = terms != "entropy", terms != "log_p"
    ref_lse, ref_lp, ref_ent, ref_dz = torch_formulas(z, targets, temperature, g_lp * with_log_p, g_h * with_entropy)

    lse, log_p, ent = torch.empty(k), torch.zeros(k), torch.zeros(k)
    TL.logprob_entropy_forward(z, targets if with_log_p else None, temperature, lse, log_p,
                               ent if with_entropy else None)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=0, atol=1e-5)
    torch.testing.assert_close(log_p.double(), ref_lp if with_log_p else torch.zeros_like(ref_lp), rtol=0, atol=1e-5)
    torch.testing.assert_close(ent.double(), ref_ent if with_entropy else torch.zeros_like(ref_ent), rtol=0,
                               atol=1e-5)

    dz = TL.logprob_entropy_backward(z, targets if with_log_p else None, ref_lse.float(), ref_ent.float(),
                                     g_lp if with_log_p else None, g_h if with_entropy else None, temperature)
    assert dz.data_ptr() == z.data_ptr() and dz.dtype == dtype
    # 1e-2: the interpreter's fp32 -> bf16 cast truncates (one bf16 ulp, 2^-7); on a GPU it rounds to nearest
    torch.testing.assert_close(dz.double(), ref_dz, rtol=1e-2, atol=1e-6)


def _fused_head_paths(monkeypatch, device, k, hidden, vocab, entropy_grad, with_entropy=True):
    """(log-prob / entropy [K, 2], grad of hidden, grad of weight) through the kernels and through the torch
    path, on the same random bf16 inputs at temperature 0.7."""
    torch.manual_seed(0)
    h0 = (torch.randn(k, hidden, device=device) * 0.5).bfloat16()
    w0 = (torch.randn(vocab, hidden, device=device) * 0.02).bfloat16()
    t = torch.randint(0, vocab, (k,), device=device)
    g = torch.randn(k, 2, device=device)
    results = []
    for mode in ("force" if device == "cpu" else "1", "0"):
        monkeypatch.setenv("HYBRIDRL_FUSED", mode)
        assert (F._HeadLogits.kernels((h0, w0)) is None) == (mode == "0")
        h, w = h0.clone().requires_grad_(), w0.clone().requires_grad_()
        out = F.fused_logprob_entropy(h, w, t, 0.7, with_entropy, entropy_grad)
        (out * g).sum().backward()
        results.append((out.detach(), h.grad, w.grad))
    return results


def _assert_paths_agree(kernels, torch_path, value_atol):
    for name, a, b in zip(("log-prob / entropy", "grad hidden", "grad weight"), kernels, torch_path):
        assert a.dtype == b.dtype, name
        if name == "log-prob / entropy":
            torch.testing.assert_close(a, b, rtol=0, atol=value_atol, msg=name)
        else:   # dz may differ by one bf16 rounding an entry; the GEMMs sum those
            err = (a.float() - b.float()).abs().max().item()
            assert err <= 1e-2 * b.float().abs().max().item(), (name, err)


@interpreted
@pytest.mark.parametrize("entropy_grad,with_entropy", [(True, True), (False, True), (False, False)])
def test_fused_head_with_kernels_matches_the_torch_path(monkeypatch, entropy_grad, with_entropy):
    """The routine's kernel branch (raw bf16 chunks, dz in place) against its torch branch over several chunks,
    the last one partial."""
    monkeypatch.setattr(C, "CHUNK_BYTES", 4 * 300 * 8)   # 8 rows a chunk
    kernels, torch_path = _fused_head_paths(monkeypatch, "cpu", 21, 16, 300, entropy_grad, with_entropy)
    _assert_paths_agree(kernels, torch_path, value_atol=2e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("entropy_grad", [True, False])
def test_fused_head_kernels_match_the_torch_path_on_gpu(monkeypatch, entropy_grad):
    """At Qwen2.5-1.5B's head (hidden 1536, vocab 151,936): 2048 rows are five default chunks, the last partial."""
    kernels, torch_path = _fused_head_paths(monkeypatch, "cuda", 2048, 1536, 151936, entropy_grad)
    _assert_paths_agree(kernels, torch_path, value_atol=1e-4)
