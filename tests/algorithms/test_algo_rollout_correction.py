"""Rollout correction (truncated IS, rejection sampling, off-policy metrics) against hand-computed values."""

import math

import pytest
import torch
from omegaconf import OmegaConf

from hybridrl.algorithms.rollout_correction import (
    apply_rollout_correction,
    offpolicy_metrics,
    parse_rs_thresholds,
    rejection_mask,
    rollout_is_weights,
    truncated_is_weights,
)
from hybridrl.protocol import DataProto

L = math.log
# per-token ratios π_train / π_rollout; row 0 has one padding position (ratio 100 there must not count)
RATIOS = torch.tensor([[3.0, 0.5, 100.0], [1.5, 0.25, 4.0]])
MASK = torch.tensor([[1, 1, 0], [1, 1, 1]])
LOG_RATIO = RATIOS.log()


def test_token_level_weights_are_truncated_above_only_and_zero_on_padding():
    weights, m = rollout_is_weights(LOG_RATIO, MASK, "token", 2.0)
    torch.testing.assert_close(weights, torch.tensor([[2.0, 0.5, 0.0], [1.5, 0.25, 2.0]]))
    # metrics come from the untruncated weights 3, .5, 1.5, .25, 4
    assert m["rollout_is_mean"] == pytest.approx(9.25 / 5)
    assert m["rollout_is_max"] == pytest.approx(4.0) and m["rollout_is_min"] == pytest.approx(0.25)
    assert m["rollout_is_ratio_fraction_high"] == pytest.approx(2 / 5)  # 3 and 4 exceed 2
    assert m["rollout_is_ratio_fraction_low"] == pytest.approx(1 / 5)   # 0.25 < 1/2 (0.5 is not)
    assert m["rollout_is_seq_mean"] == pytest.approx(((3 + 0.5) / 2 + (1.5 + 0.25 + 4) / 3) / 2, rel=1e-6)
    assert not weights.requires_grad
    torch.testing.assert_close(truncated_is_weights(LOG_RATIO, MASK, "token", 2.0), weights)


def test_sequence_level_weight_is_the_product_of_the_row():
    log_ratio = torch.tensor([[L(3.0), L(0.5), 50.0], [L(2.0), L(2.0), L(2.0)]])
    weights, m = rollout_is_weights(log_ratio, MASK, "sequence", 2.0)
    torch.testing.assert_close(weights, torch.tensor([[1.5, 1.5, 0.0], [2.0, 2.0, 2.0]]))  # row 1: 8, cut at 2
    assert m["rollout_is_max"] == pytest.approx(8.0) and m["rollout_is_min"] == pytest.approx(1.5)
    assert m["rollout_is_ratio_fraction_high"] == pytest.approx(0.5)


def test_batch_normalisation_and_effective_sample_size():
    weights, m = rollout_is_weights(LOG_RATIO, MASK, "token", 2.0, batch_normalize=True)
    mean = (2.0 + 0.5 + 1.5 + 0.25 + 2.0) / 5  # of the truncated weights
    assert m["rollout_is_batch_norm_factor"] == pytest.approx(mean)
    torch.testing.assert_close(weights, torch.tensor([[2.0, 0.5, 0.0], [1.5, 0.25, 2.0]]) / mean)
    two = torch.tensor([[L(2.0), L(0.5)]])
    _, m = rollout_is_weights(two, torch.ones(1, 2), "token", 2.0)
    # normalised weights 1.6 and 0.4: ESS = 1 / mean(1.6², 0.4²) = 1 / 1.36
    assert m["rollout_is_eff_sample_size"] == pytest.approx(1 / 1.36, rel=1e-5)
    assert m["rollout_is_std"] == pytest.approx(0.75, rel=1e-5)


def test_rejection_token_k1_keeps_ratios_within_bounds_inclusive():
    mask, m = rejection_mask(LOG_RATIO, MASK, "token_k1", "0.5_2")
    assert mask.tolist() == [[0, 1, 0], [1, 0, 0]]  # 3, 0.25 and 4 fall outside [0.5, 2]; 0.5 is kept
    assert m["rollout_rs_masked_fraction"] == pytest.approx(3 / 5)
    assert m["rollout_rs_seq_masked_fraction"] == pytest.approx(1.0)
    assert m["rollout_rs_token_k1_fraction_high"] == pytest.approx(1 / 5)  # k1 = -log r > log 2: r = 0.25
    assert m["rollout_rs_token_k1_fraction_low"] == pytest.approx(2 / 5)   # r = 3 and 4
    assert mask.dtype == MASK.dtype


def test_rejection_sequence_criteria_chain_and_drop_whole_rows():
    k3 = lambda r: r - 1 - math.log(r)  # noqa: E731
    row0, row1 = (k3(3.0) + k3(0.5)) / 2, (k3(1.5) + k3(0.25) + k3(4.0)) / 3
    assert row0 < 0.6 < row1
    mask, m = rejection_mask(LOG_RATIO, MASK, "seq_mean_k3", 0.6)
    assert mask.tolist() == [[1, 1, 0], [0, 0, 0]]
    assert m["rollout_rs_seq_mean_k3_max"] == pytest.approx(row1, rel=1e-5)
    assert m["rollout_rs_seq_mean_k3_seq_masked_fraction"] == pytest.approx(0.5)
    # chained: both must pass; row 0's max ½ log² r = ½ log² 3 = 0.60 > 0.5 rejects it too
    mask, m = rejection_mask(LOG_RATIO, MASK, "seq_mean_k3,seq_max_k2", "0.6,0.5")
    assert mask.sum() == 0 and m["rollout_rs_seq_masked_fraction"] == 1.0


def test_rs_threshold_parsing_and_errors():
    assert parse_rs_thresholds("token_k1", 2.0) == {"token_k1": (pytest.approx(L(0.5)), pytest.approx(L(2.0)))}
    assert parse_rs_thresholds("token_k2,seq_sum_k3", "0.1") == {"token_k2": (None, 0.1), "seq_sum_k3": (None, 0.1)}
    with pytest.raises(ValueError, match=r"rollout_rs='token_k9'.*unknown: \['token_k9'\]"):
        parse_rs_thresholds("token_k9", 1.0)
    with pytest.raises(ValueError, match="rollout_rs_threshold is null"):
        parse_rs_thresholds("token_k2", None)
    with pytest.raises(ValueError, match="one per criterion"):
        parse_rs_thresholds("token_k2,token_k3,seq_max_k2", "1,2")
    with pytest.raises(ValueError, match="token_k2 needs one positive number"):
        parse_rs_thresholds("token_k2", "0.1_2")


def test_offpolicy_metrics_by_hand():
    old = torch.tensor([[L(0.5), L(0.25)]])
    rollout = torch.tensor([[L(0.25), L(0.25)]])
    m = offpolicy_metrics(old, rollout, torch.ones(1, 2))
    assert m["kl"] == pytest.approx(-L(2) / 2, rel=1e-5)             # mean(log π_rollout - log π_train)
    assert m["k3_kl"] == pytest.approx((2 - L(2) - 1) / 2, rel=1e-5)  # ratio 2 on token 0, 1 on token 1
    assert m["chi2_token"] == pytest.approx((4 + 1) / 2 - 1, rel=1e-5)
    assert m["chi2_seq"] == pytest.approx(4 - 1, rel=1e-5)
    assert m["training_ppl"] == pytest.approx(math.exp((L(2) + L(4)) / 2), rel=1e-5)
    assert m["rollout_ppl"] == pytest.approx(4.0, rel=1e-5)
    assert m["ppl_ratio"] == pytest.approx(math.exp((L(2) + L(4)) / 2) / 4, rel=1e-5)


def test_apply_rollout_correction_adds_weights_narrows_the_mask_and_prefixes_metrics():
    rollout = torch.full((2, 3), -1.0)
    batch = DataProto({"old_log_probs": rollout + LOG_RATIO, "rollout_log_probs": rollout, "response_mask": MASK})
    cfg = OmegaConf.create({"rollout_is": "token", "rollout_is_threshold": 2.0, "rollout_is_batch_normalize": False,
                            "rollout_rs": "token_k1", "rollout_rs_threshold": "0.5_2"})
    metrics = apply_rollout_correction(batch, cfg)
    torch.testing.assert_close(batch.batch["rollout_is_weights"], torch.tensor([[2.0, 0.5, 0.0], [1.5, 0.25, 2.0]]))
    assert batch.batch["response_mask"].tolist() == [[0, 1, 0], [1, 0, 0]]
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(1.85, rel=1e-5)
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(0.6)
    assert all(k.startswith("rollout_corr/") for k in metrics) and "rollout_corr/kl" in metrics
    off = OmegaConf.create({"rollout_is": None, "rollout_is_threshold": 2.0, "rollout_is_batch_normalize": False,
                            "rollout_rs": None, "rollout_rs_threshold": None})
    batch = DataProto({"old_log_probs": rollout + LOG_RATIO, "rollout_log_probs": rollout, "response_mask": MASK})
    metrics = apply_rollout_correction(batch, off)  # diagnostics only, as verl always logs them
    assert "rollout_is_weights" not in batch.batch and batch.batch["response_mask"] is MASK
    assert set(metrics) == {f"rollout_corr/{k}" for k in offpolicy_metrics(rollout, rollout, MASK)}


def test_bad_level_or_threshold_names_the_key():
    with pytest.raises(ValueError, match=r"rollout_correction.rollout_is='geo'"):
        rollout_is_weights(LOG_RATIO, MASK, "geo", 2.0)
    with pytest.raises(ValueError, match=r"rollout_is_threshold=0.0: must be > 0"):
        truncated_is_weights(LOG_RATIO, MASK, "token", 0.0)
