"""Recompute of all decoder layers but the last k (training/fsdp.set_recompute): those k run their forward once,
the others twice, and the gradients are those of the model without recompute."""

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from hybridrl.training.fsdp import decoder_blocks, recompute_on, recomputed_layers, set_recompute


def _model():
    cfg = AutoConfig.for_model("qwen2", hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                               num_attention_heads=4, num_key_value_heads=2, vocab_size=64)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).train()


def _grads_and_forwards(model, ids):
    calls = [0] * len(decoder_blocks(model))
    hooks = [b.self_attn.register_forward_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
             for i, b in enumerate(decoder_blocks(model))]
    model(ids).logits.square().mean().backward()
    for h in hooks:
        h.remove()
    return {n: p.grad for n, p in model.named_parameters()}, calls


@pytest.mark.parametrize("kept", [0, 1, 2])
def test_the_last_kept_layers_run_once_and_gradients_are_unchanged(kept):
    ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(1))
    plain = _model()
    ref, ref_calls = _grads_and_forwards(plain, ids)
    model = _model()
    set_recompute(model, True, kept)
    assert recompute_on(model) and recomputed_layers(model) == 3 - kept
    grads, calls = _grads_and_forwards(model, ids)
    assert ref_calls == [1, 1, 1] and calls == [2] * (3 - kept) + [1] * kept
    for n in ref:
        torch.testing.assert_close(grads[n], ref[n], rtol=1e-5, atol=1e-6, msg=n)
    set_recompute(model, False)
    assert recomputed_layers(model) == 0 and not recompute_on(model)


@pytest.mark.parametrize("kept", [-1, 3])
def test_kept_layers_must_leave_a_recomputed_layer(kept):
    with pytest.raises(ValueError, match=f"kept_layers={kept} of 3"):
        set_recompute(_model(), True, kept)
