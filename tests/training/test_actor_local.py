"""Actor / critic on a plain (unsharded) tiny Qwen2: packing, dynamic bsz, accumulation, a loss-lowering step."""

import copy

import pytest
import torch
import transformers
from _training_tiny import make_ppo_batch, tiny_qwen2_config
from typed_sections import actor_section, critic_section

from hybridrl.algorithms import compute_policy_loss
from hybridrl.training import DataParallelPPOActor, DataParallelPPOCritic
from hybridrl.training.micro_batches import UpdateBatches
from hybridrl.training.packed_attention import register_varlen_attention


@pytest.fixture(scope="module")
def base_model():
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(tiny_qwen2_config(), dtype=torch.float32)
    model.set_attn_implementation(register_varlen_attention())
    return model


def actor_cfg(**kw):
    return actor_section(**{**dict(ppo_epochs=1, clip_ratio=0.2, loss_agg_mode="token-mean", entropy_coeff=0.0,
                                   use_kl_loss=False, grad_clip=1e9), **kw})


BATCHES = UpdateBatches(mini_batch_rows=4, micro_rows=4, max_tokens=None)


def test_packed_equals_padded_and_dynamic_equals_fixed(base_model):
    data = make_ppo_batch(batch=5, temperature=0.7)
    data.meta_info.update(micro_batch_size=2)
    packed = DataParallelPPOActor(actor_cfg(), base_model, use_remove_padding=True)
    padded = DataParallelPPOActor(actor_cfg(), base_model, use_remove_padding=False)
    lp_packed, ent_packed = packed.compute_log_prob(data, calculate_entropy=True)
    lp_padded, ent_padded = padded.compute_log_prob(data, calculate_entropy=True)
    mask = data.batch["response_mask"].bool()
    assert lp_packed.shape == (5, 5) and lp_packed.device.type == "cpu"
    torch.testing.assert_close(lp_packed[mask], lp_padded[mask], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent_packed[mask], ent_padded[mask], atol=1e-5, rtol=1e-5)
    dyn = copy.copy(data)
    dyn.meta_info = dict(data.meta_info, use_dynamic_bsz=True, max_token_len=24)
    lp_dyn, _ = packed.compute_log_prob(dyn)
    torch.testing.assert_close(lp_dyn[mask], lp_packed[mask], atol=1e-5, rtol=1e-5)
    # temperature is applied: T=0.7 differs from T=1.0
    data.meta_info["temperature"] = 1.0
    assert not torch.allclose(packed.compute_log_prob(data)[0][mask], lp_packed[mask])


def test_packed_forward_builds_no_mask(base_model, monkeypatch):
    """transformers' packed-row mask detection synchronises the host with the GPU (`.all()` on a device tensor) in
    every forward; the packed path hands it an empty 4-D mask instead, so it never runs, and the log-probs still
    equal the padded path's. A no_mask() without cu_seq_lens is refused."""
    import transformers.masking_utils as masking

    from hybridrl.training.packed_attention import mask_unread, no_mask, varlen_attention_forward

    data = make_ppo_batch(batch=3, temperature=1.0)
    data.meta_info.update(micro_batch_size=3)
    padded = DataParallelPPOActor(actor_cfg(), base_model, use_remove_padding=False).compute_log_prob(data)[0]
    calls = []
    real = masking.find_packed_sequence_indices
    monkeypatch.setattr(masking, "find_packed_sequence_indices", lambda *a, **k: calls.append(1) or real(*a, **k))
    packed = DataParallelPPOActor(actor_cfg(), base_model, use_remove_padding=True).compute_log_prob(data)[0]
    mask = data.batch["response_mask"].bool()
    assert not calls
    torch.testing.assert_close(packed[mask], padded[mask], atol=1e-5, rtol=1e-5)
    q = torch.zeros(1, 2, 3, 4)
    with pytest.raises(ValueError, match="no_mask"):
        varlen_attention_forward(None, q, q, q, no_mask())
    # only where this module's attention runs and no HF MoE loss reads the mask (HF's sdpa builds it from the row)
    sdpa = transformers.AutoModelForCausalLM.from_config(tiny_qwen2_config(), attn_implementation="sdpa")
    assert mask_unread(base_model) and not mask_unread(sdpa)


def _grads_after_update(model, cfg, data, fused_head: bool | None = None, batches: UpdateBatches = BATCHES):
    model = copy.deepcopy(model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    actor = DataParallelPPOActor(cfg, model, torch.optim.SGD(model.parameters(), lr=1.0), batches=batches,
                                 use_remove_padding=True)
    if fused_head is not None:
        actor.fused_head = fused_head
    metrics = actor.update_policy(data)
    return {n: before[n] - p.detach() for n, p in model.named_parameters()}, metrics


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_grad_accumulation_1x4_equals_4x1(base_model, mode):
    data = make_ppo_batch(batch=4, seed=1)
    g_one, m_one = _grads_after_update(base_model, actor_cfg(loss_agg_mode=mode), data,
                                       batches=UpdateBatches(4, 4, None))
    g_four, m_four = _grads_after_update(base_model, actor_cfg(loss_agg_mode=mode), data,
                                         batches=UpdateBatches(4, 1, None))
    g_dyn, _ = _grads_after_update(base_model, actor_cfg(loss_agg_mode=mode), data,
                                   batches=UpdateBatches(4, None, 20))
    assert any(g.abs().max() > 0 for g in g_one.values())
    for name in g_one:
        torch.testing.assert_close(g_four[name], g_one[name], atol=1e-6, rtol=1e-4)
        torch.testing.assert_close(g_dyn[name], g_one[name], atol=1e-6, rtol=1e-4)
    assert m_one["actor/grad_norm"] == pytest.approx(m_four["actor/grad_norm"], rel=1e-4)


def _pg_loss(actor, data):
    lp, _ = actor.compute_log_prob(dict_meta(data))
    return compute_policy_loss(data.batch["old_log_probs"], lp, data.batch["advantages"],
                               data.batch["response_mask"], cliprange=0.2)[0].item()


def dict_meta(data):
    data.meta_info.setdefault("micro_batch_size", 4)
    return data


def test_update_lowers_loss_and_reports_verl_metrics(base_model):
    model = copy.deepcopy(base_model)
    data = make_ppo_batch(batch=4, seed=2)
    actor = DataParallelPPOActor(actor_cfg(entropy_coeff=0.01, use_kl_loss=True, kl_loss_type="low_var_kl",
                                           grad_clip=1.0),
                                 model, torch.optim.AdamW(model.parameters(), lr=1e-3),
                                 batches=UpdateBatches(4, 2, None), use_remove_padding=True)
    data.batch["old_log_probs"] = actor.compute_log_prob(dict_meta(data))[0]
    before = _pg_loss(actor, data)
    metrics = actor.update_policy(data)
    after = _pg_loss(actor, data)
    assert after < before
    for key in ("actor/pg_loss", "actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl", "actor/kl_loss",
                "actor/entropy", "actor/grad_norm", "actor/lr"):
        assert key in metrics, key
    assert metrics["actor/lr"] == 1e-3 and metrics["actor/grad_norm_nonfinite_skips"] == 0.0


def test_entropy_bonus_gradient_is_the_same_on_the_chunked_and_plain_heads(base_model):
    """entropy_coeff != 0: the entropy carries its gradient on both heads (they agree), and it changes the update
    against entropy_coeff 0 (where the entropy is only measured)."""
    data = make_ppo_batch(batch=4, seed=4)
    grads = {(coeff, fused): _grads_after_update(base_model, actor_cfg(entropy_coeff=coeff), data, fused)[0]
             for coeff in (0.0, 0.5) for fused in (True, False)}
    for name, g in grads[0.5, False].items():
        torch.testing.assert_close(grads[0.5, True][name], g, atol=1e-6, rtol=1e-4)
        torch.testing.assert_close(grads[0.0, True][name], grads[0.0, False][name], atol=1e-6, rtol=1e-4)
    assert max((grads[0.5, True][n] - grads[0.0, True][n]).abs().max().item() for n in grads[0.5, True]) > 1e-4


def test_nonfinite_grad_skips_step_and_counts(base_model):
    model = copy.deepcopy(base_model)
    data = make_ppo_batch(batch=2, seed=3)
    data.batch["advantages"][0, 0] = float("nan")
    actor = DataParallelPPOActor(actor_cfg(), model, torch.optim.SGD(model.parameters(), lr=1.0),
                                 batches=UpdateBatches(2, 4, None), use_remove_padding=True)
    before = [p.detach().clone() for p in model.parameters()]
    metrics = actor.update_policy(data)
    assert metrics["actor/grad_norm_nonfinite_skips"] == 1.0 and "actor/grad_norm" not in metrics
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_kl_loss_without_ref_log_prob_is_a_clear_error(base_model):
    data = make_ppo_batch(batch=2)
    data.pop(["ref_log_prob"])
    actor = DataParallelPPOActor(actor_cfg(use_kl_loss=True), base_model, torch.optim.SGD(base_model.parameters(), 0.0),
                                 batches=BATCHES, use_remove_padding=True)
    with pytest.raises(ValueError, match="ref_log_prob"):
        actor.update_policy(data)


def test_critic_values_and_update_lower_value_loss():
    torch.manual_seed(0)
    cfg = tiny_qwen2_config()
    cfg.num_labels, cfg.classifier_dropout = 1, 0.0
    model = transformers.AutoModelForTokenClassification.from_config(cfg, dtype=torch.float32)
    model.set_attn_implementation(register_varlen_attention())
    data = make_ppo_batch(batch=4, seed=4)
    data.meta_info["micro_batch_size"] = 3
    ccfg = critic_section(cliprange_value=100.0, grad_clip=1.0, loss_agg_mode="token-mean")
    critic = DataParallelPPOCritic(ccfg, model, torch.optim.AdamW(model.parameters(), lr=1e-2),
                                   batches=UpdateBatches(4, 2, None), use_remove_padding=True)
    padded = DataParallelPPOCritic(ccfg, model, use_remove_padding=False)
    values = critic.compute_values(data)
    mask = data.batch["response_mask"]
    torch.testing.assert_close(values, padded.compute_values(data), atol=1e-5, rtol=1e-5)
    assert torch.all(values[mask == 0] == 0)
    data.batch["values"] = values
    first = critic.update_critic(data)
    for _ in range(4):
        last = critic.update_critic(data)
    assert last["critic/vf_loss"] < first["critic/vf_loss"]
    assert {"critic/vf_clipfrac", "critic/vpred_mean", "critic/grad_norm", "critic/lr"} <= set(last)


def test_should_keep_unsharded_decision():
    """The unshard-once rule: never for one micro-batch or a model FSDP was not applied to; true/false obeyed;
    auto by the unsharded size against a quarter of the device's memory; anything else is an error."""
    from hybridrl.training.fsdp import AUTO_UNSHARD_MAX_FRACTION, should_keep_unsharded

    cpu = torch.device("cpu")
    model = torch.nn.Linear(4, 4)
    assert not should_keep_unsharded(model, True, 4, cpu)  # no FSDP applied
    model.fsdp_unsharded_bytes = 1 << 20
    assert not should_keep_unsharded(model, True, 1, cpu)
    assert should_keep_unsharded(model, True, 2, cpu)
    assert not should_keep_unsharded(model, False, 2, cpu)
    assert should_keep_unsharded(model, "auto", 2, cpu)
    import os

    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    model.fsdp_unsharded_bytes = int(AUTO_UNSHARD_MAX_FRACTION * host) + 1
    assert not should_keep_unsharded(model, "auto", 2, cpu)
    with pytest.raises(ValueError, match="unshard_once='sometimes'"):
        should_keep_unsharded(model, "sometimes", 2, cpu)


@pytest.mark.parametrize("fused_head", [True, False])
def test_update_without_old_log_probs_equals_update_with_recomputed_ones(base_model, fused_head):
    """One on-policy mini-batch: old log-probs taken from the update's own forward (detached) give the same
    gradient as a separate old-log-prob pass, and the step's entropy is reported from the update (measured
    without a gradient at entropy_coeff 0, on the chunked head and on the plain one)."""
    data = make_ppo_batch(batch=4, seed=3)
    actor = DataParallelPPOActor(actor_cfg(), copy.deepcopy(base_model), use_remove_padding=True)
    data.batch["old_log_probs"] = actor.compute_log_prob(dict_meta(data))[0]
    g_pass, _ = _grads_after_update(base_model, actor_cfg(), data, fused_head)
    own = copy.copy(data)
    own.batch = data.batch.exclude("old_log_probs") if hasattr(data.batch, "exclude") else \
        {k: v for k, v in data.batch.items() if k != "old_log_probs"}
    g_own, metrics = _grads_after_update(base_model, actor_cfg(), own, fused_head)
    assert any(g.abs().max() > 0 for g in g_own.values())
    for name in g_pass:
        torch.testing.assert_close(g_own[name], g_pass[name], atol=1e-6, rtol=1e-4)
    assert metrics["actor/ppo_kl"] == 0.0 and metrics["actor/pg_clipfrac"] == 0.0 and metrics["actor/entropy"] > 0
    # the update hands its own log-probs back (input row order, also when shuffled / dynamically micro-batched)
    for cfg, batches in ((actor_cfg(shuffle=True), BATCHES), (actor_cfg(), UpdateBatches(4, None, 20))):
        model = copy.deepcopy(base_model)
        actor = DataParallelPPOActor(cfg, model, torch.optim.SGD(model.parameters(), lr=0.0), batches=batches,
                                     use_remove_padding=True)
        actor.update_policy(own)
        mask = data.batch["response_mask"].bool()
        torch.testing.assert_close(actor.own_old_log_probs[mask], data.batch["old_log_probs"][mask],
                                   atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_is_weights_from_own_log_probs_equal_precomputed_ones(base_model, level):
    """No old-log-prob pass: the actor makes the truncated IS weights per micro-batch from its own detached
    log-probs; the gradient equals that of an update given the old log-probs and the driver's weights."""
    from hybridrl.algorithms.rollout_correction import rollout_is_weights

    data = make_ppo_batch(batch=4, seed=5)
    data.batch.pop("old_log_probs")
    actor = DataParallelPPOActor(actor_cfg(), copy.deepcopy(base_model), use_remove_padding=True)
    old = actor.compute_log_prob(dict_meta(data))[0]
    mask = data.batch["response_mask"]
    # the engine's log-probs off by ±0.4 per token: some weights exceed the threshold 1.2, some fall below 1
    shift = 0.4 * torch.sign(torch.randn(old.shape, generator=torch.Generator().manual_seed(0))) * mask
    data.batch["rollout_log_probs"] = old + shift
    weights, metrics = rollout_is_weights(old - data.batch["rollout_log_probs"], mask, level, 1.2)
    assert metrics["rollout_is_ratio_fraction_high"] > 0 and (weights[mask.bool()] < 1).any()
    given = data.select()
    given.batch.update(old_log_probs=old, rollout_is_weights=weights)
    g_given, _ = _grads_after_update(base_model, actor_cfg(), given)
    g_plain, _ = _grads_after_update(base_model, actor_cfg(), given.select(
        [k for k in given.batch if k != "rollout_is_weights"]))
    data.meta_info["rollout_is"] = {"level": level, "threshold": 1.2}
    g_own, _ = _grads_after_update(base_model, actor_cfg(), data, batches=UpdateBatches(4, 1, None))
    for name in g_given:
        torch.testing.assert_close(g_own[name], g_given[name], atol=1e-6, rtol=1e-4)
    assert any(not torch.allclose(g_plain[n], g_given[n], atol=1e-6) for n in g_given)  # the weights matter


def test_the_offloaded_optimizer_state_returns_after_each_mini_batchs_backward(base_model):
    """`before_optimizer_step` (the worker hands it the hybrid engine's before_update) runs once per mini-batch,
    after its last backward and before its AdamW step. With the state offloaded, the first mini-batch's forwards and
    backwards run without it; the weights come out as with the state resident throughout."""
    from hybridrl.hybrid.engine import HybridEngine
    from hybridrl.training.offload import offload_optimizer

    data = make_ppo_batch(batch=4, seed=2)

    def update(offloaded: bool):
        model = copy.deepcopy(base_model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        # two mini-batches of 2 rows, each two micro-batches of 1 row
        actor = DataParallelPPOActor(actor_cfg(), model, opt, batches=UpdateBatches(2, 1, None),
                                     use_remove_padding=True)
        actor.update_policy(data)   # the first update creates the AdamW state
        hybrid = object.__new__(HybridEngine)   # only what before_update reads
        hybrid.optimizer, hybrid.device, hybrid._optimizer_on_cpu = opt, torch.device("cpu"), False
        if offloaded:
            offload_optimizer(opt)
            hybrid._optimizer_on_cpu = True
        forwards, calls, metrics = [], [], {}
        model.model.register_forward_hook(lambda *a: forwards.append(1))

        def before_step():
            calls.append((len(forwards), all(p.grad is not None for p in model.parameters()),
                          hybrid._optimizer_on_cpu))
            hybrid.before_update(metrics)

        actor.before_optimizer_step = before_step
        actor.update_policy(data)
        return calls, metrics, {n: p.detach().clone() for n, p in model.named_parameters()}

    calls, metrics, weights = update(offloaded=True)
    assert calls == [(2, True, True), (4, True, False)]
    assert set(metrics) == {"timing_s/switch_to_train/load_optimizer"}
    resident_calls, resident_metrics, resident = update(offloaded=False)
    assert resident_calls == [(2, True, False), (4, True, False)] and resident_metrics == {}
    for name, w in weights.items():
        assert torch.equal(w, resident[name]), name


def _bypass_batch(base_model, seed):
    """A batch without old log-probs; the actor's own log-probs; rollout log-probs that are those with about half the
    tokens shifted by ±0.3."""
    data = make_ppo_batch(batch=4, seed=seed)
    data.batch.pop("old_log_probs")
    own = DataParallelPPOActor(actor_cfg(), copy.deepcopy(base_model), use_remove_padding=True).compute_log_prob(
        dict_meta(data))[0]
    mask = data.batch["response_mask"]
    noise = torch.randn(own.shape, generator=torch.Generator().manual_seed(seed))
    shift = 0.3 * torch.sign(noise) * (noise.abs() > 0.6) * mask   # about half the tokens shifted by ±0.3
    return data, own, own + shift


@pytest.mark.parametrize("batches", [UpdateBatches(2, 1, None), UpdateBatches(4, None, 20)])
def test_bypass_ppo_clip_is_the_update_with_the_rollouts_log_probs_as_old_ones(base_model, batches):
    """bypass_mode, ppo_clip, no rejection: the gradient of an update given old_log_probs = rollout_log_probs, at
    two mini-batches (off-policy for the second) and with token-budgeted micro-batches."""
    data, _, rollout = _bypass_batch(base_model, seed=7)
    data.batch["rollout_log_probs"] = rollout
    given = data.select([k for k in data.batch if k != "rollout_log_probs"])
    given.batch["old_log_probs"] = rollout
    cfg = actor_cfg(ppo_mini_batch_size=2)
    g_given, m_given = _grads_after_update(base_model, cfg, given, batches=batches)
    data.meta_info["bypass"] = {"loss_type": "ppo_clip"}
    g_bypass, m_bypass = _grads_after_update(base_model, cfg, data, batches=batches)
    assert m_given["actor/pg_clipfrac"] > 0   # the ±0.3 shift is outside the clip range for some tokens
    for name in g_given:
        torch.testing.assert_close(g_bypass[name], g_given[name], atol=1e-6, rtol=1e-4)
    assert m_bypass["actor/ppo_kl"] == pytest.approx(m_given["actor/ppo_kl"], rel=1e-5)


def test_bypass_rejection_drops_tokens_from_the_loss_not_from_its_normaliser(base_model):
    """With rejection, the gradient is that of the update restricted to the kept tokens, times kept / all tokens;
    the update hands back its own log-probs for the driver's metrics."""
    from hybridrl.algorithms.rollout_correction import rejection_mask

    data, own, rollout = _bypass_batch(base_model, seed=8)
    data.batch["rollout_log_probs"] = rollout
    mask = data.batch["response_mask"]
    kept, _ = rejection_mask(own - rollout, mask, "token_k1", 1.2)   # |shift| 0.3 > log 1.2: the shifted go
    assert 0 < kept.sum() < mask.sum()
    narrowed = data.select([k for k in data.batch if k not in ("rollout_log_probs", "response_mask")])
    narrowed.batch.update(old_log_probs=rollout, response_mask=kept)
    g_kept, _ = _grads_after_update(base_model, actor_cfg(), narrowed, batches=UpdateBatches(4, 2, None))
    data.meta_info["bypass"] = {"loss_type": "ppo_clip", "rollout_rs": "token_k1", "rollout_rs_threshold": 1.2}
    model = copy.deepcopy(base_model)
    actor = DataParallelPPOActor(actor_cfg(), model, torch.optim.SGD(model.parameters(), lr=1.0),
                                 batches=UpdateBatches(4, 2, None), use_remove_padding=True)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    actor.update_policy(data)
    share = float(kept.sum() / mask.sum())
    for name, p in model.named_parameters():
        torch.testing.assert_close(before[name] - p.detach(), g_kept[name] * share, atol=1e-6, rtol=1e-4)
    torch.testing.assert_close(actor.own_old_log_probs[mask.bool()], own[mask.bool()], atol=1e-5, rtol=1e-5)


def test_bypass_losses_agree_on_policy_and_differ_off_it(base_model):
    """With the rollout's log-probs equal to the actor's, ppo_clip (ratio 1) and reinforce (weight 1) give the
    on-policy gradient; shifted, they differ."""
    data, own, rollout = _bypass_batch(base_model, seed=9)
    grads = {}
    for name, lp in (("on", own), ("off", rollout)):
        data.batch["rollout_log_probs"] = lp
        for loss_type in ("ppo_clip", "reinforce"):
            data.meta_info["bypass"] = {"loss_type": loss_type, "rollout_is": "token", "rollout_is_threshold": 2.0}
            grads[name, loss_type] = _grads_after_update(base_model, actor_cfg(), data)[0]
    for n in grads["on", "ppo_clip"]:
        torch.testing.assert_close(grads["on", "reinforce"][n], grads["on", "ppo_clip"][n], atol=1e-6, rtol=1e-4)
    assert any(not torch.allclose(grads["off", "reinforce"][n], grads["off", "ppo_clip"][n], atol=1e-6)
               for n in grads["off", "ppo_clip"])


def test_bypass_with_an_old_log_prob_pass_is_refused(base_model):
    data = make_ppo_batch(batch=4, seed=1)
    data.batch["rollout_log_probs"] = data.batch["old_log_probs"]
    data.meta_info["bypass"] = {"loss_type": "ppo_clip"}
    with pytest.raises(ValueError, match="bypass_mode takes the rollout's log-probs.*'old_log_probs'"):
        _grads_after_update(base_model, actor_cfg(), data)


@pytest.mark.parametrize("packed", [True, False])
def test_sum_pi_squared_of_the_response_tokens_on_both_heads(base_model, packed):
    """compute_log_prob_stats' Σπ² is Σ softmax(logits / T)² of the positions that predict each response token, on the
    fused (chunked) head and the plain one; padding is 0 and the log-probs are unchanged by asking for it."""
    data = dict_meta(make_ppo_batch(batch=4, seed=11, temperature=0.8))
    actor = DataParallelPPOActor(actor_cfg(), copy.deepcopy(base_model), use_remove_padding=packed)
    stats = {}
    for fused in (True, False):
        actor.fused_head = fused
        stats[fused] = actor.compute_log_prob_stats(data, calculate_entropy=True, calculate_sum_pi_squared=True)
    with torch.no_grad():
        logits = base_model(input_ids=data.batch["input_ids"], attention_mask=data.batch["attention_mask"],
                            position_ids=data.batch["position_ids"]).logits
    resp = data.batch["responses"].shape[1]
    expected = (torch.softmax(logits[:, -resp - 1:-1].float() / 0.8, -1) ** 2).sum(-1) * data.batch["response_mask"]
    for fused in (True, False):
        torch.testing.assert_close(stats[fused]["sum_pi_squared"] * data.batch["response_mask"], expected, atol=1e-5,
                                   rtol=1e-4)
    torch.testing.assert_close(stats[True]["log_probs"], actor.compute_log_prob(data)[0], atol=1e-6, rtol=1e-6)
    assert set(actor.compute_log_prob_stats(data)) == {"log_probs"}
