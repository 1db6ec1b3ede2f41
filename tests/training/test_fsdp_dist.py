"""2 gloo ranks: HSDP mesh shape, FSDP2 log-probs == single-process HF, an update step, sharded checkpoint
save -> load -> next step (with gradient checkpointing) == uninterrupted next step (without), merged HF model == trained model, offload round trip,
log-probs with the shards all-gathered once per pass == once per micro-batch (and fewer all-gathers); an update
with the shards all-gathered once per mini-batch == twice per micro-batch (and fewer all-gathers); on the HSDP
mesh gradients reduced in the last backward only == in every backward (and fewer reductions).
One spawn runs all checks (process start-up dominates the cost)."""

from dataclasses import replace
from functools import partial

import pytest
import torch
import torch.distributed as dist
import transformers
from _training_tiny import (
    TINY_ACTOR_CFG,
    TINY_BATCHES,
    make_ppo_batch,
    make_tiny_model_dir,
    run_ranks,
    tiny_qwen2_config,
)
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from typed_sections import FP32_MASTERS, model_source, optim_section

from hybridrl.training import (
    DataParallelPPOActor,
    build_fsdp_model,
    build_lr_scheduler,
    build_optimizer,
    build_training_mesh,
    load_checkpoint,
    load_fsdp_params,
    load_optimizer,
    merge_checkpoint,
    offload_fsdp_params,
    offload_optimizer,
    save_checkpoint,
)
from hybridrl.training.fsdp import apply_fsdp, grads_unsplit, recompute_on

ACTOR = TINY_ACTOR_CFG
OPTIM = optim_section(lr=1e-3, weight_decay=0.01, lr_warmup_steps=0, warmup_style="cosine", min_lr_ratio=0.1,
             total_training_steps=10)


def _count_calls(fn, names):
    """(fn(), how many times it called the torch.distributed functions `names` that exist in this version)."""
    counts = [0]
    saved = {name: getattr(dist, name) for name in names if hasattr(dist, name)}

    def counting(orig):
        def call(*a, **k):
            counts[0] += 1
            return orig(*a, **k)
        return call

    for name, orig in saved.items():
        setattr(dist, name, counting(orig))
    try:
        return fn(), counts[0]
    finally:
        for name, orig in saved.items():
            setattr(dist, name, orig)


def _count_all_gathers(fn):  # FSDP2 calls one of these two, depending on the torch version
    return _count_calls(fn, ("all_gather_single", "all_gather_into_tensor"))


def _count_reductions(fn):  # FSDP2's gradient reduce-scatters and all-reduces
    return _count_calls(fn, ("reduce_scatter_tensor", "all_reduce"))


def _build(model_dir, mesh, gradient_checkpointing=False, unshard_once=False):
    model = build_fsdp_model(model_source(model_dir), FP32_MASTERS, mesh, torch.device("cpu"),
                             use_varlen_attention=True, gradient_checkpointing=gradient_checkpointing)
    assert recompute_on(model) == gradient_checkpointing
    opt = build_optimizer(model.parameters(), OPTIM)
    return DataParallelPPOActor(ACTOR, model, opt, build_lr_scheduler(opt, OPTIM),
                                batches=replace(TINY_BATCHES, unshard_once=unshard_once), use_remove_padding=True)


def _rank_batch(rank, seed):
    data = make_ppo_batch(batch=4, seed=seed + rank, temperature=0.9)
    data.meta_info["micro_batch_size"] = 3
    return data


def _worker(rank, world, model_dir, tmp):
    hsdp = build_training_mesh(world, fsdp_size=1, device_type="cpu")
    assert hsdp.mesh_dim_names == ("ddp", "fsdp") and tuple(hsdp.mesh.shape) == (2, 1)
    mesh = build_training_mesh(world, device_type="cpu")
    assert mesh.mesh_dim_names == ("fsdp",) and tuple(mesh.mesh.shape) == (2,)

    actor = _build(model_dir, mesh)
    data = _rank_batch(rank, 10)
    mask = data.batch["response_mask"].bool()
    ref_model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ref = DataParallelPPOActor(ACTOR, ref_model, use_remove_padding=False)
    lp_fsdp, _ = actor.compute_log_prob(data)
    lp_ref, _ = ref.compute_log_prob(data)
    torch.testing.assert_close(lp_fsdp[mask], lp_ref[mask], atol=1e-5, rtol=1e-5)

    # 4 micro-batches of 1 row: shards all-gathered per micro-batch vs once for the pass
    fsdp_modules = [m for m in actor.module.modules() if isinstance(m, FSDPModule)]
    data.meta_info.update(micro_batch_size=1, unshard_once=False)
    lp_each, n_each = _count_all_gathers(lambda: actor.compute_log_prob(data)[0])
    data.meta_info["unshard_once"] = True
    lp_once, n_once = _count_all_gathers(lambda: actor.compute_log_prob(data)[0])
    torch.testing.assert_close(lp_once, lp_each, atol=0, rtol=0)
    assert (n_each, n_once) == (4 * len(fsdp_modules), len(fsdp_modules))
    assert all(isinstance(p, DTensor) for p in actor.module.parameters())  # resharded after the pass
    data.meta_info.update(micro_batch_size=3, unshard_once=False)

    # one step, checkpoint, a second step; then restore and redo the second step
    data.batch["old_log_probs"] = lp_fsdp
    m1 = actor.update_policy(data)
    assert m1["actor/grad_norm"] > 0
    lp_after, _ = actor.compute_log_prob(data)
    assert not torch.allclose(lp_after[mask], lp_fsdp[mask])
    ckpt = f"{tmp}/global_step_1"
    save_checkpoint(ckpt, actor.module, actor.optimizer, actor.scheduler, role="actor", extra={"step": 1})
    data2 = _rank_batch(rank, 20)
    data2.batch["old_log_probs"] = actor.compute_log_prob(data2)[0]
    m2 = actor.update_policy(data2)
    lp_uninterrupted, _ = actor.compute_log_prob(data2)
    save_checkpoint(f"{tmp}/global_step_2", actor.module, actor.optimizer, actor.scheduler, role="actor")

    # offload / load round trips leave the next result unchanged; offloaded shards hold no memory, the same tensor
    # objects (FSDP2's sharded DTensors) come back
    params = list(actor.module.parameters())
    shards = [p.to_local() for p in params]
    for _ in range(2):
        offload_fsdp_params(actor.module)
        offload_optimizer(actor.optimizer)
        assert all(t.untyped_storage().nbytes() == 0 for t in shards)
        load_fsdp_params(actor.module, "cpu")
        load_optimizer(actor.optimizer, "cpu")
        assert all(a is b for a, b in zip(params, actor.module.parameters()))
        assert all(t.untyped_storage().nbytes() > 0 for t in shards)
        torch.testing.assert_close(actor.compute_log_prob(data2)[0], lp_uninterrupted, atol=0, rtol=0)

    fresh = _build(model_dir, mesh, gradient_checkpointing=True)   # recompute in backward: the same update
    extra = load_checkpoint(ckpt, fresh.module, fresh.optimizer, fresh.scheduler)
    assert extra == {"step": 1}
    m2_resumed = fresh.update_policy(data2)
    assert m2_resumed["actor/lr"] == m2["actor/lr"]
    torch.testing.assert_close(fresh.compute_log_prob(data2)[0], lp_uninterrupted, atol=1e-6, rtol=1e-6)

    # an update with every block all-gathered once per mini-batch: the same update, fewer all-gathers, and
    # nothing left unsharded after it (with gradient checkpointing: the recompute finds the blocks gathered too)
    for ckpt in (False, True):
        per_micro, once = _build(model_dir, mesh, ckpt), _build(model_dir, mesh, ckpt, unshard_once=True)
        data4 = _rank_batch(rank, 40)   # 4 rows, micro-batches of 1: four forwards and backwards
        data4.meta_info["micro_batch_size"] = 1
        data4.batch["old_log_probs"] = per_micro.compute_log_prob(data4)[0]
        m_micro, gathers_micro = _count_all_gathers(partial(per_micro.update_policy, data4))
        m_once, gathers_once = _count_all_gathers(partial(once.update_policy, data4))
        assert 0 < gathers_once < gathers_micro, (ckpt, gathers_once, gathers_micro)
        assert all(isinstance(p, DTensor) for p in once.module.parameters())
        assert m_once["actor/grad_norm"] == pytest.approx(m_micro["actor/grad_norm"], rel=1e-6)
        torch.testing.assert_close(once.compute_log_prob(data4)[0], per_micro.compute_log_prob(data4)[0],
                                   atol=1e-6, rtol=1e-6)

    # HSDP over shards of one rank: gradients are reduced in each mini-batch's last backward only, with the same
    # update as reducing in every backward
    assert not actor.reduce_in_last_backward
    deferred, every = _build(model_dir, hsdp), _build(model_dir, hsdp)
    assert deferred.reduce_in_last_backward
    every.reduce_in_last_backward = False
    data3 = _rank_batch(rank, 30)   # 4 rows, micro-batches of 3: two backwards
    data3.batch["old_log_probs"] = deferred.compute_log_prob(data3)[0]
    m_deferred, reduces_deferred = _count_reductions(lambda: deferred.update_policy(data3))
    m_every, reduces_every = _count_reductions(lambda: every.update_policy(data3))
    assert reduces_every == 2 * reduces_deferred > 0
    assert m_deferred["actor/grad_norm"] == pytest.approx(m_every["actor/grad_norm"], rel=1e-6)
    torch.testing.assert_close(deferred.compute_log_prob(data3)[0], every.compute_log_prob(data3)[0],
                               atol=1e-6, rtol=1e-6)
    # ... but not where unreduced gradients would be wider than the master weights (FSDP accumulates them in
    # reduce_dtype): fp32 reduction of bf16 masters would double the gradients' memory
    for master, reduce, deferrable in ((torch.float32, torch.float32, True), (torch.bfloat16, torch.float32, False),
                                       (torch.bfloat16, torch.bfloat16, True)):
        model = transformers.AutoModelForCausalLM.from_config(tiny_qwen2_config(), dtype=master)
        assert grads_unsplit(apply_fsdp(model, hsdp, torch.bfloat16, reduce)) == deferrable, (master, reduce)
    # only trained parameters count (LoRA: fp32 adapters on a frozen bf16 base)
    model = transformers.AutoModelForCausalLM.from_config(tiny_qwen2_config(), dtype=torch.bfloat16)
    model.requires_grad_(False)
    for p in model.model.layers[-1].mlp.parameters():
        p.data, p.requires_grad = p.data.float(), True
    assert grads_unsplit(apply_fsdp(model, hsdp, torch.bfloat16, torch.float32))

    dist.barrier()
    if rank == 0:
        out = merge_checkpoint(f"{tmp}/global_step_2", f"{tmp}/merged", dtype="float32")
        merged = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
        lp_merged, _ = DataParallelPPOActor(ACTOR, merged, use_remove_padding=False).compute_log_prob(data2)
        m2mask = data2.batch["response_mask"].bool()
        torch.testing.assert_close(lp_merged[m2mask], lp_uninterrupted[m2mask], atol=1e-5, rtol=1e-5)
    dist.barrier()


@pytest.mark.slow
def test_fsdp_two_ranks_logprobs_checkpoint_merge(tmp_path):
    model_dir = make_tiny_model_dir(tmp_path / "model", with_tokenizer=False)
    run_ranks(_worker, 2, str(model_dir), str(tmp_path))
    assert (tmp_path / "merged" / "model.safetensors").exists()
    assert (tmp_path / "global_step_1" / "extra_state_world_size_2_rank_1.pt").exists()
