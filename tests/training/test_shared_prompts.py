"""Shared-prompt forwards (actor.use_prefix_grouper): each prompt of a micro-batch packed once, then every response
that follows it. The layout, and log-probs, entropies and one update's gradients equal to the unshared forwards."""

import copy

import pytest
import torch
import transformers
from _training_tiny import tiny_qwen2_config
from typed_sections import actor_section, critic_section

from hybridrl.protocol import DataProto
from hybridrl.training import DataParallelPPOActor
from hybridrl.training.micro_batches import UpdateBatches
from hybridrl.training.packed_attention import register_varlen_attention
from hybridrl.training.packing import pack_inputs


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = transformers.AutoModelForCausalLM.from_config(tiny_qwen2_config(), dtype=torch.float32)
    m.set_attn_implementation(register_varlen_attention())
    return m


def grouped_batch(prompt_rows=(0, 1, 0, 2, 1, 0, 3), prompt_len=7, resp_len=6, seed=0) -> DataProto:
    """Rows whose prompts repeat (row i has prompt prompt_rows[i]; the groups are not adjacent), left-padded prompts
    of different lengths, right-padded responses of different lengths (one empty)."""
    g = torch.Generator().manual_seed(seed)
    kinds = max(prompt_rows) + 1
    prompts = torch.randint(3, 300, (kinds, prompt_len), generator=g)
    pmask = torch.ones(kinds, prompt_len, dtype=torch.long)
    for k in range(kinds):
        pmask[k, : (2 * k) % prompt_len] = 0
    prompts[pmask == 0] = 0
    idx = torch.tensor(prompt_rows)
    rows = len(prompt_rows)
    responses = torch.randint(3, 300, (rows, resp_len), generator=g)
    rmask = torch.ones(rows, resp_len, dtype=torch.long)
    for i in range(rows):
        rmask[i, resp_len - (i % resp_len):] = 0
    rmask[3] = 0
    responses[rmask == 0] = 0
    attn = torch.cat([pmask[idx], rmask], 1)
    return DataProto.from_dict({
        "responses": responses, "input_ids": torch.cat([prompts[idx], responses], 1), "attention_mask": attn,
        "position_ids": (attn.cumsum(1) - 1).clamp(min=0), "response_mask": rmask.float(),
        "advantages": torch.randn(rows, resp_len, generator=g)}, meta_info={"temperature": 0.8})


def test_pack_inputs_puts_each_prompt_once_then_its_rows_responses():
    ids = torch.tensor([[0, 5, 6, 1, 2], [7, 8, 9, 3, 0], [0, 5, 6, 4, 0]])
    mask = (ids != 0).long()
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    packed = pack_inputs(ids, mask, pos, prompt_len=3)
    # document 0: rows 0 and 2 (prompt [5, 6]), then their responses; document 1: row 1
    assert packed.input_ids.tolist() == [[5, 6, 1, 2, 4, 7, 8, 9, 3]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 2, 0, 1, 2, 3]]
    assert packed.cu_seqlens.tolist() == [0, 5, 9] and packed.max_seqlen == 5
    assert packed.shared.is_prompt.tolist() == [True, True, False, False, False, True, True, True, False]
    assert packed.shared.segment.tolist() == [3, 3, 0, 0, 2, 4, 4, 4, 1]
    # row 2's prompt positions map to row 0's copy; padding maps nowhere
    assert packed.packed_of_flat.view(3, 5).tolist() == [[-1, 0, 1, 2, 3], [5, 6, 7, 8, -1], [-1, 0, 1, 4, -1]]
    # without sharing: one document per row, as before
    plain = pack_inputs(ids, mask, pos)
    assert plain.shared is None and plain.cu_seqlens.tolist() == [0, 4, 8, 11]


def test_rows_equal_only_in_tokens_but_not_padding_do_not_share():
    ids = torch.tensor([[0, 5, 6, 1], [5, 6, 0, 2]])      # same prompt tokens, different padding: no sharing
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 0, 1]])
    packed = pack_inputs(ids, mask, (mask.cumsum(1) - 1).clamp(min=0), prompt_len=3)
    assert packed.cu_seqlens.tolist() == [0, 3, 6]


@pytest.mark.parametrize("fused_head", [True, False])
def test_shared_log_probs_and_entropy_equal_unshared_and_padded(model, fused_head):
    data = grouped_batch()
    data.meta_info["micro_batch_size"] = 7
    out = {}
    for name, kw in {"shared": dict(use_remove_padding=False, share_prompts=True),
                     "packed": dict(use_remove_padding=True), "padded": dict(use_remove_padding=False)}.items():
        actor = DataParallelPPOActor(actor_section(), model, **kw)
        actor.fused_head = fused_head
        out[name] = actor.compute_log_prob(data, calculate_entropy=True)
    mask = data.batch["response_mask"].bool()
    for other in ("packed", "padded"):
        torch.testing.assert_close(out["shared"][0][mask], out[other][0][mask], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out["shared"][1][mask], out[other][1][mask], atol=1e-5, rtol=1e-5)


def _update_grads(model, data, share: bool, micro: int):
    model = copy.deepcopy(model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    cfg = actor_section(ppo_epochs=1, clip_ratio=0.2, loss_agg_mode="token-mean", entropy_coeff=0.01,
                        use_kl_loss=False, grad_clip=1e9)
    actor = DataParallelPPOActor(cfg, model, torch.optim.SGD(model.parameters(), lr=1.0),
                                 batches=UpdateBatches(len(data), micro, None), use_remove_padding=True,
                                 share_prompts=share)
    metrics = actor.update_policy(data)
    return {n: before[n] - p.detach() for n, p in model.named_parameters()}, metrics, actor.own_old_log_probs


@pytest.mark.parametrize("micro", [7, 3])
def test_update_with_shared_prompts_has_the_unshared_gradient(model, micro):
    data = grouped_batch(seed=1)
    g_shared, m_shared, lp_shared = _update_grads(model, data, True, micro)
    g_plain, m_plain, lp_plain = _update_grads(model, data, False, micro)
    assert any(g.abs().max() > 0 for g in g_shared.values())
    for name in g_plain:
        torch.testing.assert_close(g_shared[name], g_plain[name], atol=1e-6, rtol=1e-4)
    torch.testing.assert_close(lp_shared, lp_plain, atol=1e-5, rtol=1e-5)
    assert m_shared["actor/entropy"] == pytest.approx(m_plain["actor/entropy"], rel=1e-5)


def test_shared_prompts_refuse_ulysses(model):
    from hybridrl.training.response_forward import forward_response_logits

    data = grouped_batch()
    b = data.batch
    with pytest.raises(ValueError, match="use_prefix_grouper"):
        forward_response_logits(model, b["input_ids"], b["attention_mask"], b["position_ids"], 6, True,
                                sp_group=object(), share_prompts=True)


def test_dynamic_micro_batches_keep_a_prompts_rows_together_and_count_it_once():
    from hybridrl.training.token_bins import rearrange_prompt_groups

    groups = [[0, 1, 2, 3], [4, 5], [6]]
    prompt_lens, resp = [10, 30, 5], [4, 4, 4, 4, 6, 6, 20]
    bins = rearrange_prompt_groups(groups, prompt_lens, resp, max_token_len=42)
    assert sorted(r for b in bins for r in b) == list(range(7))
    assert any(b[:4] == [0, 1, 2, 3] for b in bins)          # 10 + 16 tokens: one part, whole
    assert [4, 5] in [[r for r in b if r in (4, 5)] for b in bins]   # 30 + 12 = 42 fits
    # a group over the budget is cut into parts that fit, each with its prompt
    bins = rearrange_prompt_groups([[0, 1, 2, 3]], [10], [8, 8, 8, 8], max_token_len=30)
    assert sorted(map(sorted, bins)) == [[0, 1], [2, 3]]
    with pytest.raises(ValueError, match="ppo_max_token_len_per_gpu=20 is smaller than a sequence of 30"):
        rearrange_prompt_groups([[0]], [25], [5], max_token_len=20)


def test_dynamic_update_with_shared_prompts_has_the_unshared_gradient(model):
    data = grouped_batch(seed=2)
    grads = {}
    for share in (True, False):
        m = copy.deepcopy(model)
        before = {n: p.detach().clone() for n, p in m.named_parameters()}
        cfg = actor_section(ppo_epochs=1, clip_ratio=0.2, loss_agg_mode="token-mean", entropy_coeff=0.0,
                            use_kl_loss=False, grad_clip=1e9)
        actor = DataParallelPPOActor(cfg, m, torch.optim.SGD(m.parameters(), lr=1.0),
                                     batches=UpdateBatches(len(data), None, 24), use_remove_padding=True,
                                     share_prompts=share)
        actor.update_policy(data)
        grads[share] = {n: before[n] - p.detach() for n, p in m.named_parameters()}
    for name in grads[False]:
        torch.testing.assert_close(grads[True][name], grads[False][name], atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("dynamic", [False, True])
def test_critic_with_shared_prompts_has_the_unshared_values_and_gradient(dynamic):
    from hybridrl.training import DataParallelPPOCritic

    torch.manual_seed(0)
    cfg = tiny_qwen2_config()
    cfg.num_labels, cfg.classifier_dropout = 1, 0.0
    base = transformers.AutoModelForTokenClassification.from_config(cfg, dtype=torch.float32)
    base.set_attn_implementation(register_varlen_attention())
    data = grouped_batch(seed=3)
    data.meta_info.update(micro_batch_size=4, use_dynamic_bsz=dynamic, max_token_len=30)
    g = torch.Generator().manual_seed(4)
    data.batch["returns"] = torch.randn(data.batch["responses"].shape, generator=g)
    out = {}
    for share in (True, False):
        model = copy.deepcopy(base)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        ccfg = critic_section(cliprange_value=100.0, grad_clip=1e9, loss_agg_mode="token-mean")
        critic = DataParallelPPOCritic(ccfg, model, torch.optim.SGD(model.parameters(), lr=1.0),
                                       batches=UpdateBatches(len(data), None if dynamic else 3, 30),
                                       use_remove_padding=True, share_prompts=share)
        values = critic.compute_values(data)
        data.batch["values"] = values
        critic.update_critic(data)
        out[share] = values, {n: before[n] - p.detach() for n, p in model.named_parameters()}
    torch.testing.assert_close(out[True][0], out[False][0], atol=1e-5, rtol=1e-5)
    assert any(v.abs().max() > 0 for v in out[True][1].values())
    for name in out[False][1]:
        torch.testing.assert_close(out[True][1][name], out[False][1][name], atol=1e-6, rtol=1e-4)
