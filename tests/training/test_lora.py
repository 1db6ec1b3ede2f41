"""LoRA without processes: config keys checked with the key, value and rule named; the plan's memory model counts
grads and AdamW state for the adapters only and no reference copy; the adapter count matches peft's; a model
without adapters streams its parameters unchanged."""

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM
from typed_sections import model_section

from hybridrl.config import ConfigError, load_config
from hybridrl.plan import DeviceSpec, make_plan
from hybridrl.plan.memory import GiB
from hybridrl.plan.model_shape import ModelShape
from hybridrl.training.lora import (
    LoraSettings,
    adapter_param_count,
    adapters_disabled,
    apply_lora,
    engine_parameters,
    lora_settings,
)

M = "actor_rollout_ref.model"
Q7 = AutoConfig.for_model("qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                          num_attention_heads=28, num_key_value_heads=4, vocab_size=151936, tie_word_embeddings=False)
H200 = DeviceSpec("cuda", "H200", int(139.8 * GiB))
STEP = ["data.train_batch_size=64", "actor_rollout_ref.rollout.n=8", "actor_rollout_ref.actor.ppo_mini_batch_size=64",
        "data.max_prompt_length=256", "data.max_response_length=256", "trainer.n_gpus_per_node=1",
        "actor_rollout_ref.actor.use_kl_loss=true"]


@pytest.mark.parametrize("key, value, rule", [
    ("lora_rank", "-1", ">= 0"), ("lora_alpha", "0", "> 0"), ("lora_alpha", "-2.5", "> 0"),
    ("target_modules", "[q_proj,qproj]", "all-linear"), ("target_modules", "all", "all-linear"),
    ("target_modules", "[]", "non-empty"),
])
def test_bad_lora_keys_are_refused_naming_key_value_and_rule(key, value, rule):
    with pytest.raises(ConfigError) as e:
        load_config(overrides=[f"{M}.{key}={value}"]).validate()
    msg = str(e.value)
    assert f"'{M}.{key}'" in msg and rule in msg


def test_valid_lora_keys_pass_and_zero_rank_is_off():
    load_config(overrides=[f"{M}.lora_rank=8", f"{M}.lora_alpha=16.5",
                                           f"{M}.target_modules=[q_proj,v_proj]"]).validate()
    assert lora_settings(model_section(lora_rank=0)) is None
    s = lora_settings(model_section(lora_rank=8, lora_alpha=32, target_modules=["q_proj"]))
    assert (s.rank, s.scaling, s.target_modules) == (8, 4.0, ("q_proj",))
    with pytest.raises(ValueError, match="lora_rank"):
        lora_settings(model_section(lora_rank=2.5))


def test_plan_counts_optimizer_state_for_adapters_only_and_no_reference_copy():
    bf16 = [*STEP, "actor_rollout_ref.actor.fsdp_config.model_dtype=bf16"]
    shape = ModelShape.from_hf_config(Q7)
    adapters = adapter_param_count(shape, 64, "all-linear")
    lora = make_plan(load_config(overrides=[*bf16, f"{M}.lora_rank=64"]), Q7, H200).predicted["update_actor"]
    full = make_plan(load_config(overrides=bf16), Q7, H200).predicted["update_actor"]
    assert lora.parts["actor grads"] == adapters * 2 and lora.parts["actor optimizer"] == 2 * adapters * 2
    assert lora.parts["actor params"] == (shape.num_params + adapters) * 2
    assert "ref params" not in lora.parts   # the reference is the actor's base with adapters off
    assert full.parts["actor grads"] == shape.num_params * 2 and full.parts["ref params"] == shape.num_params * 2
    resident = lambda pm: sum(v for k, v in pm.parts.items() if k.startswith(("actor ", "ref ")))  # noqa: E731
    assert resident(full) - resident(lora) > 0.95 * 4 * shape.num_params * 2   # grads, 2 AdamW moments, reference


@pytest.mark.parametrize("device, model_dtype, base, base_bytes", [
    (H200, "fp32", "bf16", 2),                              # GPU: the frozen base in the compute dtype
    (DeviceSpec("cpu", "cpu", None), "fp32", "fp32", 4),    # CPU computes in fp32
    (DeviceSpec("cpu", "cpu", None), "bf16", "bf16", 2),    # never stored wider than the masters
])
def test_plan_stores_the_lora_base_in_the_compute_dtype_and_adapters_in_model_dtype(device, model_dtype, base,
                                                                                      base_bytes):
    overrides = [*STEP, f"{M}.lora_rank=64", f"actor_rollout_ref.actor.fsdp_config.model_dtype={model_dtype}"]
    plan = make_plan(load_config(overrides=overrides), Q7, device)
    shape = ModelShape.from_hf_config(Q7)
    adapters, master = adapter_param_count(shape, 64, "all-linear"), 4 if model_dtype == "fp32" else 2
    assert plan.actor.lora_base_dtype == base and f"LoRA base {base}" in str(plan)
    update = plan.predicted["update_actor"].parts
    assert update["actor params"] == shape.num_params * base_bytes + adapters * master
    assert update["actor grads"] == adapters * master and update["actor optimizer"] == 2 * adapters * master
    full = [*STEP, "actor_rollout_ref.actor.fsdp_config.model_dtype=bf16"]   # fp32 full fine-tuning does not fit
    assert make_plan(load_config(overrides=full), Q7, device).actor.lora_base_dtype is None   # no LoRA


def _tiny():
    cfg = AutoConfig.for_model("qwen2", hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, vocab_size=64)
    torch.manual_seed(0)
    return cfg, AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)


@pytest.mark.parametrize("targets", ["all-linear", ("q_proj", "down_proj")])
def test_adapter_count_matches_peft(targets):
    cfg, model = _tiny()
    apply_lora(model, LoraSettings(4, 8.0, targets))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert trainable == adapter_param_count(ModelShape.from_hf_config(cfg), 4, targets) > 0


def test_without_adapters_engine_parameters_are_the_module_parameters():
    _, model = _tiny()
    assert [(n, p) for n, p, _ in engine_parameters(model)] == list(model.named_parameters())
    ids = torch.randint(0, 64, (1, 5))
    with adapters_disabled(model):   # a no-op without adapters
        assert torch.equal(model(ids).logits, model(ids).logits)


def test_lora_on_an_moe_model_targets_its_linears_only():
    import transformers

    from hybridrl.training.lora import LoraSettings, apply_lora, engine_parameters

    config = transformers.Qwen3MoeConfig(hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                                         num_experts=8, num_experts_per_tok=2, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=96)
    model = apply_lora(transformers.AutoModelForCausalLM.from_config(config), LoraSettings(4, 8, "all-linear"))
    adapted = {n.partition(".lora_")[0] for n, _ in model.named_parameters() if ".lora_" in n}
    assert adapted == {f"model.layers.0.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj", "o_proj")}
    # every weight reaches the engine under its HF name (experts and router untouched by peft)
    hf = {n for n, _ in transformers.AutoModelForCausalLM.from_config(config).named_parameters()}
    assert {n for n, _, _ in engine_parameters(model)} == hf
    with pytest.raises(ValueError, match=r"target_modules.*\['down_proj'\] are not linear layers"):
        apply_lora(transformers.AutoModelForCausalLM.from_config(config), LoraSettings(4, 8, ("q_proj", "down_proj")))
