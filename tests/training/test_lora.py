"""LoRA without processes: config keys checked with the key, value and rule named; the plan's memory model counts
grads and AdamW state for the adapters only and no reference copy; the adapter count matches peft's; a model
without adapters streams its parameters unchanged."""

import copy

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
    lora_target_names,
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


EXPERTS = ["experts.gate_up_proj", "experts.down_proj"]


@pytest.mark.parametrize("overrides, key, rule", [
    ([f"{M}.lora_rank=4", f"{M}.target_parameters=[experts.up_proj]"], "target_parameters", "experts.gate_up_proj"),
    ([f"{M}.lora_rank=4", f"{M}.target_parameters=experts.down_proj"], "target_parameters", "must be list"),
    ([f"{M}.lora_rank=4", f"{M}.target_parameters=[experts.down_proj,experts.down_proj]"], "target_parameters",
     "distinct"),
    ([f"{M}.target_parameters=[experts.down_proj]"], "target_parameters", "lora_rank' > 0"),
    ([f"{M}.lora_rank=4", f"{M}.target_modules=[]"], "target_modules", "non-empty unless"),
])
def test_bad_expert_lora_keys_are_refused_naming_key_value_and_rule(overrides, key, rule):
    with pytest.raises(ConfigError) as e:
        load_config(overrides=overrides).validate()
    assert f"'{M}.{key}'" in str(e.value) and rule in str(e.value)


def test_expert_lora_keys_pass_and_reach_the_settings():
    load_config(overrides=[f"{M}.lora_rank=4", f"{M}.target_modules=[]",
                           f"{M}.target_parameters=[experts.down_proj]"]).validate()
    s = lora_settings(model_section(lora_rank=4, target_modules=[], target_parameters=EXPERTS))
    assert (s.target_modules, s.target_parameters) == ((), tuple(EXPERTS))
    assert s.to_json()["target_parameters"] == EXPERTS
    assert lora_settings(model_section(lora_rank=4)).target_parameters == ()   # default: null, no expert adapters


def _moe(kind):
    from _training_tiny import tiny_moe_config

    torch.manual_seed(0)
    cfg = tiny_moe_config(kind, vocab_size=96)
    return cfg, AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)


def test_expert_adapters_are_refused_for_a_dense_model():
    with pytest.raises(ConfigError, match=rf"'{M}.target_parameters' = \['experts.down_proj'\].*no MoE layers"):
        make_plan(load_config(overrides=[*STEP, f"{M}.lora_rank=8", f"{M}.target_parameters=[experts.down_proj]"]),
                  Q7, H200)
    with pytest.raises(ValueError, match=rf"'{M}.target_parameters'.*match no 3-D expert tensor.*'qwen2'"):
        apply_lora(_tiny()[1], LoraSettings(4, 8.0, "all-linear", ("experts.down_proj",)))


@pytest.mark.parametrize("kind", ["qwen3_moe", "mixtral"])
@pytest.mark.parametrize("targets, experts", [((), EXPERTS), ("all-linear", ["experts.gate_up_proj"])])
def test_expert_adapter_count_matches_peft_and_the_plan(kind, targets, experts):
    cfg, model = _moe(kind)
    shape = ModelShape.from_hf_config(cfg)
    apply_lora(model, LoraSettings(4, 8.0, targets, tuple(experts)))
    trainable = {n: p.numel() for n, p in model.named_parameters() if p.requires_grad}
    assert sum(trainable.values()) == adapter_param_count(shape, 4, targets, experts) > 0
    assert any(".experts." in n for n in trainable)
    plan = make_plan(load_config(overrides=[*STEP, f"{M}.lora_rank=4", f"{M}.target_modules={list(targets)}"
                                            if targets != "all-linear" else f"{M}.target_modules=all-linear",
                                            f"{M}.target_parameters=[{','.join(experts)}]",
                                            "actor_rollout_ref.actor.fsdp_config.model_dtype=bf16"]), cfg, H200)
    adapters = adapter_param_count(shape, 4, targets, experts)
    assert plan.predicted["update_actor"].parts["actor grads"] == adapters * 2
    # the adapted experts' base is borrowed too (the engine adds their update unmerged from its own factors, the
    # rank padded to 8 in bf16)
    assert plan.rollout.borrowed_params == shape.engine_whole_params(tuple(lora_target_names(targets)))
    assert plan.rollout.borrowed_params > shape.engine_whole_params((*lora_target_names(targets), *experts))
    assert plan.rollout.expert_lora == "unmerged"
    assert plan.rollout.engine_adapter_params == adapter_param_count(shape, 8, (), experts)


@pytest.mark.parametrize("kind, targets", [("qwen3_moe", ("q_proj",)), ("mixtral", ())])
def test_expert_lora_merge_and_adapter_equal_peft(tmp_path, kind, targets):
    """merge_lora_state (checkpoints, `hybridrl merge`) gives peft's merge_and_unload weights, and the adapter
    directory `write_lora_adapter` writes loads into peft with the same outputs."""
    from peft import LoraConfig, PeftModel, get_peft_model

    from hybridrl.training.merge import write_lora_adapter

    cfg, base = _moe(kind)
    settings = LoraSettings(4, 8.0, targets, tuple(EXPERTS))
    model = apply_lora(copy.deepcopy(base), settings)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.normal_(0, 0.1)
    peft = get_peft_model(copy.deepcopy(base), LoraConfig(r=4, lora_alpha=8.0, target_modules=list(targets),
                                                          target_parameters=EXPERTS))
    peft.base_model.model.load_state_dict(model.state_dict())
    want = peft.merge_and_unload().state_dict()
    merged = write_lora_adapter(model.state_dict(), settings.to_json(), tmp_path / "adapter", "float32")
    assert merged.keys() == want.keys()
    for k in want:
        torch.testing.assert_close(merged[k], want[k], atol=1e-6, rtol=1e-6, msg=k)
    ids = torch.randint(0, 96, (2, 7))
    loaded = PeftModel.from_pretrained(copy.deepcopy(base), tmp_path / "adapter")
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits, atol=1e-5, rtol=1e-5)
        assert (model(ids).logits - base(ids).logits).abs().max() > 1e-3


def test_lora_on_an_moe_model_with_dense_layers_keeps_their_mlp_adapters():
    """peft on transformers 5 would turn gate_proj / up_proj / down_proj targets of an MoE model type into adapters
    on the experts (its conversion of transformers-4 adapters); the dense layer's linears must keep them."""
    cfg, model = _moe("qwen3_moe")   # layer 1 is dense (mlp_only_layers)
    apply_lora(model, LoraSettings(4, 8.0, "all-linear"))
    trainable = {n: p.numel() for n, p in model.named_parameters() if p.requires_grad}
    adapted = {n.partition(".lora_")[0] for n in trainable}
    assert {f"model.layers.1.mlp.{p}" for p in ("gate_proj", "up_proj", "down_proj")} <= adapted
    assert not any(".experts" in n for n in adapted)
    assert sum(trainable.values()) == adapter_param_count(ModelShape.from_hf_config(cfg), 4, "all-linear")
