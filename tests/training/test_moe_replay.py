"""Routing replay end to end on CPU (fp32, tiny Qwen3-MoE and Mixtral): the native engine records each token's
experts, outputs_to_dataproto aligns them with input_ids, and the actor's forward (padded and packed) routes every
recorded token to exactly those experts; the mismatch metric is 0 with the rollout's weights and > 0 with perturbed
routers, whose gradients still flow through the replayed gates."""

import copy

import pytest
import torch
import transformers
from _training_tiny import make_tiny_moe_dir
from typed_sections import actor_section

from hybridrl.protocol import DataProto
from hybridrl.rollout.config import EngineConfig
from hybridrl.rollout.engine import LLMEngine
from hybridrl.rollout.sampling_params import SamplingParams
from hybridrl.rollout.to_dataproto import outputs_to_dataproto
from hybridrl.training import DataParallelPPOActor
from hybridrl.training.fsdp import load_hf_model
from hybridrl.training.micro_batches import UpdateBatches
from hybridrl.training.packed_attention import register_varlen_attention

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14], [20, 21, 22, 23, 24]]
P, R = 8, 7


@pytest.fixture(scope="module", params=["qwen3_moe", "mixtral"])
def rollout(request, tmp_path_factory):
    path = make_tiny_moe_dir(tmp_path_factory.mktemp(request.param), request.param)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    engine = LLMEngine(hf.config, EngineConfig(dtype=torch.float32, block_size=4, num_kv_blocks=128, max_num_seqs=16,
                                               max_num_batched_tokens=64, max_model_len=P + R + 1, enforce_eager=True,
                                               record_routed_experts=True), device="cpu")
    engine.wake_up(("weights",))
    engine.load_weights(hf.state_dict().items())
    outs = engine.generate(PROMPTS, SamplingParams(n=2, temperature=1.0, max_tokens=R, ignore_eos=True, seed=3))
    ids = torch.zeros(len(PROMPTS), P, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(PROMPTS):   # left-padded, as the dataset makes them
        ids[i, P - len(p):], mask[i, P - len(p):] = torch.tensor(p), 1
    prompts = DataProto.from_dict({"input_ids": ids, "attention_mask": mask,
                                   "position_ids": (mask.cumsum(1) - 1).clamp(min=0)})
    data = outputs_to_dataproto(prompts, outs, response_length=R, pad_token_id=0)
    g = torch.Generator().manual_seed(0)
    data.batch["advantages"] = torch.randn(data.batch["responses"].shape, generator=g)
    data.batch["old_log_probs"] = data.batch["rollout_log_probs"]
    data.meta_info.update(temperature=1.0, micro_batch_size=3)
    return path, data


def _actor(model, packed):
    cfg = actor_section(ppo_epochs=1, clip_ratio=0.2, loss_agg_mode="token-mean", entropy_coeff=0.0,
                        use_kl_loss=False, grad_clip=1e9, router_replay={"mode": "R3"})
    return DataParallelPPOActor(cfg, model, torch.optim.SGD(model.parameters(), lr=1.0),
                                batches=UpdateBatches(6, 3, None), use_remove_padding=packed)


def _experts_seen(model):
    """The top-k ids each experts module receives, per MoE layer, over the forwards that follow."""
    seen = []
    layers = [m for m in model.modules() if type(m).__name__.endswith("Experts")]
    for i, m in enumerate(layers):
        seen.append([])
        m.register_forward_pre_hook(lambda mod, args, i=i: seen[i].append(args[1].clone()))
    return seen


def _perturbed_routers(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.add_(torch.randn_like(p) * 0.5)
    return model


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("perturbed", [False, True])
def test_replay_routes_to_the_rollouts_experts(rollout, packed, perturbed):
    path, data = rollout
    base = load_hf_model(str(path))
    base.set_attn_implementation(register_varlen_attention())
    model = _perturbed_routers(base) if perturbed else base
    seen = _experts_seen(model)
    lp, _ = _actor(model, packed).compute_log_prob(data)
    routed, mask = data.batch["routed_experts"].long(), data.batch["attention_mask"].bool()
    E = model.config.num_experts if hasattr(model.config, "num_experts") else model.config.num_local_experts
    # the forward's token order: padded rows flattened, or the real tokens row by row (packed)
    expected = routed[mask] if packed else routed.reshape(-1, *routed.shape[2:])
    recorded = (expected < E).all(-1)
    assert recorded.sum() > 0.8 * recorded.shape[0] * (1 if packed else 0.5)
    for layer, calls in enumerate(seen):
        got = torch.cat(calls)   # micro-batches in order (fixed rows: row order)
        assert torch.equal(got[recorded[:, layer]], expected[:, layer][recorded[:, layer]])
    rl = data.batch["rollout_log_probs"]
    rmask = data.batch["response_mask"].bool()
    if not perturbed:  # the rollout's weights and its routing: the rollout's log-probs
        torch.testing.assert_close(lp[rmask], rl[rmask], atol=1e-4, rtol=0)


@pytest.mark.parametrize("packed", [False, True])
def test_the_mismatch_metric_and_router_gradients_under_replay(rollout, packed):
    path, data = rollout
    base = load_hf_model(str(path))
    base.set_attn_implementation(register_varlen_attention())
    same = _actor(copy.deepcopy(base), packed).update_policy(copy.deepcopy(data))
    assert same["actor/routing_mismatch_frac"] == 0.0
    model = _perturbed_routers(copy.deepcopy(base))
    before = {n: p.detach().clone() for n, p in model.named_parameters() if n.endswith("mlp.gate.weight")}
    metrics = _actor(model, packed).update_policy(copy.deepcopy(data))
    assert metrics["actor/routing_mismatch_frac"] > 0.05
    params = dict(model.named_parameters())
    assert all(not torch.equal(params[n], b) for n, b in before.items())   # the gates carried the gradient
    dropped = copy.deepcopy(data)
    dropped.batch.pop("routed_experts")
    with pytest.raises(ValueError, match="needs the rollout's 'routed_experts'"):
        _actor(copy.deepcopy(base), packed).compute_log_prob(dropped)
