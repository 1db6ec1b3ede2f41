"""actor.policy_loss.loss_mode selects the policy loss from verl's registry inside the actor update."""

import copy

import pytest
import torch
import transformers
from _training_tiny import make_ppo_batch, tiny_qwen2_config
from typed_sections import actor_section

from hybridrl.algorithms import POLICY_LOSS_REGISTRY
from hybridrl.config.errors import ConfigError
from hybridrl.config.loader import load_config
from hybridrl.config.sections.values import POLICY_LOSS_MODES
from hybridrl.training import DataParallelPPOActor
from hybridrl.training.micro_batches import UpdateBatches


@pytest.fixture(scope="module")
def base_model():
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(tiny_qwen2_config(), dtype=torch.float32)


def actor_cfg(loss_mode: str | None, **kw):
    """The actor section with `loss_mode` (None: the packaged default's)."""
    cfg = dict(ppo_epochs=1, clip_ratio=0.2, loss_agg_mode="token-mean", entropy_coeff=0.0, use_kl_loss=False,
               grad_clip=1e9)
    if loss_mode is not None:
        cfg["policy_loss"] = {"loss_mode": loss_mode}
    return actor_section(**(cfg | kw))


def update_delta(model, cfg, data, micro: int = 4):
    """Parameter change of one SGD(lr=1) update (one mini-batch of 4 rows, micro-batches of `micro`), i.e. minus the
    gradient; and the metrics."""
    model = copy.deepcopy(model)
    before = [p.detach().clone() for p in model.parameters()]
    metrics = DataParallelPPOActor(cfg, model, torch.optim.SGD(model.parameters(), lr=1.0),
                                   batches=UpdateBatches(4, micro, None)).update_policy(data)
    return torch.cat([(b - p.detach()).flatten() for b, p in zip(before, model.parameters())]), metrics


def off_policy_batch():
    """Old log-probs far from the tiny model's (~ -5.7): ratios well away from 1, where the losses differ."""
    data = make_ppo_batch(batch=4, seed=5)
    data.batch["old_log_probs"] = data.batch["old_log_probs"] - 0.3
    return data


def test_gspo_changes_the_update_and_vanilla_is_the_default(base_model):
    data = off_policy_batch()
    vanilla, m_vanilla = update_delta(base_model, actor_cfg("vanilla"), data)
    default, _ = update_delta(base_model, actor_cfg(None), data)
    gspo, m_gspo = update_delta(base_model, actor_cfg("gspo"), data)
    assert vanilla.abs().max() > 0 and gspo.abs().max() > 0
    torch.testing.assert_close(default, vanilla)
    assert not torch.allclose(gspo, vanilla, rtol=1e-3, atol=1e-7)
    assert m_gspo["actor/pg_clipfrac_lower"] == 0.0 and "actor/ppo_kl" in m_vanilla


@pytest.mark.parametrize("mode", ["gspo", "sapo", "geo_mean"])
def test_sequence_losses_accumulate_over_micro_batches_by_their_own_aggregation(base_model, mode):
    """gspo, sapo and geo_mean always average over sequences: micro-batches of 1 must give the one-micro-batch
    gradient even when loss_agg_mode (token-mean) would weight them by token counts."""
    data = off_policy_batch()
    one, metrics = update_delta(base_model, actor_cfg(mode), data, micro=4)
    four, _ = update_delta(base_model, actor_cfg(mode), data, micro=1)
    assert one.abs().max() > 0 and "actor/ppo_kl" in metrics
    torch.testing.assert_close(four, one, atol=1e-6, rtol=1e-4)


def test_unknown_loss_mode_is_refused_at_config_validation():
    with pytest.raises(ConfigError) as e:
        load_config(overrides=["actor_rollout_ref.actor.policy_loss.loss_mode=ppo2"])
    message = str(e.value)
    assert "actor_rollout_ref.actor.policy_loss.loss_mode" in message and "'ppo2'" in message
    assert all(mode in message for mode in POLICY_LOSS_MODES)


def test_the_allowed_modes_are_the_registered_losses():
    assert sorted(POLICY_LOSS_MODES) == sorted(POLICY_LOSS_REGISTRY)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_the_logged_loss_does_not_depend_on_the_micro_batch_size(base_model, mode):
    """actor/pg_loss (and entropy) are the mini-batch's loss, as the gradient sees it: micro-batches of 1 and of 4
    log the same values (a mean of per-micro-batch losses would not)."""
    data = off_policy_batch()
    cfg = actor_cfg("vanilla", loss_agg_mode=mode, entropy_coeff=0.01)
    _, one = update_delta(base_model, cfg, data, micro=4)
    _, four = update_delta(base_model, cfg, data, micro=1)
    for key in ("actor/pg_loss", "actor/entropy"):
        assert four[key] == pytest.approx(one[key], rel=1e-5, abs=1e-7), key
    assert one["actor/pg_loss"] != 0.0
