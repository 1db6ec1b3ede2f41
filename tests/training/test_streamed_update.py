"""A streamed update (rows arriving in parts while the rollout goes on) gives the update of all rows at once."""

import copy

import pytest
import torch
import transformers
from _training_tiny import make_ppo_batch, tiny_qwen2_config
from typed_sections import actor_section

from hybridrl.protocol import DataProto
from hybridrl.training import DataParallelPPOActor
from hybridrl.training.micro_batches import UpdateBatches

ROWS = 8
PARTS = ([0, 1, 2], [3], [4, 5, 6, 7])   # uneven parts, in an order other than the rows'


@pytest.fixture(scope="module")
def base_model():
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(tiny_qwen2_config(), dtype=torch.float32)


def batch(own_old: bool) -> DataProto:
    data = make_ppo_batch(batch=ROWS, resp_len=5, seed=3)
    data.batch["rollout_log_probs"] = data.batch["old_log_probs"] - 0.05
    if own_old:
        data.batch.pop("old_log_probs")
    else:   # ratios away from 1, where clipping acts
        data.batch["old_log_probs"] = data.batch["old_log_probs"] - 0.3
    return data


def actor(model, optimizer: str, batches: UpdateBatches, **cfg):
    settings = dict(ppo_epochs=1, clip_ratio=0.2, loss_agg_mode="token-mean", entropy_coeff=0.0, use_kl_loss=False,
                    grad_clip=1e9)
    settings.update(cfg)
    # AdamW's first step moves each weight by lr * g / (|g| + eps): with torch's eps of 1e-8 a gradient near 1e-8
    # turns a summation-order difference of 1e-11 into a 1e-6 step difference (seen with transformers 5.25);
    # eps 1e-6 keeps the step a smooth function of the gradient, so the tolerance below tests the gradient
    opt = (torch.optim.SGD(model.parameters(), lr=1.0) if optimizer == "sgd"
           else torch.optim.AdamW(model.parameters(), lr=1e-3, eps=1e-6))
    return DataParallelPPOActor(actor_section(**settings), model, opt, batches=batches)


def whole(base, data, optimizer, batches, **cfg):
    model = copy.deepcopy(base)
    a = actor(model, optimizer, batches, **cfg)
    metrics = a.update_policy(data)
    return model, metrics, a.own_old_log_probs


def streamed(base, data, optimizer, batches, **cfg):
    model = copy.deepcopy(base)
    a = actor(model, optimizer, batches, **cfg)
    a.begin_streamed_update(ROWS, data.batch["responses"].shape[1])
    own = torch.zeros(data.batch["responses"].shape)
    for rows in PARTS:
        part = data.select_idxs(torch.tensor(rows))
        out = a.accumulate(part)
        if out is not None:
            own[rows] = out
    metrics = a.finish_streamed_update()
    return model, metrics, own


def assert_same_params(a, b):
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(p, q, atol=2e-6, rtol=1e-5, msg=name)


def changed(model, base) -> bool:
    return any(not torch.equal(p, q) for p, q in zip(model.parameters(), base.parameters()))


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                                  "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("own_old", [True, False])
def test_streamed_update_equals_the_whole_batch_update(base_model, mode, own_old):
    data = batch(own_old)
    batches = UpdateBatches(ROWS, 2, None)
    # SGD(lr=1): the parameter change is minus the gradient, so the gradients themselves must agree
    ref, m_ref, own_ref = whole(base_model, data, "sgd", batches, loss_agg_mode=mode)
    got, m_got, own_got = streamed(base_model, data, "sgd", batches, loss_agg_mode=mode)
    assert changed(ref, base_model)
    assert_same_params(got, ref)
    assert m_got["actor/grad_norm"] == pytest.approx(m_ref["actor/grad_norm"], rel=1e-5)
    if own_old:
        torch.testing.assert_close(own_got, own_ref, atol=1e-6, rtol=1e-6)


def test_streamed_update_with_regularisers_clipping_adamw_and_token_budgets(base_model):
    """KL and entropy terms, an active gradient clip (applied after the gradient is put on the true normaliser),
    AdamW, micro-batches by token budget, and the in-update rollout correction."""
    data = batch(own_old=True)
    data.meta_info["rollout_is"] = {"level": "token", "threshold": 2.0}
    cfg = dict(use_kl_loss=True, kl_loss_coef=0.1, entropy_coeff=0.01, grad_clip=0.05)
    batches = UpdateBatches(ROWS, None, 24)
    ref, m_ref, _ = whole(base_model, data, "adamw", batches, **cfg)
    got, m_got, _ = streamed(base_model, data, "adamw", batches, **cfg)
    assert m_ref["actor/grad_norm"] > 0.05    # the clip acted
    assert_same_params(got, ref)
    assert m_got["actor/grad_norm"] == pytest.approx(m_ref["actor/grad_norm"], rel=1e-5)


def test_gspo_streams_by_its_own_aggregation(base_model):
    data = batch(own_old=False)
    batches = UpdateBatches(ROWS, 3, None)
    ref, _, _ = whole(base_model, data, "sgd", batches, policy_loss={"loss_mode": "gspo"})
    got, _, _ = streamed(base_model, data, "sgd", batches, policy_loss={"loss_mode": "gspo"})
    assert_same_params(got, ref)


def test_a_missing_rescale_would_be_caught(base_model):
    """The check above can fail: without putting the gradient on the true normaliser at the end (the provisional
    one kept), the update differs."""
    data = batch(own_old=True)
    batches = UpdateBatches(ROWS, 2, None)
    ref, _, _ = whole(base_model, data, "sgd", batches)
    model = copy.deepcopy(base_model)
    a = actor(model, "sgd", batches)
    a.begin_streamed_update(ROWS, data.batch["responses"].shape[1])
    for rows in PARTS:
        a.accumulate(data.select_idxs(torch.tensor(rows)))
    a._stream.count = torch.tensor(a._stream.provisional)
    a.finish_streamed_update()
    with pytest.raises(AssertionError):
        assert_same_params(model, ref)


def test_refusals(base_model):
    data = batch(own_old=True)
    a = actor(copy.deepcopy(base_model), "sgd", UpdateBatches(ROWS, 2, None), ppo_epochs=2)
    with pytest.raises(ValueError, match="ppo_epochs=2"):
        a.begin_streamed_update(ROWS, 5)
    a = actor(copy.deepcopy(base_model), "sgd", UpdateBatches(ROWS, 2, None), entropy_coeff=0.01,
              policy_loss={"loss_mode": "gspo"})
    with pytest.raises(ValueError, match="seq-mean-token-mean"):
        a.begin_streamed_update(ROWS, 5)
    a = actor(copy.deepcopy(base_model), "sgd", UpdateBatches(ROWS, 2, None))
    with pytest.raises(RuntimeError, match="begin_streamed_update"):
        a.accumulate(data)


def test_loss_scale_factor_divides_the_seq_mean_token_sum_norm_losses(base_model):
    """verl's actor.loss_scale_factor: the policy, entropy and KL losses of seq-mean-token-sum-norm are divided by it
    instead of the responses' width (5 here), so twice the width halves the SGD step."""
    data = batch(own_old=False)
    data.batch["ref_log_prob"] = data.batch["old_log_probs"] + 0.1
    batches = UpdateBatches(ROWS, 2, None)
    cfg = dict(loss_agg_mode="seq-mean-token-sum-norm", entropy_coeff=0.01, use_kl_loss=True, kl_loss_coef=0.1)
    default, _, _ = whole(base_model, data, "sgd", batches, **cfg)
    same, _, _ = whole(base_model, data, "sgd", batches, loss_scale_factor=5, **cfg)
    half, _, _ = whole(base_model, data, "sgd", batches, loss_scale_factor=10, **cfg)
    assert_same_params(same, default)
    for p, q, b in zip(half.parameters(), default.parameters(), base_model.parameters()):
        torch.testing.assert_close(p - b, (q - b) / 2, atol=1e-7, rtol=1e-4)
