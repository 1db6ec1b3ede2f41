"""Partial rollouts in the update: tokens carried from older policies are weighed by truncated IS against their
rollout log-probs (the plan's level), so the loss differs from an on-policy batch's; on-policy tokens weigh 1."""

import copy

import torch
import transformers
from _training_tiny import make_ppo_batch, tiny_qwen2_config
from typed_sections import actor_section

from hybridrl.config.sections.algorithm import RolloutCorrectionConfig
from hybridrl.plan.partial_rollout import PartialRolloutPlan, rollout_correction
from hybridrl.training import DataParallelPPOActor
from hybridrl.training.micro_batches import UpdateBatches
from hybridrl.training.packed_attention import register_varlen_attention

CFG = actor_section(ppo_epochs=1, clip_ratio=0.2, loss_agg_mode="token-mean", entropy_coeff=0.0, use_kl_loss=False,
                    grad_clip=1e9)
BATCHES = UpdateBatches(mini_batch_rows=4, micro_rows=2, max_tokens=None)


def update(model, data):
    """(the parameter change of one SGD step, the update's metrics)."""
    model = copy.deepcopy(model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    metrics = DataParallelPPOActor(CFG, model, torch.optim.SGD(model.parameters(), lr=1.0), batches=BATCHES,
                                   use_remove_padding=True).update_policy(data)
    return {n: before[n] - p.detach() for n, p in model.named_parameters()}, metrics


def test_carried_tokens_are_weighed_by_truncated_is_and_on_policy_ones_are_not():
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(tiny_qwen2_config(), dtype=torch.float32)
    model.set_attn_implementation(register_varlen_attention())
    plan = PartialRolloutPlan(tokens_per_step=2, max_staleness=2, max_groups=4, group_multiple=1, rollout_is="token",
                              rollout_is_threshold=2.0)
    unset = RolloutCorrectionConfig(rollout_is=None, rollout_is_threshold=2.0, rollout_is_batch_normalize=False,
                                    rollout_rs=None, rollout_rs_threshold=None, bypass_mode=False,
                                    loss_type="ppo_clip")
    rc = rollout_correction(unset, plan)
    data = make_ppo_batch(batch=4, seed=3)
    data.batch.pop("old_log_probs")  # the plan's default: no old-log-prob pass, the update's own are the proximal ones
    data.meta_info["micro_batch_size"] = 4
    current = DataParallelPPOActor(CFG, copy.deepcopy(model), use_remove_padding=True).compute_log_prob(data)[0]
    data.meta_info["rollout_is"] = {"level": rc.rollout_is, "threshold": float(rc.rollout_is_threshold)}

    plain = data.select([k for k in data.batch])
    plain.meta_info = {k: v for k, v in data.meta_info.items() if k != "rollout_is"}
    on_policy = data.select([k for k in data.batch])
    on_policy.batch["rollout_log_probs"] = current.clone()
    carried = data.select([k for k in data.batch])
    older = current.clone()
    older[:, :2] += 0.7 * torch.tensor([1.0, -1.0])  # the first 2 tokens of each row came from an older policy
    carried.batch["rollout_log_probs"] = older

    g_plain, m_plain = update(model, plain)
    g_on, m_on = update(model, on_policy)
    g_off, m_off = update(model, carried)
    for name in g_plain:  # on-policy tokens: weight exp(0) = 1
        torch.testing.assert_close(g_on[name], g_plain[name], atol=1e-6, rtol=1e-5)
    assert m_off["actor/pg_loss"] != m_on["actor/pg_loss"]
    assert any(not torch.allclose(g_off[n], g_on[n], atol=1e-6) for n in g_on)
