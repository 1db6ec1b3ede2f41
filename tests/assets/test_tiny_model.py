import argparse
import json

import pytest
import torch
from tokenizers import Tokenizer
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from hybridrl.assets import tiny_model
from hybridrl.assets.cli import register
from hybridrl.assets.tiny_model import SIZE_PRESETS, build_tiny_model, make_config, write_size_preset

TEXTS = ["Compute 37 + 12 * 5. Show the intermediate steps", "Natalia sold 48/2 = <<48/2=24>>24 clips.\n#### 72",
         "<answer>(1 + 2) / 3</answer>", "héllo wörld 日本語 🙂  tabs\tand\n\nnewlines  ", ""]


def test_tiny_model_loads_offline_and_tokenizer_round_trips(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    raw = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text
        assert raw.encode(text).ids == ids  # AutoTokenizer's rebuilt Qwen2Tokenizer agrees with the file
        assert max(ids, default=0) < model.config.vocab_size
    assert 256 < len(tok) <= 1024
    assert tok.pad_token == "<|pad|>" and tok.eos_token == "<|im_end|>" and tok.pad_token_id != tok.eos_token_id
    prompt = tok.apply_chat_template([{"role": "user", "content": "Compute 1 + 2."}], add_generation_prompt=True,
                                     tokenize=False)
    assert prompt == "<|im_start|>user\nCompute 1 + 2.<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.encode(prompt, add_special_tokens=False)
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>")
    out = model(input_ids=torch.tensor([ids]))
    assert out.logits.shape == (1, len(ids), model.config.vocab_size)
    gen = json.loads((tiny_model_dir / "generation_config.json").read_text())
    assert tok.convert_tokens_to_ids("<|im_end|>") in gen["eos_token_id"]


@pytest.mark.parametrize("arch,model_type", [("llama", "llama"), ("mistral", "mistral"), ("qwen3", "qwen3")])
def test_other_archs(tmp_path, arch, model_type):
    path = build_tiny_model(tmp_path, arch=arch, layers=1, hidden=32, heads=4, kv_heads=2)
    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    assert model.config.model_type == model_type and model.config.num_hidden_layers == 1
    assert tok.decode(tok.encode(TEXTS[1], add_special_tokens=False)) == TEXTS[1]


def test_deterministic_by_seed(tmp_path):
    a, b, c = (build_tiny_model(tmp_path / name, layers=1, hidden=32, seed=seed)
               for name, seed in (("a", 0), ("b", 0), ("c", 1)))
    for f in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (a / f).read_bytes() == (b / f).read_bytes()
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()


@pytest.mark.parametrize("size", sorted(SIZE_PRESETS))
def test_size_preset_config_only(tmp_path, size):
    path = write_size_preset(tmp_path, size, weights=False)
    cfg, spec = AutoConfig.from_pretrained(path), SIZE_PRESETS[size]
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads,
            cfg.intermediate_size, cfg.vocab_size, cfg.tie_word_embeddings) == (
        spec["hidden"], spec["layers"], spec["heads"], spec["kv_heads"], spec["intermediate"], spec["vocab_size"],
        spec["tie"])
    assert cfg.rope_parameters["rope_theta"] == spec["rope_theta"]
    assert not list(path.glob("*.safetensors"))
    tok = AutoTokenizer.from_pretrained(path)
    assert len(tok) < cfg.vocab_size


def test_random_weights_are_sharded_bf16_and_loadable(tmp_path, monkeypatch):
    monkeypatch.setattr(tiny_model, "SHARD_BYTES", 20_000)
    cfg = make_config("qwen2", hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64, vocab_size=512,
                      tie=False, dtype="bfloat16")
    cfg.save_pretrained(tmp_path)
    tiny_model._write_random_weights(cfg, tmp_path, seed=0)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    model = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert set(index["weight_map"]) == {n for n, _ in model.named_parameters()}
    assert torch.equal(model.model.norm.weight, torch.ones(32, dtype=torch.bfloat16))
    assert model.lm_head.weight.float().std().item() == pytest.approx(0.02, rel=0.1)


def test_errors_name_the_value(tmp_path):
    with pytest.raises(ValueError, match="arch='gpt9'"):
        build_tiny_model(tmp_path, arch="gpt9")
    with pytest.raises(ValueError, match="size='tiny-70b'"):
        write_size_preset(tmp_path, "tiny-70b")
    with pytest.raises(ValueError, match="divisible"):
        build_tiny_model(tmp_path, hidden=30, heads=4)


def test_cli_builds_model(tmp_path):
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["assets", "tiny-model", str(tmp_path), "--arch", "llama", "--layers", "1",
                              "--hidden", "32", "--seed", "3"])
    args.func(args)
    cfg = AutoConfig.from_pretrained(tmp_path)
    assert cfg.model_type == "llama" and cfg.num_hidden_layers == 1 and cfg.hidden_size == 32


TINY_MOE = dict(arch="qwen3_moe", hidden=32, layers=2, heads=4, kv_heads=2, head_dim=16, intermediate=64, experts=4,
                experts_per_token=2, expert_intermediate=24, norm_topk_prob=True, vocab_size=512, rope_theta=1e6,
                tie=False, rms_norm_eps=1e-6, max_position=256)


def test_moe_config_loads_in_transformers():
    from hybridrl.models.moe_config import moe_config

    spec = dict(TINY_MOE)
    cfg = make_config(spec.pop("arch"), **spec)
    model = AutoModelForCausalLM.from_config(cfg)
    assert model.config.model_type == "qwen3_moe"
    assert model.model.layers[0].self_attn.q_proj.weight.shape == (4 * 16, 32)  # head_dim, not hidden // heads
    assert model.model.layers[0].mlp.experts.down_proj.shape == (4, 32, 24)
    out = model(input_ids=torch.tensor([[1, 2, 3]]))
    assert out.logits.shape == (1, 3, 512)
    moe = moe_config(cfg.to_dict())  # what the engine reads from config.json
    assert (moe.num_experts, moe.top_k, moe.intermediate, moe.norm_topk_prob, moe.sparse_layers) == (
        4, 2, 24, True, (True, True))


def test_moe_keywords_refused_for_dense_archs():
    dense = dict(hidden=32, layers=1, heads=4, kv_heads=2, intermediate=64, vocab_size=512)
    with pytest.raises(ValueError, match="arch='qwen2' is dense: experts, experts_per_token"):
        make_config("qwen2", **dense, experts=4, experts_per_token=2)
    with pytest.raises(ValueError, match="norm_topk_prob"):
        make_config("llama", **dense, norm_topk_prob=True)
    with pytest.raises(ValueError, match="experts and experts_per_token are required"):
        make_config("qwen3_moe", **dense)
    with pytest.raises(ValueError, match="experts_per_token=5"):
        make_config("qwen3_moe", **dense, experts=4, experts_per_token=5)
    with pytest.raises(ValueError, match="build_tiny_model builds one of"):
        build_tiny_model("/nonexistent", arch="qwen3_moe")


def _shrink_to_tiny_moe(monkeypatch, shard_bytes):
    monkeypatch.setitem(tiny_model.SIZE_PRESETS, "tiny-moe", dict(TINY_MOE))
    monkeypatch.setattr(tiny_model, "SHARD_BYTES", shard_bytes)


def test_moe_size_preset_writes_loadable_shards(tmp_path, monkeypatch):
    _shrink_to_tiny_moe(monkeypatch, 8_000)
    path = write_size_preset(tmp_path, "tiny-moe")
    index = json.loads((path / "model.safetensors.index.json").read_text())
    files = set(index["weight_map"].values())
    assert len(files) > 2 and files == {f.name for f in path.glob("*.safetensors")}
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    params = dict(model.named_parameters())
    assert set(index["weight_map"]) == set(params)
    assert index["metadata"]["total_size"] == sum(p.numel() * 2 for p in params.values())
    assert model.config.model_type == "qwen3_moe" and model.config.num_experts == 4
    norms = [n for n in params if n.endswith("norm.weight")]
    assert len(norms) == 2 * 4 + 1  # per layer: input, post-attention, q, k; and the final norm
    for n in norms:
        assert torch.equal(params[n], torch.ones_like(params[n])), n
    experts = model.model.layers[1].mlp.experts.gate_up_proj
    assert experts.float().std().item() == pytest.approx(0.02, rel=0.1) and experts.float().abs().sum() > 0


def test_shards_are_written_as_they_fill(tmp_path, monkeypatch):
    """Each shard is saved before the next shard's tensors are generated (the old writer generated every tensor
    first): at every save, the tensors made so far are exactly those saved so far, this shard's included."""
    _shrink_to_tiny_moe(monkeypatch, 8_000)
    made, saved, at_save = [0], [0], []
    random_tensor, save = tiny_model._random_tensor, tiny_model.save_file

    def counting_random_tensor(*args, **kwargs):
        made[0] += 1
        return random_tensor(*args, **kwargs)

    def recording_save(tensors, filename, **kwargs):
        saved[0] += len(tensors)
        at_save.append((made[0], saved[0], sum(t.numel() * 2 for t in tensors.values())))
        save(tensors, filename, **kwargs)

    monkeypatch.setattr(tiny_model, "_random_tensor", counting_random_tensor)
    monkeypatch.setattr(tiny_model, "save_file", recording_save)
    write_size_preset(tmp_path, "tiny-moe")
    assert len(at_save) > 2
    assert all(m == s for m, s, _ in at_save), at_save
    largest = max(2 * torch.Size(p.shape).numel() for p in AutoModelForCausalLM.from_pretrained(tmp_path).parameters())
    assert all(nbytes <= max(8_000, largest) for _, _, nbytes in at_save)


def test_real_moe_presets_parameter_counts():
    """On the meta device only: the 30B preset is never materialised."""
    counts = {}
    for size in ("qwen3-30b-a3b", "qwen3-moe-7b-a1b"):
        spec = dict(SIZE_PRESETS[size])
        cfg = make_config(spec.pop("arch"), **spec, dtype="bfloat16")
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg)
        total = sum(p.numel() for p in model.parameters())
        expert = sum(p.numel() for n, p in model.named_parameters() if ".mlp.experts." in n)
        counts[size] = total, total - expert + expert * spec["experts_per_token"] // spec["experts"]
    total, active = counts["qwen3-30b-a3b"]
    assert total == pytest.approx(30.5e9, rel=0.01) and active == pytest.approx(3.3e9, rel=0.03)
    assert counts["qwen3-moe-7b-a1b"] == (7_335_385_088, 1_698_240_512)
