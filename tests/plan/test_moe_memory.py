"""The memory model's MoE terms against what torch really holds (CPU, bf16, tiny models of both families): the
bytes autograd saves per token in an MoE block's grouped-GEMM forward, the bytes the router losses keep until
backward, the expert tensors LoRA on the experts rebuilds and autograd keeps, and a KV block's bytes with the
routing record as the engine allocates it."""

import sys
import weakref
from pathlib import Path

import pytest
import torch
import transformers

from hybridrl.plan.memory import MemoryModel, Residency
from hybridrl.plan.model_shape import EXPERT_TENSORS, ModelShape
from hybridrl.rollout.config import EngineConfig
from hybridrl.rollout.model_runner import ModelRunner
from hybridrl.training.lora import EXPERT_TARGETS, LoraSettings, apply_lora
from hybridrl.training.moe import RouterTaps, load_balancing_loss, load_kwargs, router_z_loss

sys.path.insert(0, str(Path(__file__).parents[1] / "training"))
from _training_tiny import tiny_moe_config  # noqa: E402

KINDS = ["qwen3_moe", "mixtral"]
T = 96


def _model(kind):
    torch.manual_seed(0)
    cfg = tiny_moe_config(kind)
    return transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, **load_kwargs(cfg))


def _saved_bytes(fn, exclude):
    """Bytes of the distinct storages autograd saved while fn ran and still holds for the backward of fn's output
    (a branch whose output was dropped frees what it saved), leaving out those of `exclude` tensors."""
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    saved = []

    def pack(t):
        saved.append(weakref.ref(t))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    alive = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for ref in saved if (t := ref()) is not None}
    return sum(n for ptr, n in alive.items() if ptr not in skip), out


@pytest.mark.parametrize("kind", KINDS)
def test_an_moe_blocks_saved_activations_are_its_width_and_dispatch_terms(kind):
    model = _model(kind)
    shape = ModelShape.from_hf_config(model.config)
    x = torch.randn(1, T, shape.hidden, dtype=torch.bfloat16, requires_grad=True)
    saved, _ = _saved_bytes(lambda: model.model.layers[0].mlp(x), [x, *model.parameters()])
    # the MLP terms of a layer (gate|up and the weighted product: 6 bytes per unit of the k experts' width) and the
    # dispatch
    predicted = 2 * 3 * shape.experts_per_token * shape.expert_intermediate + shape.moe_dispatch_bytes_per_token
    # the experts' offsets (E int32 per forward) are the only bytes not per token
    assert abs(saved / T - predicted) <= 0.01 * predicted, (saved / T, predicted)
    assert shape.moe_dispatch_bytes_per_token > 0.3 * predicted   # the dispatch is no rounding error here


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("aux, z", [(True, False), (False, True), (True, True)])
def test_router_losses_keep_what_the_model_says(kind, aux, z):
    model = _model(kind)
    shape = ModelShape.from_hf_config(model.config)
    taps = RouterTaps(model, collect_logits=True)
    ids = torch.randint(0, 300, (1, T))
    valid = torch.ones(T, dtype=torch.bool)

    def losses():
        terms = []
        if aux:
            terms.append(load_balancing_loss(model, taps.logits, valid))
        if z:
            terms.append(router_z_loss(taps.logits, valid))
        return sum(terms)

    with torch.no_grad():
        hidden = model.model.embed_tokens(ids)
    taps.set_tokens(valid)
    with taps.collecting():
        model(inputs_embeds=hidden.requires_grad_())
    logits = sum(x.untyped_storage().nbytes() for x in taps.logits)
    saved, _ = _saved_bytes(losses, [*taps.logits, *model.parameters()])
    predicted = shape.router_loss_bytes_per_token(aux, z)
    assert abs((logits + saved) / T - predicted) <= 0.02 * predicted, ((logits + saved) / T, predicted)


def test_a_kv_block_with_the_routing_record_is_what_the_engine_allocates():
    cfg = tiny_moe_config("qwen3_moe")
    shape = ModelShape.from_hf_config(cfg)
    res = Residency(shard=1, master_bytes=4, param_offload=False, optimizer_offload=False, has_ref=False,
                    ref_offload=False, critic=None, critic_shard=1, critic_param_offload=False,
                    critic_optimizer_offload=False, hybrid=True, rollout_tp=1, gradient_checkpointing=True,
                    critic_gradient_checkpointing=True)
    for record in (False, True):
        runner = ModelRunner(cfg, EngineConfig(record_routed_experts=record, block_size=16).for_model(cfg),
                             tp_group=None, device="cpu")
        plan = MemoryModel(shape, Residency(**{**res.__dict__, "routing_record": record})).kv_block_bytes(16)
        assert plan == runner.block_bytes()
    assert shape.routing_record_bytes_per_token == 2 * 2   # 2 MoE layers x top 2, uint8


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("experts", [EXPERT_TARGETS, ("experts.down_proj",)])
def test_expert_lora_keeps_one_rebuilt_copy_of_the_adapted_experts_per_layer(kind, experts):
    """peft's ParamWrapper computes the experts with W + scale·B·A, which autograd keeps for backward: per MoE layer
    the adapted tensors once more in bf16 (the plan's `lora_expert_bytes`). Against the frozen base, an adapted
    grouped GEMM also keeps its input (gathered rows for gate|up, the activation product for down), which the
    per-token terms already count (they model trained experts); the adapters' own bytes are negligible."""
    model = _model(kind).requires_grad_(False)
    shape = ModelShape.from_hf_config(model.config)
    x = torch.randn(1, T, shape.hidden, dtype=torch.bfloat16, requires_grad=True)
    frozen, _ = _saved_bytes(lambda: model.model.layers[0].mlp(x), [x, *model.parameters()])
    apply_lora(model, LoraSettings(4, 8.0, (), experts), torch.bfloat16)
    with_lora, _ = _saved_bytes(lambda: model.model.layers[0].mlp(x), [x, *model.parameters()])
    k = shape.experts_per_token
    inputs = {"experts.gate_up_proj": T * k * shape.hidden * 2,
              "experts.down_proj": T * k * shape.expert_intermediate * 2}
    assert EXPERT_TARGETS == tuple(EXPERT_TENSORS)
    assert with_lora - frozen - sum(inputs[n] for n in experts) == 2 * shape.expert_tensor_params(experts)


def test_the_plan_counts_the_rebuilt_expert_copies():
    from hybridrl.config import load_config
    from hybridrl.plan import DeviceSpec, make_plan
    from hybridrl.plan.memory import GiB

    cfg = tiny_moe_config("qwen3_moe")
    shape = ModelShape.from_hf_config(cfg)
    base = ["data.train_batch_size=8", "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "trainer.n_gpus_per_node=1", "actor_rollout_ref.model.lora_rank=4"]
    h200 = DeviceSpec("cuda", "H200", int(139.8 * GiB))
    copy = 2 * shape.expert_tensor_params(EXPERT_TARGETS)
    for recompute, copies in (("false", shape.moe_layers + 1), ("true", 2)):
        plan = make_plan(load_config(overrides=[
            *base, f"actor_rollout_ref.model.enable_gradient_checkpointing={recompute}",
            f"actor_rollout_ref.model.target_parameters=[{','.join(EXPERT_TARGETS)}]"]), cfg, h200)
        assert plan.predicted["update_actor"].parts["expert LoRA copies"] == copies * copy
        assert plan.predicted["old_log_prob"].parts["expert LoRA copies"] == 2 * copy
    plain = make_plan(load_config(overrides=base), cfg, h200)
    assert "expert LoRA copies" not in plain.predicted["update_actor"].parts
