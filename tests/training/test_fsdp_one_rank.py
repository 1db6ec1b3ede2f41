"""FSDP2 over one rank (one gloo process, CPU): gradients are reduced in the master weights' dtype whatever
reduce_dtype says, since nothing is reduced there; so bf16 masters defer their reduction to a mini-batch's last
backward, and the gradients that gives are bitwise those of reducing in every backward and of plain PyTorch
accumulating bf16 gradients without FSDP."""

import copy

import pytest
import torch
import torch.distributed as dist
import transformers
from _training_tiny import tiny_qwen2_config

from hybridrl.training.fsdp import apply_fsdp, build_training_mesh, grads_unsplit
from hybridrl.training.fused_logprob import fused_logprob_entropy
from hybridrl.training.response_forward import forward_response_logits


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        yield build_training_mesh(1, -1, "cpu")
    finally:
        dist.destroy_process_group()


def _grads(model, micro_batches, defer: bool):
    model.zero_grad(set_to_none=True)
    for i, ids in enumerate(micro_batches):
        if defer:
            model.set_requires_gradient_sync(i == len(micro_batches) - 1)
        model(input_ids=ids).logits.float().square().mean().backward()
    return {n: (p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad).clone()
            for n, p in model.named_parameters()}


def test_one_rank_reduces_in_the_master_dtype_and_bf16_masters_defer_exactly(one_rank):
    torch.manual_seed(0)
    plain = transformers.AutoModelForCausalLM.from_config(tiny_qwen2_config(), dtype=torch.bfloat16)
    deferred, every = copy.deepcopy(plain), copy.deepcopy(plain)
    for model in (deferred, every):
        apply_fsdp(model, one_rank, torch.bfloat16, torch.float32)
        assert model.fsdp_mixed_precision.reduce_dtype == torch.bfloat16
    assert grads_unsplit(deferred)
    micro_batches = [torch.randint(0, plain.config.vocab_size, (2, 12)) for _ in range(3)]
    expected = _grads(plain, micro_batches, defer=False)
    got_deferred, got_every = _grads(deferred, micro_batches, True), _grads(every, micro_batches, False)
    assert expected.keys() == got_deferred.keys() == got_every.keys()
    for name, grad in expected.items():
        assert grad.dtype == torch.bfloat16 and grad.abs().sum() > 0, name
        assert torch.equal(got_deferred[name], grad), name
        assert torch.equal(got_every[name], grad), name


@pytest.mark.parametrize("master, reduce, expected", [
    (torch.float32, torch.bfloat16, torch.float32),   # fp32 masters add fp32 gradients at one rank
    (torch.float32, torch.float32, torch.float32),
    (torch.bfloat16, torch.float32, torch.bfloat16),
])
def test_one_rank_reduce_dtype_is_the_trained_parameters_dtype(one_rank, master, reduce, expected):
    model = transformers.AutoModelForCausalLM.from_config(tiny_qwen2_config(), dtype=master)
    apply_fsdp(model, one_rank, torch.bfloat16, reduce)
    assert model.fsdp_mixed_precision.reduce_dtype == expected
    assert grads_unsplit(model)


def test_one_rank_lora_keeps_its_adapters_dtype(one_rank):
    # fp32 adapters on a frozen bf16 base: only the trained parameters decide
    model = transformers.AutoModelForCausalLM.from_config(tiny_qwen2_config(), dtype=torch.bfloat16)
    model.requires_grad_(False)
    for p in model.model.layers[-1].mlp.parameters():
        p.data, p.requires_grad = p.data.float(), True
    apply_fsdp(model, one_rank, torch.bfloat16, torch.bfloat16)
    assert model.fsdp_mixed_precision.reduce_dtype == torch.float32


@pytest.mark.parametrize("packed", [False, True])
def test_fused_head_output_is_no_view_for_fsdp_to_warn_about(one_rank, packed):
    """The fused head replaces the root module's logits: were they a view, FSDP2 would warn on every forward
    that an in-place op would drop its pre-backward hook. The rows come back unviewed, and train the head."""
    import warnings

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(tiny_qwen2_config())
    apply_fsdp(model, one_rank, torch.float32, torch.float32)
    ids = torch.randint(0, 300, (2, 10))
    positions = torch.arange(10).expand(2, 10)
    targets = ids[:, -4:].reshape(-1)

    def head_rows(hidden, weight, flat):
        return fused_logprob_entropy(hidden, weight, targets[flat], 1.0, True, False)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = forward_response_logits(model, ids, torch.ones_like(ids), positions, 4, packed, head_rows=head_rows)
        out[..., 0].sum().backward()
    assert out.shape == (2, 4, 2)
    assert not [w for w in caught if "view tensor" in str(w.message)]
    assert model.lm_head.weight.grad.to_local().abs().sum() > 0
