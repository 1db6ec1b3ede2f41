"""End to end with LoRA on 2 Ray CPU workers (gloo): GRPO with a KL loss, whose reference is the actor's base with
the adapters off, 2 steps through the native engine (merged weights resharded each step), a checkpoint, `hybridrl merge` of it
(merged model + peft adapter), and a run that starts from that adapter (model.lora_adapter_path)."""

import math

import pytest
import test_e2e_runs
from test_e2e_runs import overrides, train_metrics

from hybridrl.config.loader import load_config
from hybridrl.trainer.launch import run_ppo

pytestmark = pytest.mark.slow
arith_dir = test_e2e_runs.arith_dir   # the module-scoped data fixture of the other e2e runs


def test_grpo_with_lora_and_kl_loss_runs_checkpoints_and_merges(ray_local, tiny_model_dir, arith_dir, tmp_path):
    from hybridrl.training.merge import merge_checkpoint

    cfg = load_config(overrides=overrides(
        tiny_model_dir, arith_dir, tmp_path / "lora", "actor_rollout_ref.model.lora_rank=4",
        "actor_rollout_ref.model.lora_alpha=8", "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.optim.lr=1e-2", "trainer.total_training_steps=2",
        # the tiny random model scores 0, so GRPO's advantages are 0: the entropy bonus makes the adapters move
        "actor_rollout_ref.actor.entropy_coeff=0.01", "actor_rollout_ref.actor.ppo_mini_batch_size=4", "trainer.save_freq=2"))
    steps = train_metrics(run_ppo(cfg)["history"])
    assert [h["training/global_step"] for h in steps] == [1, 2]
    for h in steps:
        for key in ("timing_s/reshard", "timing_s/ref", "actor/kl_loss", "actor/grad_norm", "response_length/mean"):
            assert key in h and math.isfinite(h[key]), key
    # B starts at 0, so the policy equals the reference in step 1 (one mini-batch); after an update it no longer does
    assert steps[0]["actor/kl_loss"] == pytest.approx(0.0, abs=1e-7) and steps[0]["actor/grad_norm"] > 0
    assert steps[1]["actor/kl_loss"] > 0
    ckpt = next((tmp_path / "lora" / "global_step_2").glob("actor*"))
    out = merge_checkpoint(ckpt, tmp_path / "merged")
    assert (out / "adapter" / "adapter_model.safetensors").exists() and (out / "config.json").exists()
    # a new run from the saved adapter (verl's lora_adapter_path; lora_rank left 0: the adapter's rank is taken):
    # its first step already differs from the reference (the base), where a fresh LoRA's equals it
    (h,) = train_metrics(run_ppo(load_config(overrides=overrides(
        tiny_model_dir, arith_dir, tmp_path / "from_adapter", f"actor_rollout_ref.model.lora_adapter_path={out / 'adapter'}",
        "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "trainer.total_training_steps=1")))["history"])
    assert h["actor/kl_loss"] > 0 and math.isfinite(h["actor/grad_norm"])
