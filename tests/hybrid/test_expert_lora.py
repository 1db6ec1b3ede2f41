"""LoRA on mixture-of-experts experts (`target_parameters`, peft's ParamWrapper) through the hybrid engine.

Checks, on tiny random Qwen3-MoE and Mixtral models (fp32, CPU): after an optimizer step that moves the expert
adapters, the engine's greedy tokens equal HF generate on the peft model merged by peft itself (`merge_and_unload`),
and before it the base model's; the reference (adapters off) computes the base model. Where the engine borrows
(one rank, TP = 1, the engine's dtype) an adapted expert tensor's base is the actor's own storage and the engine adds
the update unmerged from its own factors (both grouped-GEMM backends); without borrowing it gets merged copies; a
wrong unmerged term (scaling dropped, factors on the wrong experts) changes the tokens. The merged path again on 2
gloo ranks with the actor under FSDP (gradient checkpointing on) and a TP = 2 engine, where FSDP splits the experts
and their adapters on different rows."""

import copy
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import transformers
from gloo_ranks import end_process_group
from test_borrow_weights import GREEDY, PROMPTS, engine_for
from test_hybrid_engine import actor_update, hf_greedy, run_two_ranks

from hybridrl.hybrid.engine import HybridEngine
from hybridrl.training.lora import (
    EXPERT_TARGETS,
    LoraSettings,
    adapters_disabled,
    apply_lora,
    engine_parameters,
)

RANK, ALPHA = 4, 8.0


def tiny_moe_config(kind: str):
    """Qwen3-MoE with a dense middle layer (mlp_only_layers) or Mixtral; 8 or 4 experts, top 2."""
    common = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, vocab_size=96,
                  max_position_embeddings=128, tie_word_embeddings=False, num_experts_per_tok=2, eos_token_id=None)
    if kind == "qwen3_moe":
        return transformers.Qwen3MoeConfig(**common, num_hidden_layers=3, intermediate_size=128, head_dim=16,
                                           num_experts=8, moe_intermediate_size=32, mlp_only_layers=[1])
    return transformers.MixtralConfig(**common, num_hidden_layers=2, intermediate_size=48, num_local_experts=4)


def tiny_hf_model(kind: str):
    """Random weights, larger than HF's init so that greedy paths differ between prompts and tokens spread over the
    experts."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(tiny_moe_config(kind), dtype=torch.float32).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.2)
    return model


def peft_merged(base, state, targets, experts):
    """peft's own merge of these adapters into `base`: a PeftModel with the same config, loaded with `state` (the
    module's state dict: inject_adapter_in_model and get_peft_model name parameters alike), merged and unloaded."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=list(targets) or None,
                        target_parameters=list(experts))
    model = get_peft_model(copy.deepcopy(base), config)
    model.base_model.model.load_state_dict(state)
    return model.merge_and_unload().eval()


def _rollout(hybrid, seen=None):
    with hybrid.rollout({}) as engine:
        if seen is not None:
            seen.update(_engine_experts(engine))
        return [o.outputs[0].token_ids for o in engine.generate(PROMPTS, GREEDY)]


def _engine_experts(engine) -> dict:
    """Experts module name -> its parameters' storage and shapes while the engine is awake."""
    from hybridrl.models.moe import Experts

    return {name: {n: (p.data_ptr(), tuple(p.shape)) for n, p in m.named_parameters()}
            for name, m in engine.runner.model.named_modules() if isinstance(m, Experts)}


def _generate_after_update(kind, targets, experts, borrow, backend="auto"):
    """(base, module, hybrid, greedy tokens before and after one update, the experts seen awake after it)."""
    base = tiny_hf_model(kind)
    module = apply_lora(copy.deepcopy(base), LoraSettings(RANK, ALPHA, targets, experts), torch.float32)
    trained = [n for n, p in module.named_parameters() if p.requires_grad]
    assert trained and all(".lora_" in n for n in trained) and any(".experts." in n for n in trained)
    optimizer = torch.optim.SGD([p for p in module.parameters() if p.requires_grad], lr=5.0)
    engine = engine_for(base.config)
    for m in engine.runner.model.modules():
        if hasattr(m, "backend"):
            m.backend = backend
    hybrid = HybridEngine(module, optimizer, engine, device=torch.device("cpu"), dtype=torch.float32,
                          borrow_weights=borrow)
    before = _rollout(hybrid)
    assert before == hf_greedy(base, PROMPTS)
    actor_update(module, optimizer, hybrid)
    assert all(p.abs().sum() > 0 for n, p in module.named_parameters() if ".lora_B." in n)
    seen = {}
    after = _rollout(hybrid, seen)
    return base, module, hybrid, before, after, seen


CASES = [((), EXPERT_TARGETS), (("q_proj", "o_proj"), ("experts.down_proj",))]


@pytest.mark.parametrize("kind", ["qwen3_moe", "mixtral"])
@pytest.mark.parametrize("targets, experts", CASES, ids=["experts", "attention+down"])
def test_engine_generates_with_the_adapted_experts_after_an_update(kind, targets, experts):
    """Borrowing (TP = 1, one rank, the engine's dtype): the adapted expert tensors' bases are the actor's own
    storage and the engine adds the update unmerged from its own small factors; without borrowing it holds merged
    copies. Both generate what HF generates on peft's merge_and_unload, on either grouped-GEMM backend."""
    merged_run = _generate_after_update(kind, targets, experts, borrow=False)
    base, module, hybrid, before, after, seen = _generate_after_update(kind, targets, experts, borrow=True)
    expected = hf_greedy(peft_merged(base, module.state_dict(), targets, experts), PROMPTS)
    assert merged_run[4] == expected                      # the merged path (no borrowing)
    assert after == expected                              # the unmerged path
    assert after != before, "the update did not change the greedy tokens; the test would prove nothing"
    _, _, _, _, sorted_after, _ = _generate_after_update(kind, targets, experts, borrow=True, backend="sorted")
    assert sorted_after == expected                       # the per-slice fallback backend computes the same

    borrowed, unmerged = hybrid.resharder.borrowed_names(), hybrid.resharder.unmerged_experts()
    adapted = {n for n in borrowed if n.endswith(experts)}
    assert adapted and unmerged == adapted                # adapted experts: base borrowed, LoRA unmerged
    assert not any(n.endswith(tuple(set(EXPERT_TARGETS) - set(experts))) for n in unmerged)
    assert any(n.endswith("mlp.gate.weight") for n in borrowed)
    assert not merged_run[2].resharder.borrowed_names()
    assert all(set(params) == {"gate_up_proj", "down_proj"} for params in merged_run[5].values())   # no factors
    actor = {n: p.data_ptr() for n, p, _ in engine_parameters(module)}
    factors = 0
    for owner, params in seen.items():                   # the engine's module names are HF's
        for leaf in ("gate_up_proj", "down_proj"):
            name = f"{owner}.{leaf}"
            assert params[leaf][0] == actor[name]         # the base is the actor's tensor, adapted or not
            if name in unmerged:
                (a_ptr, a_shape), (b_ptr, b_shape) = params[f"{leaf}_lora_A"], params[f"{leaf}_lora_B"]
                assert a_ptr not in actor.values() and b_ptr not in actor.values()
                E, out, inp = module.get_parameter(_peft_name(module, name)).shape
                assert a_shape == (E, RANK, inp) and b_shape == (E, out, RANK)   # fp32: rank 4 is 16 bytes
                factors += 2
            else:
                assert f"{leaf}_lora_A" not in params
    assert factors == 2 * len(unmerged)

    ids = torch.tensor([PROMPTS[0]])
    with torch.no_grad():
        with adapters_disabled(module):
            reference = module(ids).logits
        assert torch.equal(reference, base(ids).logits)                    # the reference is the base model
        assert (module(ids).logits - reference).abs().max() > 1e-3         # and the adapters do move the policy


@pytest.mark.parametrize("backend", ["grouped_mm", "sorted"])
def test_unmerged_experts_in_bf16_pad_the_rank_and_match_the_merged_update(backend):
    """In bf16 a rank-4 factor's rows are 8 bytes, under the grouped kernel's 16: the engine pads the rank to 8 with
    zeros, and the unmerged block computes what experts holding W + scaling·B·A (merged in fp32) compute."""
    from hybridrl.models.moe import Experts, padded_rank

    torch.manual_seed(0)
    E, H, I, r, scaling = 4, 64, 32, 4, 2.0
    w = {"gate_up_proj": torch.randn(E, 2 * I, H) * 0.2, "down_proj": torch.randn(E, H, I) * 0.2}
    factors = {n: (torch.randn(E, r, t.shape[2]) * 0.2, torch.randn(E, t.shape[1], r) * 0.2) for n, t in w.items()}
    unmerged, merged = Experts(E, H, I).to(torch.bfloat16), Experts(E, H, I).to(torch.bfloat16)
    for n, t in w.items():
        unmerged.add_adapter(n, r, scaling)
        unmerged.load(n, t)
        a, b = factors[n]
        unmerged.load(f"{n}_lora_A", a)
        unmerged.load(f"{n}_lora_B", b)
        merged.load(n, torch.baddbmm(t, b, a, alpha=scaling))
    assert padded_rank(r, 2) == 8 and unmerged.gate_up_proj_lora_A.shape == (E, 8, H)
    assert unmerged.down_proj_lora_B.shape == (E, H, 8) and not unmerged.down_proj_lora_B[..., r:].any()
    unmerged.backend = merged.backend = backend
    if backend == "grouped_mm" and unmerged.resolve_backend(torch.device("cpu"), torch.bfloat16) != backend:
        pytest.skip("torch has no grouped matmul here")
    x = torch.randn(10, H, dtype=torch.bfloat16)
    ids = torch.stack([torch.randperm(E)[:2] for _ in range(10)])
    weights = torch.softmax(torch.randn(10, 2), -1).to(torch.bfloat16)
    got, want = unmerged(x, ids, weights), merged(x, ids, weights)
    assert (got.float() - want.float()).abs().max() <= 0.03 * want.float().abs().max()
    assert (got.float() - Experts.forward(unmerged_without(unmerged), x, ids, weights).float()).abs().max() > 0.1


def unmerged_without(experts):
    """The same experts with their adapters ignored (the test's control that the update matters)."""
    clone = copy.copy(experts)
    clone.adapters = {}
    return clone


def _peft_name(module, hf_name):
    """The module's parameter name of an HF name (peft nests `base_layer` levels)."""
    from hybridrl.training.lora import _hf_name

    return next(n for n, _ in module.named_parameters() if _hf_name(n) == hf_name)


@pytest.mark.parametrize("broken", ["scaling", "factors"])
def test_a_wrong_unmerged_update_changes_the_tokens(monkeypatch, broken):
    """The token test can fail: with the unmerged term's scaling dropped (1 instead of alpha / rank), or with its
    factors swapped between experts, the engine no longer generates what peft's merged model does."""
    from hybridrl.models.moe import Experts

    if broken == "scaling":
        add = Experts.add_adapter
        monkeypatch.setattr(Experts, "add_adapter", lambda self, name, rank, scaling: add(self, name, rank, 1.0))
    else:
        load = Experts.load
        monkeypatch.setattr(Experts, "load", lambda self, name, tensor, shard_id=None: load(
            self, name, tensor.roll(1, 0) if "_lora_" in name else tensor, shard_id))
    base, module, hybrid, before, after, _ = _generate_after_update("qwen3_moe", (), EXPERT_TARGETS, borrow=True)
    assert hybrid.resharder.unmerged_experts()
    assert after != hf_greedy(peft_merged(base, module.state_dict(), (), EXPERT_TARGETS), PROMPTS)


def _fsdp_worker(rank, world, port, model_dir, q):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from typed_sections import FP32_MASTERS, model_source

    from hybridrl.hybrid.meshes import build_rollout_mesh
    from hybridrl.rollout.config import EngineConfig
    from hybridrl.rollout.engine import LLMEngine
    from hybridrl.training.fsdp import build_fsdp_model, build_training_mesh

    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        torch.manual_seed(0)
        lora = LoraSettings(RANK, ALPHA, ("q_proj",), EXPERT_TARGETS)
        module = build_fsdp_model(model_source(model_dir), FP32_MASTERS, build_training_mesh(world, -1, "cpu"),
                                  torch.device("cpu"), lora=lora, gradient_checkpointing=True)
        module.train()
        optimizer = torch.optim.SGD([p for p in module.parameters() if p.requires_grad], lr=5.0)
        hf_config = transformers.AutoConfig.from_pretrained(model_dir)
        config = EngineConfig(dtype=torch.float32, max_model_len=32, max_num_batched_tokens=64, num_kv_blocks=32,
                              block_size=4, enforce_eager=True)
        tp_group = build_rollout_mesh("cpu", world, world).get_group("infer_tp")
        hybrid = HybridEngine(module, optimizer, LLMEngine(hf_config, config, tp_group=tp_group, device="cpu"),
                              device=torch.device("cpu"), dtype=torch.float32)
        before = _rollout(hybrid)
        actor_update(module, optimizer, hybrid)
        after = _rollout(hybrid)
        state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True))
        if rank == 0:   # through a file: a tensor sent on the queue dies with its process
            torch.save({k: v.detach().clone() for k, v in state.items()}, Path(model_dir).parent / "state.pt")
        q.put((rank, before, after, None))
    except Exception:  # report instead of hanging the parent
        import traceback

        q.put((rank, None, None, traceback.format_exc()))
    finally:
        end_process_group()


def test_fsdp_actor_and_tp_engine_generate_with_the_merged_experts():
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "model"
        tiny_hf_model("qwen3_moe").save_pretrained(model_dir)
        results = run_two_ranks(_fsdp_worker, model_dir, timeout_s=240)
        for rank, *_, err in results:
            assert err is None, f"rank {rank}:\n{err}"
        base = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        state = torch.load(Path(tmp) / "state.pt")
    (_, before, after, _), (_, before1, after1, _) = results
    assert before == before1 and after == after1                  # one TP group: the same tokens on both ranks
    assert before == hf_greedy(base, PROMPTS)
    assert any(".experts." in k and ".lora_B." in k and v.abs().sum() > 0 for k, v in state.items())
    assert after == hf_greedy(peft_merged(base, state, ("q_proj",), EXPERT_TARGETS), PROMPTS)
    assert after != before, "the update did not change the greedy tokens; the test would prove nothing"
