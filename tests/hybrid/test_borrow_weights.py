"""Borrowed engine weights: where the actor holds a tensor whole in the engine's dtype and the engine holds it whole
in HF's layout, the hybrid engine uses the actor's tensor in place instead of a copy.

Checks: the plan's count of borrowed parameters equals what the resharder borrows (dense and MoE, full and LoRA, LoRA
on the experts, whose base tensors are borrowed too while the engine holds their factors and adds the update
unmerged: the plan counts those factors, and says which way the experts go);
the plan borrows only where it is safe (no FSDP sharding, TP = 1, equal dtypes, hybrid scheme, no param offload);
on one gloo rank the engine's parameters are the actor's storage, its own allocation shrinks by exactly those
bytes, the greedy tokens equal the copying engine's, the next rollout after an optimizer step follows the update,
and nothing of the actor is held after sleep; the engine refuses to borrow fused tensors or mismatched arrivals."""

import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import transformers
from test_hybrid_engine import actor_update, make_model_dir
from typed_sections import FP32_MASTERS, model_source

from hybridrl.config import load_config
from hybridrl.hybrid.reshard import FSDPToTPResharder
from hybridrl.models.moe import padded_rank
from hybridrl.plan import DeviceSpec, make_plan
from hybridrl.plan.memory import GiB
from hybridrl.plan.model_shape import ModelShape
from hybridrl.rollout.config import EngineConfig
from hybridrl.rollout.engine import LLMEngine
from hybridrl.rollout.sampling_params import SamplingParams
from hybridrl.training.lora import (
    EXPERT_TARGETS,
    LoraSettings,
    adapter_param_count,
    apply_lora,
    engine_parameters,
    lora_target_names,
)

A, R, M = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.model"
PROMPTS = [[5, 17, 33, 2, 9], [44, 3, 12], [7, 7, 7, 7, 7, 7, 7]]
GREEDY = SamplingParams(n=1, temperature=0.0, max_tokens=8, ignore_eos=True)


def qwen2(tied: bool):
    return transformers.Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, vocab_size=96, max_position_embeddings=128,
                                    tie_word_embeddings=tied, eos_token_id=None)


def qwen3_moe():
    return transformers.Qwen3MoeConfig(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_experts=8,
                                       num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, head_dim=16, vocab_size=96, max_position_embeddings=128,
                                       tie_word_embeddings=False, eos_token_id=None)


def engine_for(hf_config, dtype=torch.float32):
    config = EngineConfig(dtype=dtype, max_model_len=32, max_num_batched_tokens=64, num_kv_blocks=32, block_size=4,
                          enforce_eager=True)
    return LLMEngine(hf_config, config, device="cpu")


@pytest.mark.parametrize("hf_config, targets, experts", [
    (qwen2(tied=False), None, ()), (qwen2(tied=True), "all-linear", ()), (qwen2(tied=False), ("q_proj", "o_proj"), ()),
    (qwen3_moe(), None, ()), (qwen3_moe(), "all-linear", ()), (qwen3_moe(), "all-linear", ("experts.down_proj",)),
    (qwen3_moe(), (), EXPERT_TARGETS)],
    ids=["dense", "tied-lora", "lora-q-o", "moe", "moe-lora", "moe-lora-down-experts", "moe-experts-lora"])
def test_plan_counts_what_the_resharder_borrows(hf_config, targets, experts):
    torch.manual_seed(0)
    module = transformers.AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    if targets is not None:
        module = apply_lora(module, LoraSettings(4, 8, targets, experts), torch.float32)
    resharder = FSDPToTPResharder(module, engine_for(hf_config), torch.float32, torch.device("cpu"), borrow=True)
    params = {n: p for n, p, _ in engine_parameters(module)}   # under HF names
    borrowed = resharder.borrowed_names()
    runtime = sum(params[n].numel() for n in borrowed)
    shape = ModelShape.from_hf_config(hf_config)
    want = shape.engine_whole_params(tuple(lora_target_names(targets)) if targets is not None else ())
    assert borrowed and runtime == want == resharder.borrowed_params()
    assert not any(f".{k}." in n for n in borrowed for k in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"))
    adapted = {n for n in borrowed if n.endswith(experts)} if experts else set()
    assert resharder.unmerged_experts() == adapted and len(adapted) == shape.moe_layers * len(experts)
    factors = sum(p.numel() for n, p in resharder.engine.runner.model.named_parameters() if "_lora_" in n)
    assert factors == adapter_param_count(shape, padded_rank(4, 4), (), experts)   # what the plan counts
    # nothing is borrowed without the plan's consent, nor in another dtype than the engine's
    assert not FSDPToTPResharder(module, engine_for(hf_config), torch.float32, torch.device("cpu")).borrowed_names()
    assert not FSDPToTPResharder(module, engine_for(hf_config, torch.bfloat16), torch.bfloat16, torch.device("cpu"),
                                 borrow=True).borrowed_names()


H200 = DeviceSpec("cuda", "H200", int(139.8 * GiB))
STEP = ["data.train_batch_size=16", f"{R}.n=4", f"{A}.ppo_mini_batch_size=16", "data.max_prompt_length=128",
        "data.max_response_length=128", "trainer.n_gpus_per_node=1"]
Q15 = transformers.AutoConfig.for_model("qwen2", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                        num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                                        tie_word_embeddings=True)


def plan(*extra, device=H200):
    return make_plan(load_config(overrides=[*STEP, *extra]), Q15, device)


def test_plan_borrows_only_whole_tensors_in_the_engine_dtype_under_the_hybrid_scheme():
    fp32_masters, bf16, lora = plan(), plan(f"{A}.fsdp_config.model_dtype=bf16"), plan(f"{M}.lora_rank=16")
    shape = ModelShape.from_hf_config(Q15)
    assert fp32_masters.rollout.borrowed_params == 0          # fp32 masters, a bf16 engine: copies
    assert bf16.rollout.borrowed_params == shape.engine_whole_params()
    assert lora.rollout.borrowed_params == shape.engine_whole_params(tuple(lora_target_names("all-linear")))
    copied, *lent = (p.predicted["gen"].parts["engine weights"] for p in (fp32_masters, bf16, lora))
    assert lent == [copied - 2 * p.rollout.borrowed_params for p in (bf16, lora)]
    assert "used in place from the actor" in str(bf16) and "used in place" not in str(fp32_masters)
    for unsafe in ([f"{A}.fsdp_config.param_offload=true"],        # the actor's tensors leave the GPU in the rollout
                   [f"{R}.name=hf"],                                # HF generate runs on the actor's module itself
                   ["actor_rollout_ref.hybrid_engine=false"],       # a resident engine outlives the optimizer step
                   ["trainer.n_gpus_per_node=2"],                   # FSDP-sharded: no rank holds a tensor whole
                   ["trainer.n_gpus_per_node=2", f"{R}.tensor_model_parallel_size=2"]):   # TP slices
        assert plan(f"{A}.fsdp_config.model_dtype=bf16", *unsafe).rollout.borrowed_params == 0, unsafe


def test_plan_borrows_adapted_experts_and_counts_the_engines_factors():
    """LoRA on the experts: where the engine borrows, the plan counts the adapted expert tensors among the borrowed
    (the engine adds their update unmerged) and the factors the engine holds (rank padded to 8 in bf16) among its
    weights, and says so; where it does not (FSDP over 2 ranks), the experts are merged copies and it says that."""
    cfg = qwen3_moe()
    shape = ModelShape.from_hf_config(cfg)
    lora = [f"{M}.lora_rank=4", f"{M}.target_modules=[q_proj]",
            f"{M}.target_parameters=[{','.join(EXPERT_TARGETS)}]"]
    plain, lent = (make_plan(load_config(overrides=[*STEP, *extra]), cfg, H200) for extra in ([], lora))
    factors = adapter_param_count(shape, 8, (), EXPERT_TARGETS)
    assert lent.rollout.borrowed_params == shape.engine_whole_params(("q_proj",))
    assert lent.rollout.borrowed_params > shape.engine_whole_params(("q_proj", *EXPERT_TARGETS))
    assert lent.rollout.engine_adapter_params == factors and lent.rollout.expert_lora == "unmerged"
    assert (lent.predicted["gen"].parts["engine weights"]
            == 2 * (shape.num_params - lent.rollout.borrowed_params + factors))
    assert "base borrowed, LoRA applied unmerged" in str(lent) and "experts  " not in str(plain)
    sharded = make_plan(load_config(overrides=[*STEP, *lora, "trainer.n_gpus_per_node=2"]), cfg, H200)
    assert sharded.rollout.borrowed_params == 0 and sharded.rollout.engine_adapter_params == 0
    assert sharded.rollout.expert_lora == "merged" and "LoRA merged" in str(sharded)


def test_engine_refuses_fused_borrows_and_mismatched_arrivals():
    engine = engine_for(qwen2(tied=False))
    with pytest.raises(ValueError, match="q_proj.weight.*cannot be borrowed"):
        engine.wake_up(("weights",), borrowed=["model.layers.0.self_attn.q_proj.weight"])
    engine.wake_up(("weights",), borrowed=["model.norm.weight"])
    with pytest.raises(ValueError, match=r"model.norm.weight was woken as borrowed.*float32"):
        engine.load_weights([("model.norm.weight", torch.ones(64, dtype=torch.bfloat16))])


def _one_rank_run(store: str, borrow: bool):
    from torch.distributed.tensor import DTensor

    from hybridrl.hybrid.engine import HybridEngine
    from hybridrl.training.fsdp import build_fsdp_model, build_training_mesh

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    try:
        model_dir = make_model_dir(Path(store).parent / "model")   # a qwen2(tied=False) model
        module = build_fsdp_model(model_source(model_dir), FP32_MASTERS, build_training_mesh(1, -1, "cpu"),
                                  torch.device("cpu"))
        optimizer = torch.optim.SGD(module.parameters(), lr=5.0)
        engine = engine_for(qwen2(tied=False))
        hybrid = HybridEngine(module, optimizer, engine, device=torch.device("cpu"), dtype=torch.float32,
                              borrow_weights=borrow)
        storage = {n: (p.to_local() if isinstance(p, DTensor) else p).data_ptr() for n, p in module.named_parameters()}
        seen = {}

        def rollout():
            metrics = {}
            with hybrid.rollout(metrics) as e:
                outs = e.generate(PROMPTS, GREEDY)
                runner = e.runner
                seen["aliased"] = sorted(n for n in hybrid.resharder.borrowed_names()
                                         if runner.model.get_parameter(runner.model.resolve_hf_name(n)[0]).data_ptr()
                                         == storage[n])
                seen["own_bytes"] = runner._weight_bytes(own=True)
                seen["all_bytes"] = runner._weight_bytes()
            return [o.outputs[0].token_ids for o in outs], metrics

        before, metrics = rollout()
        first = dict(seen)
        actor_update(module, optimizer, hybrid)
        after, _ = rollout()
        held = [p for p in engine.runner.model.parameters() if not p.is_meta]
        return before, after, metrics, first, hybrid.resharder.borrowed_names(), held
    finally:
        dist.destroy_process_group()


def test_borrowed_weights_are_the_actors_tensors_and_follow_updates():
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        copy = _one_rank_run(f"{a}/store", borrow=False)
        lent = _one_rank_run(f"{b}/store", borrow=True)
    (before, after, metrics, seen, names, held), (c_before, c_after, c_metrics, c_seen, c_names, _) = lent, copy
    assert before == c_before and after == c_after and before != after   # same tokens; the update is followed
    assert not c_names and c_metrics["reshard/borrowed_gb"] == 0
    assert names and seen["aliased"] == sorted(names)                     # the engine reads the actor's storage
    borrowed_bytes = metrics["reshard/borrowed_gb"] * 1e9
    assert borrowed_bytes == pytest.approx(4 * ModelShape.from_hf_config(qwen2(tied=False)).engine_whole_params())
    assert seen["all_bytes"] == c_seen["all_bytes"]
    assert seen["own_bytes"] == pytest.approx(c_seen["own_bytes"] - borrowed_bytes)
    assert held == []                                                     # asleep: nothing of the actor kept
