"""The plan's Liger and kept-layer choices reach the model the worker builds: on one gloo rank,
workers.common.build_fsdp_model calls Liger's apply function for the architecture on the plain HF model (before
LoRA's adapters, with Liger's own cross-entropy off) and recomputes all decoder layers but the kept ones. liger-kernel
is replaced by a recording stand-in (its kernels need CUDA)."""

import sys
import types

import pytest
import torch
import torch.distributed as dist

from hybridrl.config import load_config
from hybridrl.training.fsdp import build_training_mesh, recomputed_layers


@pytest.fixture
def fake_liger(monkeypatch):
    calls = []

    def apply(**kw):
        model = kw.pop("model")
        lora = any("lora_" in n for n, _ in model.named_parameters())
        calls.append((type(model).__name__, lora, kw))

    pkg, sub = types.ModuleType("liger_kernel"), types.ModuleType("liger_kernel.transformers")
    sub.apply_liger_kernel_to_qwen2 = apply
    pkg.transformers = sub
    monkeypatch.setitem(sys.modules, "liger_kernel", pkg)
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", sub)
    return calls


@pytest.mark.parametrize("liger", [True, False])
def test_worker_model_gets_liger_before_lora_and_keeps_the_last_layers(tmp_path, tiny_model_dir, fake_liger, liger):
    pytest.importorskip("peft")
    from hybridrl.training.fsdp import FSDPDtypes
    from hybridrl.workers.common import build_fsdp_model

    cfg = load_config(overrides=[f"actor_rollout_ref.model.path={tiny_model_dir}", "actor_rollout_ref.model.lora_rank=4"])
    a = cfg.actor_rollout_ref
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        module, optimizer, _ = build_fsdp_model(a.model, FSDPDtypes.of(a.actor.fsdp_config), a.actor.optim,
                                                build_training_mesh(1, -1, "cpu"), torch.device("cpu"),
                                                trainable=True, gradient_checkpointing=True, recompute_kept_layers=1,
                                                liger=liger, use_varlen_attention=True)
    finally:
        dist.destroy_process_group()
    if liger:
        assert fake_liger == [("Qwen2ForCausalLM", False, dict(rope=True, rms_norm=True, swiglu=True,
                                                              cross_entropy=False, fused_linear_cross_entropy=False))]
    else:
        assert fake_liger == []
    layers = module.config.num_hidden_layers
    assert recomputed_layers(module) == layers - 1 and optimizer is not None


def test_a_worker_that_cannot_import_liger_says_which_key_to_change(monkeypatch):
    from transformers import AutoConfig, AutoModelForCausalLM

    from hybridrl.training.liger import apply_liger

    monkeypatch.setitem(sys.modules, "liger_kernel", None)   # import fails as if missing on this worker
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(
        "qwen2", hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=64))
    with pytest.raises(RuntimeError, match="use_liger=false"):
        apply_liger(model)
    model.config.model_type = "gpt2"
    with pytest.raises(ValueError, match="no Liger kernels for model_type 'gpt2'"):
        apply_liger(model)


def _fake_registry(monkeypatch, impls):
    """liger_kernel.backends.registry with RoPE implementations `impls` registered (liger-kernel >= 0.8)."""
    pkg, backends, registry = (types.ModuleType(n) for n in ("liger_kernel", "liger_kernel.backends",
                                                             "liger_kernel.backends.registry"))
    registry.get_registered = lambda op, impl: object() if op == "rope" and impl in impls else None
    pkg.backends, backends.registry = backends, registry
    for name, mod in (("liger_kernel", pkg), ("liger_kernel.backends", backends),
                      ("liger_kernel.backends.registry", registry)):
        monkeypatch.setitem(sys.modules, name, mod)


@pytest.fixture
def rope_env(monkeypatch):
    from hybridrl.training import liger

    monkeypatch.delenv(liger.ROPE_ENV, raising=False)
    monkeypatch.delenv("LIGER_KERNEL_BACKEND_ROPE", raising=False)
    return liger


def test_rope_is_pinned_to_liger_triton_kernel(monkeypatch, rope_env):
    """Where Liger chooses RoPE's implementation per call, the Triton one is named (a CuTe DSL one, taken where the
    cutlass DSL imports, recompiles for every packed micro-batch's token count)."""
    _fake_registry(monkeypatch, {"nvidia-triton", "nvidia-cutedsl"})
    assert rope_env.pin_triton_rope() == "nvidia-triton"
    assert rope_env.os.environ[rope_env.ROPE_ENV] == "nvidia-triton"


@pytest.mark.parametrize("var", ["LIGER_KERNEL_IMPL_ROPE", "LIGER_KERNEL_BACKEND_ROPE"])
def test_a_users_rope_choice_is_kept(monkeypatch, rope_env, var):
    _fake_registry(monkeypatch, {"nvidia-triton", "nvidia-cutedsl"})
    monkeypatch.setenv(var, "nvidia-cutedsl")
    assert rope_env.pin_triton_rope() == "nvidia-cutedsl"
    assert rope_env.os.environ.get(rope_env.ROPE_ENV) == ("nvidia-cutedsl" if var == rope_env.ROPE_ENV else None)


def test_a_liger_without_per_op_implementations_is_left_alone(monkeypatch, fake_liger, rope_env):
    assert rope_env.pin_triton_rope() is None                      # the stand-in has no liger_kernel.backends
    _fake_registry(monkeypatch, {"nvidia-cutedsl"})                  # or no Triton RoPE registered by that name
    assert rope_env.pin_triton_rope() is None
    assert rope_env.ROPE_ENV not in rope_env.os.environ


def test_apply_liger_pins_rope_before_patching(monkeypatch, fake_liger, rope_env):
    from transformers import AutoConfig, AutoModelForCausalLM

    seen = []
    monkeypatch.setattr(rope_env, "pin_triton_rope", lambda: seen.append(len(fake_liger)))
    cfg = AutoConfig.for_model("qwen2", vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                               num_attention_heads=2, num_key_value_heads=1)
    rope_env.apply_liger(AutoModelForCausalLM.from_config(cfg))
    assert seen == [0] and len(fake_liger) == 1
