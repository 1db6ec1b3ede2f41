"""MoE models in the actor (fp32, CPU): grouped-GEMM experts against HF's eager loop over experts (log-probs and
gradients, padded and packed forwards), the router's load-balancing and z-losses against transformers' own
numbers and their gradients reaching the routers, routing replay of given experts, FSDP over 2 gloo ranks equal to
one rank."""

import copy

import pytest
import torch
import transformers
from _training_tiny import make_ppo_batch, make_tiny_moe_dir
from typed_sections import FP32_MASTERS, actor_section, model_source, optim_section

from hybridrl.algorithms import logprobs_from_logits
from hybridrl.training import DataParallelPPOActor
from hybridrl.training.fsdp import load_hf_model
from hybridrl.training.micro_batches import UpdateBatches
from hybridrl.training.moe import RouterTaps, router_settings
from hybridrl.training.packed_attention import register_varlen_attention
from hybridrl.training.response_forward import forward_response_logits

KINDS = ["qwen3_moe", "mixtral"]


@pytest.fixture(scope="module", params=KINDS)
def moe_dir(request, tmp_path_factory):
    return make_tiny_moe_dir(tmp_path_factory.mktemp(request.param), request.param)


def _eager(path):
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                              experts_implementation="eager")
    model.set_attn_implementation(register_varlen_attention())
    return model


def _grouped(path, experts=None):
    """The actor's model (hybridrl's grouped-GEMM experts), or with transformers' experts implementation `experts`."""
    if experts is None:
        model = load_hf_model(str(path))
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                                  experts_implementation=experts)
    model.set_attn_implementation(register_varlen_attention())
    return model


def actor_cfg(**kw):
    return actor_section(**{**dict(ppo_epochs=1, clip_ratio=0.2, loss_agg_mode="token-mean", entropy_coeff=0.0,
                                   use_kl_loss=False, grad_clip=1e9), **kw})


BATCHES = UpdateBatches(mini_batch_rows=4, micro_rows=2, max_tokens=None)


def _logprobs_and_grads(model, data, packed):
    model.zero_grad(set_to_none=True)
    b = data.batch
    responses = b["responses"]
    out = forward_response_logits(model, b["input_ids"], b["attention_mask"], b["position_ids"], responses.shape[1],
                                  packed, row_fn=lambda rows, flat: logprobs_from_logits(
                                      rows.float(), responses.reshape(-1)[flat])[:, None])[..., 0]
    (out * b["response_mask"]).sum().backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("experts", [None, "grouped_mm"])
@pytest.mark.parametrize("packed", [False, True])
def test_grouped_gemm_experts_equal_the_eager_loop(moe_dir, packed, experts):
    grouped, eager = _grouped(moe_dir, experts), _eager(moe_dir)
    assert grouped.config._experts_implementation == (experts or "hybridrl_grouped_mm")
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
        actor = DataParallelPPOActor(actor_cfg(**coefs), model, torch.optim.SGD(model.parameters(), lr=1.0),
                                     batches=UpdateBatches(4, 4, None), use_remove_padding=packed)
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
    assert router_settings(actor_section()) == (False, 0.0, 0.0)
    assert router_settings(actor_section(router_replay={"mode": "R3"}, router_z_loss_coef=1e-3)) == (True, 0.0, 1e-3)
    with pytest.raises(ValueError, match=r"router_replay.mode='R2' must be one of"):
        router_settings(actor_section(router_replay={"mode": "R2"}))
    with pytest.raises(ValueError, match=r"router_aux_loss_coef=-1.0 must be >= 0"):
        router_settings(actor_section(router_aux_loss_coef=-1))
    from _training_tiny import tiny_qwen2_config

    dense = transformers.AutoModelForCausalLM.from_config(tiny_qwen2_config())
    with pytest.raises(ValueError, match="has no MoE routers"):
        RouterTaps(dense, replay=True)


# ---------------------------------------------------------------------- FSDP over 2 gloo ranks == one rank
def _fsdp_step(rank, world, model_dir, out_file):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from hybridrl.training import build_fsdp_model, build_optimizer, build_training_mesh

    mesh = build_training_mesh(world, -1, "cpu")
    model = build_fsdp_model(model_source(model_dir), FP32_MASTERS, mesh, torch.device("cpu"),
                             use_varlen_attention=True, gradient_checkpointing=True)
    optim = optim_section(lr=1e-2, weight_decay=0.0, lr_warmup_steps=0, warmup_style="constant",
                          total_training_steps=1)
    actor = DataParallelPPOActor(actor_cfg(router_aux_loss_coef=0.1, router_z_loss_coef=0.01,
                                           router_replay={"mode": "R3"}),
                                 model, build_optimizer(model.parameters(), optim), batches=BATCHES,
                                 use_remove_padding=True)
    data = _replay_batch(model.config)   # every rank the same rows: the mean gradient is one rank's
    metrics = actor.update_policy(data)
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        torch.save({"state": state, "metrics": metrics}, out_file)


def _replay_batch(config):
    """A PPO batch with given experts to replay: k distinct random experts per token and MoE layer, none recorded
    for the padding."""
    data = make_ppo_batch(batch=4, prompt_len=7, resp_len=6, seed=5)
    E = getattr(config, "num_experts", None) or config.num_local_experts
    layers = sum(1 for i in range(config.num_hidden_layers) if i not in (getattr(config, "mlp_only_layers", None) or []))
    B, S = data.batch["input_ids"].shape
    g = torch.Generator().manual_seed(1)
    routed = torch.rand(B, S, layers, E, generator=g).topk(config.num_experts_per_tok, -1).indices.to(torch.uint8)
    routed[~data.batch["attention_mask"].bool()] = 255
    data.batch["routed_experts"] = routed
    return data


def test_fsdp_on_two_ranks_equals_one_rank(moe_dir, tmp_path):
    from _training_tiny import run_ranks

    for world in (1, 2):
        run_ranks(_fsdp_step, world, moe_dir, tmp_path / f"world{world}.pt")
    one, two = torch.load(tmp_path / "world1.pt"), torch.load(tmp_path / "world2.pt")
    assert one["metrics"]["actor/routing_mismatch_frac"] > 0.5   # the random experts are not the model's own
    for key in ("actor/pg_loss", "actor/router_aux_loss", "actor/router_z_loss", "actor/routing_mismatch_frac"):
        assert two["metrics"][key] == pytest.approx(one["metrics"][key], rel=1e-5, abs=1e-7), key
    start = _grouped(moe_dir).state_dict()
    moved = [n for n in one["state"] if not torch.equal(one["state"][n], start[n])]
    assert any(n.endswith("mlp.gate.weight") for n in moved) and any("experts" in n for n in moved)
    for name, value in one["state"].items():
        torch.testing.assert_close(two["state"][name], value, atol=1e-6, rtol=1e-5, msg=name)
