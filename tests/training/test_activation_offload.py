"""Activation offload: with gradient checkpointing, every checkpointed layer's input passes through the offload hook
(and no parameter does), and an update with offload is identical to one without; the config refuses offload
without checkpointing (the plan's accounting: tests/plan/test_run_plan.py)."""

import copy

import pytest
import torch
import transformers
from _training_tiny import make_ppo_batch
from typed_sections import actor_section

from hybridrl.config import ConfigError, load_config
from hybridrl.training import DataParallelPPOActor
from hybridrl.training.activation_offload import MIN_BYTES, offload_saved_activations
from hybridrl.training.fsdp import set_recompute
from hybridrl.training.micro_batches import UpdateBatches

LAYERS, HIDDEN = 3, 256


def _model():
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(hidden_size=HIDDEN, intermediate_size=512, num_hidden_layers=LAYERS,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=300,
                                   max_position_embeddings=1024, tie_word_embeddings=False)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    set_recompute(model, True)
    return model


def _batch():  # 4 rows x 320 tokens: each layer input is 4 x 320 x 256 x 4 bytes = 1.25 MiB, over MIN_BYTES
    data = make_ppo_batch(batch=4, prompt_len=300, resp_len=20)
    data.meta_info.update(micro_batch_size=4, temperature=1.0)
    return data


def test_checkpointed_layer_inputs_go_through_the_hook():
    model = _model()
    ids = _batch().batch["input_ids"]
    layer_input = ids.numel() * HIDDEN * 4
    assert layer_input >= MIN_BYTES
    stats = {}
    with offload_saved_activations(stats):
        loss = model.model(ids).last_hidden_state.pow(2).mean()
    loss.backward()
    # each layer's input, then what the final RMSNorm (3) and the loss (1) save: all hidden-sized; nothing from inside
    # a checkpointed layer (without checkpointing each layer would save a dozen tensors)
    assert stats["tensors"] == LAYERS + 4
    assert stats["bytes"] == stats["tensors"] * layer_input


def test_parameters_and_small_tensors_stay():
    weight = torch.nn.Parameter(torch.randn(1024, 512))           # 2 MiB: saved by the matmul, never moved
    x = torch.randn(1024, 512, requires_grad=True)                 # 2 MiB: moved
    small = torch.randn(16, 512, requires_grad=True)               # 32 KiB: kept
    stats = {}
    with offload_saved_activations(stats):
        y = torch.nn.functional.linear(x, weight).sum() + (small * small).sum()
    y.backward()
    assert stats == {"tensors": 1, "bytes": 1024 * 512 * 4}
    torch.testing.assert_close(weight.grad, torch.ones(1024, 1024).T @ x)


def test_update_with_activation_offload_equals_without():
    cfg = actor_section(ppo_epochs=1, clip_ratio=0.2, loss_agg_mode="token-mean", entropy_coeff=0.0,
                        use_kl_loss=False, grad_clip=1e9)
    base = _model()
    plain_model, offl_model = copy.deepcopy(base), copy.deepcopy(base)
    outs = []
    for model, offload in ((plain_model, False), (offl_model, True)):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        actor = DataParallelPPOActor(cfg, model, opt, batches=UpdateBatches(4, 4, None), use_remove_padding=False,
                                     activation_offload=offload)
        outs.append(actor.update_policy(_batch()))
    assert "actor/activation_offload_gb" not in outs[0] and outs[1]["actor/activation_offload_gb"] > 0
    assert outs[0]["actor/pg_loss"] == pytest.approx(outs[1]["actor/pg_loss"], abs=1e-7)
    for a, b in zip(plain_model.parameters(), offl_model.parameters()):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_offload_without_checkpointing_is_refused():
    with pytest.raises(ConfigError, match="enable_activation_offload"):
        load_config(overrides=["actor_rollout_ref.model.enable_activation_offload=true",
                               "actor_rollout_ref.model.enable_gradient_checkpointing=false"])
