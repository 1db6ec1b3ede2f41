"""LoRA on mixture-of-experts experts (`target_parameters`, peft's ParamWrapper) through the hybrid engine.

Checks, on tiny random Qwen3-MoE and Mixtral models (fp32, CPU): after an optimizer step that moves the expert
adapters, the engine's greedy tokens equal HF generate on the peft model merged by peft itself (`merge_and_unload`),
and before it the base model's; the reference (adapters off) computes the base model; expert tensors with adapters
are copied merged, never borrowed; the same on 2 gloo ranks with the actor under FSDP (gradient checkpointing on)
and a TP = 2 engine, where FSDP splits the experts and their adapters on different rows."""

import copy
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import transformers
from test_borrow_weights import GREEDY, PROMPTS, engine_for
from test_hybrid_engine import actor_update, free_port, hf_greedy

from hybridrl.hybrid.engine import HybridEngine
from hybridrl.training.lora import EXPERT_TARGETS, LoraSettings, adapters_disabled, apply_lora

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


def _rollout(hybrid):
    with hybrid.rollout({}) as engine:
        return [o.outputs[0].token_ids for o in engine.generate(PROMPTS, GREEDY)]


@pytest.mark.parametrize("kind", ["qwen3_moe", "mixtral"])
@pytest.mark.parametrize("targets, experts", [((), EXPERT_TARGETS), (("q_proj", "o_proj"), ("experts.down_proj",))],
                         ids=["experts", "attention+down"])
def test_engine_generates_with_the_merged_experts_after_an_update(kind, targets, experts):
    base = tiny_hf_model(kind)
    module = apply_lora(copy.deepcopy(base), LoraSettings(RANK, ALPHA, targets, experts), torch.float32)
    trained = [n for n, p in module.named_parameters() if p.requires_grad]
    assert trained and all(".lora_" in n for n in trained) and any(".experts." in n for n in trained)
    optimizer = torch.optim.SGD([p for p in module.parameters() if p.requires_grad], lr=5.0)
    hybrid = HybridEngine(module, optimizer, engine_for(base.config), device=torch.device("cpu"),
                          dtype=torch.float32, borrow_weights=True)
    borrowed = hybrid.resharder.borrowed_names()
    assert borrowed and not any(n.endswith(experts) for n in borrowed)   # adapted experts arrive merged
    assert any(n.endswith("mlp.gate.weight") for n in borrowed)         # the frozen routers are still lent

    before = _rollout(hybrid)
    assert before == hf_greedy(base, PROMPTS)
    actor_update(module, optimizer, hybrid)
    assert all(p.abs().sum() > 0 for n, p in module.named_parameters() if ".lora_B." in n)
    after = _rollout(hybrid)
    assert after == hf_greedy(peft_merged(base, module.state_dict(), targets, experts), PROMPTS)
    assert after != before, "the update did not change the greedy tokens; the test would prove nothing"

    ids = torch.tensor([PROMPTS[0]])
    with torch.no_grad():
        with adapters_disabled(module):
            reference = module(ids).logits
        assert torch.equal(reference, base(ids).logits)                    # the reference is the base model
        assert (module(ids).logits - reference).abs().max() > 1e-3         # and the adapters do move the policy


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
        if dist.is_initialized():
            dist.destroy_process_group()


def test_fsdp_actor_and_tp_engine_generate_with_the_merged_experts():
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "model"
        tiny_hf_model("qwen3_moe").save_pretrained(model_dir)
        port = free_port()
        procs = [ctx.Process(target=_fsdp_worker, args=(r, 2, port, model_dir, q)) for r in range(2)]
        for p in procs:
            p.start()
        results = sorted((q.get(timeout=240) for _ in procs), key=lambda r: r[0])
        for p in procs:
            p.join(timeout=60)
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
