"""The Triton sampler (rollout/triton_sample.py) on CPU under the Triton interpreter (run by
tests/test_triton_interpreted.py): the exponential-race sample and its log-prob against torch on the same noise,
split over vocabulary chunks or not."""

import os

import pytest
import torch

interpreted = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="the kernels run on CPU only under the Triton interpreter: TRITON_INTERPRET=1")


def _reference(logits, noise, temp):
    """torch: greedy rows argmax(logits) and log_softmax(logits); sampled rows argmax(logits/T - log E) and
    log_softmax(logits/T) at it."""
    z = logits.float() / torch.where(temp > 0, temp, 1.0)[:, None]
    key = torch.where((temp > 0)[:, None], z - noise.log(), z)
    tok = key.argmax(-1)
    return tok, z.log_softmax(-1).gather(1, tok[:, None])[:, 0]


@interpreted
@pytest.mark.parametrize("splits", [1, 3, 7, None])
def test_sample_matches_torch_on_the_same_noise_split_or_not(splits, monkeypatch):
    from hybridrl.rollout import triton_decode, triton_sample

    monkeypatch.setattr(triton_decode, "num_sms", lambda index: 8)   # vocab_splits' SM count (splits=None)
    torch.manual_seed(0)
    B, V = 5, 1000
    logits = torch.randn(B, V) * 3
    temp = torch.tensor([0.0, 0.7, 1.0, 1.3, 0.0])
    gen = torch.Generator().manual_seed(4)
    tok, lp = triton_sample.sample_plain(logits, temp, gen, block=128, splits=splits)
    noise = torch.empty(B, V).exponential_(1.0, generator=torch.Generator().manual_seed(4))
    ref_tok, ref_lp = _reference(logits, noise, temp)
    assert torch.equal(tok, ref_tok)
    torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=1e-5)
