"""Sampler: distribution (chi-square), truncation rules, log-prob definition, seeding."""

import torch

from hybridrl.rollout.sampler import sample

CHI2_DF7_P001 = 24.32  # chi-square critical value, 7 degrees of freedom, p = 0.001


def draws(logits, n, temperature=1.0, top_k=-1, top_p=1.0, seed=0):
    gen = torch.Generator().manual_seed(seed)
    rows = logits.expand(n, -1)
    return sample(rows, torch.full((n,), temperature), torch.full((n,), top_k), torch.full((n,), top_p), gen)


def test_sampling_matches_softmax_distribution_chi_square():
    logits = torch.tensor([1.0, 0.5, 0.0, -0.5, 2.0, -1.0, 0.3, 1.2])
    n, T = 20000, 0.7
    tokens, _ = draws(logits, n, temperature=T)
    expected = torch.softmax(logits / T, -1) * n
    observed = torch.bincount(tokens, minlength=8).float()
    chi2 = ((observed - expected) ** 2 / expected).sum().item()
    assert chi2 < CHI2_DF7_P001, chi2


def test_top_k_and_top_p_never_emit_truncated_tokens():
    logits = torch.tensor([3.0, 2.9, 0.0, -1.0, 2.8, -2.0, 1.0, -3.0])
    tokens, _ = draws(logits, 4000, top_k=3)
    assert set(tokens.tolist()) == {0, 1, 4}
    probs = torch.softmax(logits, -1)  # sorted mass: 0.33, 0.63, 0.91 (reaches 0.9 at the 3rd token)
    tokens, _ = draws(logits, 4000, top_p=0.9)
    assert set(tokens.tolist()) == {0, 1, 4}, probs
    tokens, _ = draws(logits, 4000, top_p=0.5)
    assert set(tokens.tolist()) == {0, 1}


def test_logprob_is_full_vocab_log_softmax_at_temperature_and_raw_for_greedy():
    torch.manual_seed(0)
    logits = torch.randn(6, 50)
    temp = torch.tensor([0.0, 0.0, 0.5, 1.0, 1.3, 0.8])
    tokens, logp = sample(logits, temp, torch.tensor([-1, -1, 5, -1, 10, -1]), torch.tensor([1.0, 1, 1, 0.7, 1, 1]),
                          torch.Generator().manual_seed(1))
    assert tokens[:2].tolist() == logits[:2].argmax(-1).tolist()
    t = torch.where(temp == 0, 1.0, temp)
    ref = torch.log_softmax(logits / t[:, None], -1).gather(1, tokens[:, None]).squeeze(1)
    torch.testing.assert_close(logp, ref)


def test_same_seed_same_tokens_other_seed_differs():
    logits = torch.zeros(1, 100)
    a, _ = draws(logits, 64, seed=3)
    b, _ = draws(logits, 64, seed=3)
    c, _ = draws(logits, 64, seed=4)
    assert torch.equal(a, b) and not torch.equal(a, c)
