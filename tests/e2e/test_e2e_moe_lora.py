"""End to end on one Ray CPU worker: GRPO with LoRA on a tiny Qwen3-MoE model through the native engine, whose
frozen base (experts, router, embeddings, norms) the engine uses in place from the actor instead of copying it;
with LoRA on the experts too (`target_parameters`), the engine borrows the experts' frozen base as well and adds their
low-rank update unmerged."""

import math

import pytest
import test_e2e_runs
import torch
from test_e2e_runs import overrides, train_metrics

from hybridrl.config.loader import load_config
from hybridrl.plan.model_shape import ModelShape
from hybridrl.trainer.launch import run_ppo
from hybridrl.training.lora import EXPERT_TARGETS, LINEAR_TARGETS

pytestmark = pytest.mark.slow
arith_dir = test_e2e_runs.arith_dir   # the module-scoped data fixture of the other e2e runs


def _copy_tokenizer(out_dir, tokenizer_dir):
    """A new model directory `out_dir` with the tokenizer files of `tokenizer_dir`; returns its HF config."""
    import shutil

    import transformers

    out_dir.mkdir(parents=True)
    for f in tokenizer_dir.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges", "chat_template", "generation")):
            shutil.copyfile(f, out_dir / f.name)
    return transformers.AutoConfig.from_pretrained(tokenizer_dir)


def _tiny_moe(out_dir, tokenizer_dir):
    import transformers

    from hybridrl.assets.tiny_model import make_config

    base = _copy_tokenizer(out_dir, tokenizer_dir)
    config = make_config("qwen3_moe", hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, head_dim=16,
                         vocab_size=base.vocab_size, experts=8, experts_per_token=2, expert_intermediate=32, tie=False,
                         token_ids={"bos_token_id": None, "eos_token_id": base.eos_token_id,
                                    "pad_token_id": base.pad_token_id})
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(out_dir)
    return out_dir


@pytest.mark.parametrize("experts", [(), EXPERT_TARGETS], ids=["attention", "attention+experts"])
def test_grpo_moe_lora_on_one_worker_borrows_the_frozen_base(ray_local, tiny_model_dir, arith_dir, tmp_path, experts):
    model = _tiny_moe(tmp_path / "moe", tiny_model_dir)
    cfg = load_config(overrides=overrides(
        model, arith_dir, tmp_path / "run", "actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.lora_alpha=8",
        f"actor_rollout_ref.model.target_parameters=[{','.join(experts)}]",
        "actor_rollout_ref.actor.optim.lr=1e-2", "actor_rollout_ref.actor.entropy_coeff=0.01",
        "trainer.n_gpus_per_node=1", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "trainer.total_training_steps=2"))
    result = run_ppo(cfg)
    steps = train_metrics(result["history"])
    assert [h["training/global_step"] for h in steps] == [1, 2]
    # the base's routers, norms, embeddings, LM head and every expert tensor, adapted or not (o_proj is LoRA-targeted:
    # merged), fp32 on the CPU
    import transformers

    shape = ModelShape.from_hf_config(transformers.AutoConfig.from_pretrained(model))
    borrowed = shape.engine_whole_params(LINEAR_TARGETS)
    for h in steps:
        assert h["reshard/borrowed_gb"] == pytest.approx(4 * borrowed / 1e9)
        assert math.isfinite(h["actor/grad_norm"]) and h["actor/grad_norm"] > 0


def test_grpo_full_mixtral_replays_the_rollouts_routing_with_router_losses(ray_local, tiny_model_dir, arith_dir,
                                                                           tmp_path):
    """The second router family through the whole trainer, fully fine-tuned on two CPU workers: the TP = 2 engine
    records each token's experts, the batch carries them (`routed_experts`) through balancing and the update's
    token-budget micro-batches, and the actor replays them (R3) beside the load-balancing and z-losses."""
    import transformers

    model = tmp_path / "mixtral"
    base = _copy_tokenizer(model, tiny_model_dir)
    config = transformers.MixtralConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                                        intermediate_size=48, num_local_experts=4, num_experts_per_tok=2,
                                        vocab_size=base.vocab_size, max_position_embeddings=256,
                                        tie_word_embeddings=False, bos_token_id=None, eos_token_id=base.eos_token_id,
                                        pad_token_id=base.pad_token_id)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(model)
    actor = "actor_rollout_ref.actor"
    cfg = load_config(overrides=overrides(
        model, arith_dir, tmp_path / "run", f"{actor}.router_replay.mode=R3", f"{actor}.router_aux_loss_coef=0.01",
        f"{actor}.router_z_loss_coef=0.001", f"{actor}.use_dynamic_bsz=true", f"{actor}.ppo_max_token_len_per_gpu=160",
        f"{actor}.ppo_mini_batch_size=4", "trainer.total_training_steps=2"))
    steps = train_metrics(run_ppo(cfg)["history"])
    assert [h["training/global_step"] for h in steps] == [1, 2]
    for h in steps:
        assert math.isfinite(h["actor/grad_norm"]) and h["actor/grad_norm"] > 0
        # one on-policy mini-batch: the update runs at the weights the rollout sampled with, so its own top-2 is the
        # recorded one on every token (fp32 on both sides; a misaligned record would disagree on about half). With
        # two mini-batches the second runs after an optimizer step and legitimately differs (6.9% here at lr 1e-4,
        # 0 at lr 1e-30)
        assert 0 <= h["actor/routing_mismatch_frac"] <= 0.01
        assert h["actor/router_aux_loss"] > 0 and h["actor/router_z_loss"] > 0
