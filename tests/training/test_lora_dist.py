"""LoRA on the FSDP2 actor, 2 gloo ranks, against plain single-process references, with the frozen base stored in
fp32 and in bf16 (what the plan picks on GPUs; the adapters stay fp32): only adapters are in the
optimizer and change in an update; LoRA log-probs == the merged HF model's; adapters disabled == the base model;
the resharder streams exactly the merged weights under HF names (slice and gather), summed in fp32 before a
bf16 engine's cast; checkpoint save -> load ->
next step == uninterrupted; `merge` writes the merged model and a peft adapter that loads onto the base.
One spawn runs all checks (process start-up dominates the cost)."""

import pytest
import torch
import torch.distributed as dist
import transformers
from _training_tiny import TINY_ACTOR_CFG, TINY_BATCHES, make_ppo_batch, make_tiny_model_dir, run_ranks
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from tp_slicing_engine import SlicingEngine

from hybridrl.config import load_config
from hybridrl.hybrid.reshard import FSDPToTPResharder
from hybridrl.training import (
    DataParallelPPOActor,
    build_training_mesh,
    load_checkpoint,
    merge_checkpoint,
    save_checkpoint,
)
from hybridrl.training.fsdp import FSDPDtypes
from hybridrl.training.lora import adapters_disabled, merge_lora_state
from hybridrl.workers.common import build_fsdp_model

OPTIM = dict(lr=1e-2, weight_decay=0.0, lr_warmup_steps=0, warmup_style="constant")
LORA = dict(lora_rank=4, lora_alpha=8, target_modules="all-linear")
M, A = "actor_rollout_ref.model", "actor_rollout_ref.actor"
COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "embed_tokens", "lm_head")


def slicing_engine(rank, world):
    """Column-parallel linears and vocab rows split on dim 0, o_proj/down_proj on dim 1 (as the TP decoder)."""
    return SlicingEngine(rank, world,
                         column=lambda name, shape: len(shape) == 2 and any(f"{c}." in name for c in COLUMN),
                         row=lambda name, shape: len(shape) == 2 and ("o_proj." in name or "down_proj." in name))


def _build(model_dir, mesh, base_dtype):
    cfg = load_config(overrides=[f"{M}.path={model_dir}", f"{M}.use_remove_padding=true",
                                 *(f"{M}.{k}={v}" for k, v in LORA.items()), f"{A}.fsdp_config.model_dtype=fp32",
                                 *(f"{A}.optim.{k}={v}" for k, v in OPTIM.items())]).actor_rollout_ref
    module, opt, sched = build_fsdp_model(cfg.model, FSDPDtypes.of(cfg.actor.fsdp_config), cfg.actor.optim, mesh,
                                          torch.device("cpu"), trainable=True, lora_base_dtype=base_dtype,
                                          use_varlen_attention=True)
    return DataParallelPPOActor(TINY_ACTOR_CFG, module, opt, sched, batches=TINY_BATCHES, use_remove_padding=True)


def _full(module):
    """The full state dict on every rank (cpu_offload would leave it on rank 0 only), detached from the module."""
    full = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True))
    return {k: v.detach().clone() for k, v in full.items()}


def _plain_log_probs(model, data):
    return DataParallelPPOActor(TINY_ACTOR_CFG, model, use_remove_padding=False).compute_log_prob(data)[0]


def _base_hf(model_dir, base_dtype):
    """The base model from disk, rounded to the stored base dtype, computing in fp32 (as FSDP does on CPU)."""
    return transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=base_dtype).float()


def _merged_hf(model_dir, state):
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.load_state_dict(merge_lora_state(state, LORA["lora_alpha"] / LORA["lora_rank"])[0])
    return model


def _batch(rank, seed):
    data = make_ppo_batch(batch=4, seed=seed + rank, temperature=0.9)
    data.meta_info["micro_batch_size"] = 2
    return data


def _worker(rank, world, model_dir, tmp, base_dtype):
    torch.manual_seed(0)
    mesh = build_training_mesh(world, device_type="cpu")
    actor = _build(model_dir, mesh, base_dtype)
    names = {p: n for n, p in actor.module.named_parameters()}
    in_optim = sorted(names[p] for g in actor.optimizer.param_groups for p in g["params"])
    assert in_optim and all(".lora_A." in n or ".lora_B." in n for n in in_optim), in_optim[:3]
    assert len(in_optim) == 2 * 7 * 2   # A and B of 7 linears in 2 layers
    stored = {n: p.dtype for n, p in actor.module.named_parameters()}
    assert all(stored[n] == torch.float32 for n in in_optim)   # fp32 masters for AdamW
    assert {d for n, d in stored.items() if n not in in_optim} == {base_dtype}

    # one update: adapters move, every base weight is bit-identical
    before = _full(actor.module)
    data = _batch(rank, 10)
    data.batch["old_log_probs"] = actor.compute_log_prob(data)[0]
    assert actor.update_policy(data)["actor/grad_norm"] > 0
    after = _full(actor.module)
    assert before.keys() == after.keys()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(".lora_" in k for k in changed), sorted(changed)[:3]
    assert any(".lora_B." in k for k in changed)   # B starts at 0: the merged delta is now non-zero

    # LoRA log-probs == the merged plain model's; adapters off == the base model from disk
    mask = data.batch["response_mask"].bool()
    lp_lora = actor.compute_log_prob(data)[0]
    torch.testing.assert_close(lp_lora[mask], _plain_log_probs(_merged_hf(model_dir, after), data)[mask],
                               atol=1e-5, rtol=1e-5)
    with adapters_disabled(actor.module):
        lp_ref = actor.compute_log_prob(data)[0]
    torch.testing.assert_close(lp_ref[mask], _plain_log_probs(_base_hf(model_dir, base_dtype), data)[mask],
                               atol=1e-5, rtol=1e-5)
    assert (lp_ref[mask] - lp_lora[mask]).abs().max() > 1e-4   # the adapters do change the policy
    torch.testing.assert_close(actor.compute_log_prob(data)[0], lp_lora, atol=0, rtol=0)   # re-enabled

    # resharding streams the merged weights under HF names: with slice each rank gets exactly its TP slice
    merged = merge_lora_state(after, LORA["lora_alpha"] / LORA["lora_rank"])[0]
    for strategy in ("slice", "gather"):
        engine = slicing_engine(rank, world)
        FSDPToTPResharder(actor.module, engine, torch.float32, torch.device("cpu"), strategy=strategy).reshard()
        assert engine.received.keys() == merged.keys()
        for name, full in merged.items():
            want = (engine.expected(name, full) if strategy == "slice" else full).float()   # gather: the engine slices
            torch.testing.assert_close(engine.received[name], want, atol=1e-6, rtol=1e-6,
                                       msg=lambda m, n=name, s=strategy: f"{s} {n}: {m}")
    # a bf16 engine gets the fp32 sum rounded once: W + s·B·A summed in bf16 would round twice
    engine = slicing_engine(rank, world)
    FSDPToTPResharder(actor.module, engine, torch.bfloat16, torch.device("cpu")).reshard()
    for name, full in merged.items():
        assert torch.equal(engine.received[name], engine.expected(name, full).to(torch.bfloat16)), name

    # checkpoint -> second step == load into a fresh actor -> the same second step
    ckpt = f"{tmp}/global_step_1"
    save_checkpoint(ckpt, actor.module, actor.optimizer, actor.scheduler, role="actor")
    data2 = _batch(rank, 20)
    data2.batch["old_log_probs"] = actor.compute_log_prob(data2)[0]
    actor.update_policy(data2)
    lp_uninterrupted = actor.compute_log_prob(data2)[0]
    save_checkpoint(f"{tmp}/global_step_2", actor.module, actor.optimizer, actor.scheduler, role="actor")
    torch.manual_seed(123)   # the fresh actor's adapters start elsewhere: the load must overwrite them
    fresh = _build(model_dir, mesh, base_dtype)
    load_checkpoint(ckpt, fresh.module, fresh.optimizer, fresh.scheduler)
    restored = _full(fresh.module)
    assert all(restored[k].dtype == after[k].dtype and torch.equal(restored[k], after[k]) for k in after)
    fresh.update_policy(data2)
    torch.testing.assert_close(fresh.compute_log_prob(data2)[0], lp_uninterrupted, atol=1e-6, rtol=1e-6)

    dist.barrier()
    if rank == 0:
        from peft import PeftModel

        out = merge_checkpoint(f"{tmp}/global_step_2", f"{tmp}/merged", dtype="float32")
        merged_model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
        m2 = data2.batch["response_mask"].bool()
        torch.testing.assert_close(_plain_log_probs(merged_model, data2)[m2], lp_uninterrupted[m2],
                                   atol=1e-5, rtol=1e-5)
        peft_model = PeftModel.from_pretrained(_base_hf(model_dir, base_dtype), out / "adapter")
        ids = data2.batch["input_ids"]
        torch.testing.assert_close(peft_model(input_ids=ids).logits, merged_model(input_ids=ids).logits,
                                   atol=1e-5, rtol=1e-5)
    dist.barrier()


@pytest.mark.slow
@pytest.mark.parametrize("base_dtype", [torch.float32, torch.bfloat16], ids=["fp32_base", "bf16_base"])
def test_lora_two_ranks_update_logprobs_reshard_checkpoint_merge(tmp_path, base_dtype):
    model_dir = make_tiny_model_dir(tmp_path / "model", with_tokenizer=False)
    run_ranks(_worker, 2, str(model_dir), str(tmp_path), base_dtype)
    assert (tmp_path / "merged" / "model.safetensors").exists()
    assert (tmp_path / "merged" / "adapter" / "adapter_config.json").exists()


def _critic_worker(rank, world, model_dir):
    from hybridrl.training import DataParallelPPOCritic
    from hybridrl.training.fsdp import value_head
    from hybridrl.workers.critic import CRITIC_DTYPES

    cfg = load_config(overrides=[f"critic.model.path={model_dir}", "critic.model.lora_rank=4",
                                 "critic.model.lora_alpha=8", "critic.optim.lr=1e-2", "critic.grad_clip=1.0",
                                 "critic.cliprange_value=100.0"]).critic
    module, opt, _ = build_fsdp_model(cfg.model, CRITIC_DTYPES, cfg.optim, build_training_mesh(world, -1, "cpu"),
                                      torch.device("cpu"), trainable=True, critic=True, use_varlen_attention=True)
    trained = {n for n, p in module.named_parameters() if p.requires_grad}
    head = {f"score.{n}" for n, _ in value_head(module).named_parameters()}
    assert head <= trained and all("lora_" in n for n in trained - head) and len(trained) > len(head)
    assert sum(len(g["params"]) for g in opt.param_groups) == len(trained)   # the frozen backbone holds no state
    before = _full(module)
    data = make_ppo_batch(batch=4, seed=6)
    data.meta_info["micro_batch_size"] = 2
    critic = DataParallelPPOCritic(cfg, module, opt, batches=TINY_BATCHES, use_remove_padding=True)
    data.batch["values"] = critic.compute_values(data)
    first = critic.update_critic(data)
    for _ in range(3):
        last = critic.update_critic(data)
    assert last["critic/vf_loss"] < first["critic/vf_loss"]
    after = _full(module)
    changed = {k for k in after if not torch.equal(after[k], before[k])}
    assert changed and all("lora_" in k or k.startswith("score.") for k in changed)
    assert any(k.startswith("score.") for k in changed)


def test_critic_lora_trains_the_adapters_and_the_value_head(tmp_path):
    model_dir = make_tiny_model_dir(tmp_path / "model", with_tokenizer=False)
    run_ranks(_critic_worker, 1, str(model_dir))
