"""PF-PPO (algorithm.use_pf_ppo, verl's policy filtration): after GAE the batch is redrawn with replacement by a weight
of each sequence score; rows stay whole (tensors, non-tensors and batch-long meta lists move together)."""

import numpy as np
import pytest
import torch

from hybridrl.algorithms.advantages import pf_ppo_resample, pf_ppo_weights
from hybridrl.config import ConfigError, load_config
from hybridrl.protocol import DataProto


def verl_weights(scores, method, weight_pow):
    """verl's compute_pf_ppo_reweight_data.compute_weights, then its clamp (the specification)."""
    if method == "pow":
        w = torch.pow(torch.abs(scores), weight_pow)
    elif method == "max_min":
        w = torch.where((scores == scores.max()) | (scores == scores.min()), 1.0, 0.0)
    else:
        w = torch.where(scores == scores.max(), 0.4, 0.1)
    return torch.clamp(w + 1e-8, min=1e-8)


def batch(scores):
    n = len(scores)
    tokens = torch.zeros(n, 5)
    tokens[:, -1] = torch.as_tensor(scores, dtype=torch.float32)
    return DataProto.from_dict({"token_level_scores": tokens, "row": torch.arange(n)},
                               {"uid": np.array([f"u{i}" for i in range(n)], dtype=object)},
                               meta_info={"per_row": [f"m{i}" for i in range(n)], "temperature": 1.0})


@pytest.mark.parametrize("method,weight_pow", [("pow", 2.0), ("pow", 0.5), ("max_min", 2.0), ("max_random", 2.0)])
def test_weights_are_verls(method, weight_pow):
    scores = torch.tensor([0.0, -1.5, 2.0, 2.0, 0.25, -1.5, 1.0])
    torch.testing.assert_close(pf_ppo_weights(scores, method, weight_pow), verl_weights(scores, method, weight_pow))


def test_the_draw_keeps_rows_whole_and_follows_the_weights():
    data = batch([0.0, 1.0, -1.0, 0.5, 1.0, 0.0, -1.0, 0.5] * 8)
    out, metrics = pf_ppo_resample(data, "max_min", 2.0, torch.Generator().manual_seed(0))
    rows = out.batch["row"].tolist()
    assert len(out) == len(data) and set(out.batch["token_level_scores"][:, -1].tolist()) <= {1.0, -1.0}
    assert [int(u[1:]) for u in out.non_tensor_batch["uid"]] == rows
    assert out.meta_info["per_row"] == [f"m{r}" for r in rows] and out.meta_info["temperature"] == 1.0
    assert metrics == {"pf_ppo/unique_samples": float(len(set(rows))), "pf_ppo/samples": 64.0}
    again, _ = pf_ppo_resample(data, "max_min", 2.0, torch.Generator().manual_seed(0))
    assert again.batch["row"].tolist() == rows   # the trainer seeds the draw per step: resumable
    # pow with weight 2: a row of score 2 is drawn 4x as often as one of score 1 (large-sample frequencies)
    big = batch([1.0, 2.0] * 2000)
    counts = np.bincount(pf_ppo_resample(big, "pow", 2.0, torch.Generator().manual_seed(1))[0].batch["row"] % 2)
    assert 3.6 < counts[1] / counts[0] < 4.4


def test_pf_ppo_keys():
    with pytest.raises(ConfigError, match=r"'algorithm.pf_ppo.weight_pow' = 0 must be > 0"):
        load_config(overrides=["algorithm.use_pf_ppo=true", "algorithm.adv_estimator=gae",
                               "algorithm.pf_ppo.weight_pow=0"])
    with pytest.raises(ConfigError, match=r"'algorithm.pf_ppo.reweight_method'"):
        load_config(overrides=["algorithm.pf_ppo.reweight_method=top"])
    warnings = load_config(overrides=["algorithm.use_pf_ppo=true", "algorithm.adv_estimator=grpo"]).validate()
    assert any("PF-PPO resamples after GAE only" in w for w in warnings)
