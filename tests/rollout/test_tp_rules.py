"""TP degrees the rollout decoder accepts for a model's head counts, refused with the reason at config check and
in the engine. Shapes of SmolLM2-135M (9 heads, 3 KV heads, intermediate 1536): TP 1 and 3 only."""

import pytest
import torch
import transformers

from hybridrl.config import ConfigError, load_config
from hybridrl.models.decoder import check_supported
from hybridrl.models.tp_rules import allowed_tp_sizes

R = "actor_rollout_ref.rollout"


def smollm2_shaped_config(**overrides):
    shape = dict(hidden_size=576, num_attention_heads=9, num_key_value_heads=3, intermediate_size=1536,
                 num_hidden_layers=1, vocab_size=64, tie_word_embeddings=True)
    return transformers.LlamaConfig(**{**shape, **overrides})


def decoder_splits(config, monkeypatch) -> list[int]:
    """Reference: the TP degrees for which every rank's attention and MLP build and hold whole heads (together the
    ranks hold all query heads; each holds 1/tp of the KV heads, or one replicated KV head)."""
    from hybridrl.models import tp_layers
    from hybridrl.models.decoder import MLP, Attention

    nh, nkv = config.num_attention_heads, config.num_key_value_heads
    ok = []
    for tp in range(1, nh + 1):
        try:
            for rank in range(tp):
                monkeypatch.setattr(tp_layers, "tp_rank_size", lambda group, rank=rank, tp=tp: (rank, tp))
                with torch.device("meta"):
                    attn, _ = Attention(config, 0, object()), MLP(config, object())
                if attn.num_heads * tp != nh or attn.num_kv_heads != max(nkv // tp, 1):
                    raise ValueError("partial heads")
        except ValueError:
            continue
        ok.append(tp)
    return ok


@pytest.mark.parametrize("heads,kv_heads,inter", [(9, 3, 1536), (14, 2, 4864), (32, 8, 14336), (6, 2, 1024)])
def test_allowed_tp_sizes_are_the_splits_the_decoder_makes(heads, kv_heads, inter, monkeypatch):
    config = smollm2_shaped_config(hidden_size=64 * heads, num_attention_heads=heads, num_key_value_heads=kv_heads,
                                   intermediate_size=inter)
    assert allowed_tp_sizes(config) == decoder_splits(config, monkeypatch)
    assert allowed_tp_sizes(config.to_dict()) == allowed_tp_sizes(config)  # the config.json form too


def test_smollm2_shapes_allow_tp_1_and_3_and_the_decoder_refuses_2_with_the_reason():
    config = smollm2_shaped_config()
    assert allowed_tp_sizes(config) == [1, 3]
    for tp in (1, 3):
        check_supported(config, tp)
    for tp in (2, 9):
        with pytest.raises(ValueError, match=rf"tensor_model_parallel_size' = {tp} does not fit.*9 attention heads, "
                                             r"3 KV heads.*allowed: \[1, 3\]"):
            check_supported(config, tp)


def test_config_check_refuses_a_tp_degree_the_model_heads_do_not_allow(tmp_path):
    smollm2_shaped_config().save_pretrained(tmp_path)
    base = [f"actor_rollout_ref.model.path={tmp_path}", "trainer.n_gpus_per_node=6", "data.train_batch_size=12",
            "actor_rollout_ref.actor.ppo_mini_batch_size=6"]
    with pytest.raises(ConfigError, match=r"tensor_model_parallel_size' = 2 does not fit.*allowed: \[1, 3\]"):
        load_config(None, base + [f"{R}.tensor_model_parallel_size=2"])
    load_config(None, base + [f"{R}.tensor_model_parallel_size=3"])
    with pytest.raises(ConfigError, match="hf generates with the whole model on each rank"):   # the worker refuses it
        load_config(None, base + [f"{R}.tensor_model_parallel_size=2", f"{R}.name=hf"])


def test_engine_on_a_tp_group_of_2_refuses_the_model_before_allocating(monkeypatch):
    from hybridrl.models import decoder

    monkeypatch.setattr(decoder, "tp_rank_size", lambda group: (0, 2))  # a 2-rank TP group, without processes
    from hybridrl.rollout.config import EngineConfig
    from hybridrl.rollout.engine import LLMEngine

    with pytest.raises(ValueError, match=r"= 2 does not fit.*allowed: \[1, 3\]"):
        LLMEngine(smollm2_shaped_config(), EngineConfig(dtype=torch.float32, num_kv_blocks=4, max_model_len=32,
                                                        max_num_batched_tokens=32), tp_group=object(), device="cpu")
