"""Ulysses sequence parallelism on 2 gloo ranks (one SP group of 2, dp = 1):
- packed attention with the all-to-alls == single-process attention, outputs and input gradients, for kv heads
  that divide the SP size and for kv heads that must be repeated;
- the FSDP actor with sp_group: log-probs == single-process HF log-probs, and one PPO update == the same update
  by a single-process actor on the whole batch (log-probs after it, grad norm);
- the FSDP critic with sp_group (a value head, no logits_to_keep): values and one update == single process;
- log-probs of tiny Llama and Qwen3 models with sp_group == single process.
One spawn runs all checks (process start-up dominates the cost)."""

import copy

import pytest
import torch
import torch.distributed as dist
import transformers
from _training_tiny import TINY_ACTOR_CFG, TINY_BATCHES, make_ppo_batch, make_tiny_model_dir, run_ranks
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.tensor import DTensor
from typed_sections import FP32_MASTERS, critic_section, model_source, optim_section

from hybridrl.training import (
    DataParallelPPOActor,
    DataParallelPPOCritic,
    build_fsdp_model,
    build_lr_scheduler,
    build_optimizer,
)
from hybridrl.training.fsdp import build_training_mesh, load_hf_model
from hybridrl.training.packed_attention import varlen_attention_forward
from hybridrl.training.ulysses import SequenceParallel

ACTOR = TINY_ACTOR_CFG
CRITIC = critic_section(cliprange_value=0.5, grad_clip=1.0, loss_agg_mode="token-mean")
OPTIM = optim_section(lr=1e-3, weight_decay=0.01, lr_warmup_steps=0, warmup_style="constant", total_training_steps=10)


def _check_attention(rank, sp, kv_heads):
    g = torch.Generator().manual_seed(kv_heads)
    T, H, D = 12, 4, 8  # 3 documents, 6 tokens a rank
    q, k, v = (torch.randn(1, h, T, D, generator=g) for h in (H, kv_heads, kv_heads))
    w = torch.randn(1, T, H, D, generator=g)
    cu = torch.tensor([0, 5, 9, 12], dtype=torch.int32)

    ref_inputs = [x.clone().requires_grad_() for x in (q, k, v)]
    ref, _ = varlen_attention_forward(None, *ref_inputs, None, scaling=D ** -0.5, cu_seq_lens_q=cu)
    (ref * w).sum().backward()

    lo, hi = rank * T // 2, (rank + 1) * T // 2
    local = [x[:, :, lo:hi].clone().requires_grad_() for x in (q, k, v)]
    out, _ = varlen_attention_forward(None, *local, None, scaling=D ** -0.5, cu_seq_lens_q=cu, sp_group=sp)
    torch.testing.assert_close(out, ref[:, lo:hi].detach(), atol=1e-6, rtol=1e-5)
    (out * w[:, lo:hi]).sum().backward()  # the ranks' losses add up to the reference loss
    for mine, full in zip(local, ref_inputs):
        torch.testing.assert_close(mine.grad, full.grad[:, :, lo:hi], atol=1e-6, rtol=1e-5)


def _worker(rank, world, model_dir, other_arch_dirs):
    sp = SequenceParallel.from_group(dist.group.WORLD)
    assert (sp.size, sp.rank) == (2, rank)
    _check_attention(rank, sp, kv_heads=2)
    _check_attention(rank, sp, kv_heads=1)

    mesh = build_training_mesh(world, device_type="cpu")
    model = build_fsdp_model(model_source(model_dir), FP32_MASTERS, mesh, torch.device("cpu"),
                             use_varlen_attention=True)
    opt = build_optimizer(model.parameters(), OPTIM)
    actor = DataParallelPPOActor(ACTOR, model, opt, build_lr_scheduler(opt, OPTIM), batches=TINY_BATCHES,
                                 use_remove_padding=True, sp_group=dist.group.WORLD)

    plain_model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    plain_opt = build_optimizer(plain_model.parameters(), OPTIM)
    plain = DataParallelPPOActor(ACTOR, plain_model, plain_opt, build_lr_scheduler(plain_opt, OPTIM),
                                 batches=TINY_BATCHES, use_remove_padding=False)

    data = make_ppo_batch(batch=4, prompt_len=7, resp_len=6, seed=3, temperature=0.9)  # same rows on both ranks
    data.meta_info["micro_batch_size"] = 2
    mask = data.batch["response_mask"].bool()
    lp_sp, ent_sp = actor.compute_log_prob(data, calculate_entropy=True)
    lp_ref, ent_ref = plain.compute_log_prob(copy.deepcopy(data), calculate_entropy=True)
    torch.testing.assert_close(lp_sp[mask], lp_ref[mask], atol=1e-5, rtol=1e-5)
    # a per-GPU token budget (verl's meaning): 7 tokens a GPU x 2 ranks hold a 13-token row
    dynamic = copy.deepcopy(data)
    dynamic.meta_info.update(use_dynamic_bsz=True, max_token_len=7)
    lp_dyn, _ = actor.compute_log_prob(dynamic)
    torch.testing.assert_close(lp_dyn[mask], lp_ref[mask], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent_sp[mask], ent_ref[mask], atol=1e-5, rtol=1e-5)

    data.batch["old_log_probs"] = lp_ref
    m_sp = actor.update_policy(data)
    m_ref = plain.update_policy(copy.deepcopy(data))
    assert m_sp["actor/grad_norm"] == pytest.approx(m_ref["actor/grad_norm"], rel=1e-4)
    lp_sp_after, _ = actor.compute_log_prob(data)
    lp_ref_after, _ = plain.compute_log_prob(copy.deepcopy(data))
    assert not torch.allclose(lp_ref_after[mask], lp_ref[mask])
    torch.testing.assert_close(lp_sp_after[mask], lp_ref_after[mask], atol=1e-5, rtol=1e-5)
    _check_critic(model_dir, mesh, data)
    for arch_dir in other_arch_dirs:  # Llama, Qwen3 (per-head q/k norms, explicit head_dim): log-probs
        _check_log_probs(arch_dir, mesh, data)


def _check_log_probs(model_dir, mesh, data):
    model = build_fsdp_model(model_source(model_dir), FP32_MASTERS, mesh, torch.device("cpu"),
                             use_varlen_attention=True)
    actor = DataParallelPPOActor(ACTOR, model, use_remove_padding=True, sp_group=dist.group.WORLD)
    plain = DataParallelPPOActor(ACTOR, transformers.AutoModelForCausalLM.from_pretrained(model_dir,
                                                                                          dtype=torch.float32))
    mask = data.batch["response_mask"].bool()
    lp_sp, _ = actor.compute_log_prob(data)
    torch.testing.assert_close(lp_sp[mask], plain.compute_log_prob(copy.deepcopy(data))[0][mask], atol=1e-5,
                               rtol=1e-5)


def _check_critic(model_dir, mesh, data):
    module = build_fsdp_model(model_source(model_dir), FP32_MASTERS, mesh, torch.device("cpu"), role="critic",
                              use_varlen_attention=True)
    opt = build_optimizer(module.parameters(), OPTIM)
    critic = DataParallelPPOCritic(CRITIC, module, opt, build_lr_scheduler(opt, OPTIM), batches=TINY_BATCHES,
                                   use_remove_padding=True, sp_group=dist.group.WORLD)
    plain_module = load_hf_model(model_dir, role="critic")
    plain_module.load_state_dict(get_model_state_dict(module, options=StateDictOptions(full_state_dict=True)))
    plain_opt = build_optimizer(plain_module.parameters(), OPTIM)
    plain = DataParallelPPOCritic(CRITIC, plain_module, plain_opt, build_lr_scheduler(plain_opt, OPTIM),
                                  batches=TINY_BATCHES, use_remove_padding=False)
    values = critic.compute_values(data)
    torch.testing.assert_close(values, plain.compute_values(copy.deepcopy(data)), atol=1e-5, rtol=1e-5)
    data.meta_info["unshard_once"] = True  # the values pass with the shards gathered once: same values
    torch.testing.assert_close(critic.compute_values(data), values, atol=0, rtol=0)
    assert all(isinstance(p, DTensor) for p in critic.module.parameters())
    del data.meta_info["unshard_once"]
    data.batch["values"] = values
    m_sp, m_ref = critic.update_critic(data), plain.update_critic(copy.deepcopy(data))
    assert m_sp["critic/grad_norm"] == pytest.approx(m_ref["critic/grad_norm"], rel=1e-4)
    torch.testing.assert_close(critic.compute_values(data), plain.compute_values(copy.deepcopy(data)),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_ulysses_two_ranks_matches_single_process(tmp_path):
    from hybridrl.assets.tiny_model import build_tiny_model

    model_dir = make_tiny_model_dir(tmp_path / "model", with_tokenizer=False)
    others = [str(build_tiny_model(tmp_path / arch, arch=arch, vocab_size=300)) for arch in ("llama", "qwen3")]
    run_ranks(_worker, 2, str(model_dir), others)
