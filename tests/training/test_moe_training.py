"""MoE models in the actor (fp32, CPU): grouped-GEMM experts against HF's eager loop over experts (log-probs and
gradients, padded and packed forwards), the router's load-balancing and z-losses against transformers' own
numbers and their gradients reaching the routers, routing replay of given experts, FSDP over 2 gloo ranks equal to
one rank."""

import copy

import pytest
import torch
import transformers
from _training_tiny import make_ppo_batch, make_tiny_moe_dir

from hybridrl.algorithms import logprobs_from_logits
from hybridrl.training import DataParallelPPOActor
from hybridrl.training.fsdp import load_hf_model
from hybridrl.training.moe import RouterTaps, router_settings
from hybridrl.training.packing import forward_response_logits, register_varlen_attention

KINDS = ["qwen3_moe", "mixtral"]


@pytest.fixture(scope="module", params=KINDS)
def moe_dir(request, tmp_path_factory):
    return make_tiny_moe_dir(tmp_path_factory.mktemp(request.param), request.param)


def _eager(path):
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                              experts_implementation="eager")
    model.set_attn_implementation(register_varlen_attention())
    return model


def _grouped(path):
    model = load_hf_model(str(path))
    model.set_attn_implementation(register_varlen_attention())
    return model


def actor_cfg(**kw):
    cfg = dict(ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=2, ppo_epochs=1, clip_ratio=0.2,
               loss_agg_mode="token-mean", entropy_coeff=0.0, use_kl_loss=False, grad_clip=1e9,
               use_dynamic_bsz=False)
    cfg.update(kw)
    return cfg


def _logprobs_and_grads(model, data, packed):
    model.zero_grad(set_to_none=True)
    b = data.batch
    responses = b["responses"]
    out = forward_response_logits(model, b["input_ids"], b["attention_mask"], b["position_ids"], responses.shape[1],
                                  packed, row_fn=lambda rows, flat: logprobs_from_logits(
                                      rows.float(), responses.reshape(-1)[flat])[:, None])[..., 0]
    (out * b["response_mask"]).sum().backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("packed", [False, True])
def test_grouped_gemm_experts_equal_the_eager_loop(moe_dir, packed):
    grouped, eager = _grouped(moe_dir), _eager(moe_dir)
    assert grouped.config._experts_implementation == "grouped_mm"
    assert eager.config._experts_implementation == "eager"
    data = make_ppo_batch(batch=4, prompt_len=7, resp_len=6, seed=3)
    mask = data.batch["response_mask"].bool()
    lp_g, grads_g = _logprobs_and_grads(grouped, data, packed)
    lp_e, grads_e = _logprobs_and_grads(eager, data, packed)
    torch.testing.assert_close(lp_g[mask], lp_e[mask], atol=2e-5, rtol=0)
    assert grads_g.keys() == grads_e.keys()
    experts = [n for n in grads_g if "experts" in n]
    assert experts and all(grads_g[n].abs().sum() > 0 for n in experts)
    for name, grad in grads_e.items():
        torch.testing.assert_close(grads_g[name], grad, atol=1e-5, rtol=1e-4, msg=name)


def _router_logits(model, data):
    """transformers' own router logits and load-balancing loss of the padded batch."""
    b = data.batch
    with torch.no_grad():
        out = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"],
                    output_router_logits=True)
    return out.router_logits, out.aux_loss


@pytest.mark.parametrize("packed", [False, True])
def test_router_losses_equal_transformers_and_their_gradients_reach_the_routers(moe_dir, packed):
    base = _grouped(moe_dir)
    data = make_ppo_batch(batch=4, prompt_len=7, resp_len=6, seed=4)
    data.batch["advantages"].zero_()    # no policy gradient: what moves is the router losses'
    logits, hf_aux = _router_logits(base, data)
    valid = data.batch["attention_mask"].reshape(-1).bool()
    z = torch.stack([torch.logsumexp(x, -1).square()[valid].mean() for x in logits]).mean()

    def step(**coefs):
        model = copy.deepcopy(base)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        actor = DataParallelPPOActor(actor_cfg(ppo_micro_batch_size_per_gpu=4, **coefs), model,
                                     torch.optim.SGD(model.parameters(), lr=1.0), use_remove_padding=packed)
        metrics = actor.update_policy(data)
        return {n: (before[n] - p.detach()).abs().sum() for n, p in model.named_parameters()}, metrics

    moved, metrics = step()
    assert all(v == 0 for v in moved.values()) and "actor/router_aux_loss" not in metrics
    routers = [n for n in moved if n.endswith("mlp.gate.weight")]
    assert len(routers) == 2
    moved, metrics = step(router_aux_loss_coef=0.1)
    torch.testing.assert_close(metrics["actor/router_aux_loss"], float(hf_aux), atol=1e-5, rtol=0)
    assert all(moved[n] > 0 for n in routers)
    last_experts = [n for n in moved if ".layers.2." in n or (".layers.1." in n and "mixtral" in base.config.model_type)]
    assert all(moved[n] == 0 for n in last_experts if "experts" in n)  # nothing after the last router moves
    moved, metrics = step(router_z_loss_coef=0.01)
    torch.testing.assert_close(metrics["actor/router_z_loss"], float(z), atol=1e-5, rtol=1e-5)
    assert all(moved[n] > 0 for n in routers) and "actor/router_aux_loss" not in metrics


def test_router_settings_and_a_dense_model_are_refused():
    assert router_settings({}) == (False, 0.0, 0.0)
    assert router_settings({"router_replay": {"mode": "R3"}, "router_z_loss_coef": 1e-3}) == (True, 0.0, 1e-3)
    with pytest.raises(ValueError, match=r"router_replay.mode='R2' must be one of"):
        router_settings({"router_replay": {"mode": "R2"}})
    with pytest.raises(ValueError, match=r"router_aux_loss_coef=-1.0 must be >= 0"):
        router_settings({"router_aux_loss_coef": -1})
    from _training_tiny import tiny_qwen2_config

    dense = transformers.AutoModelForCausalLM.from_config(tiny_qwen2_config())
    with pytest.raises(ValueError, match="has no MoE routers"):
        RouterTaps(dense, replay=True)
