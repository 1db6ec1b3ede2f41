"""Test helpers: a tiny random Qwen2 model directory (with a byte-level BPE tokenizer and a chat template),
a PPO-shaped DataProto built from it, and a 2-rank gloo runner (spawn, free port found at run time)."""

from __future__ import annotations

import os
import socket
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from gloo_ranks import end_process_group
from typed_sections import actor_section

from hybridrl.protocol import DataProto
from hybridrl.training.micro_batches import UpdateBatches

# the PPO actor settings the 2-rank tests train with (plain PPO clip) and their update's per-rank sizes (a 4-row
# mini-batch in micro-batches of 2)
TINY_ACTOR_CFG = actor_section(ppo_epochs=1, clip_ratio=0.2, grad_clip=1.0, loss_agg_mode="token-mean",
                               entropy_coeff=0.0, use_kl_loss=False)
TINY_BATCHES = UpdateBatches(mini_batch_rows=4, micro_rows=2, max_tokens=None)

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def tiny_qwen2_config(vocab_size: int = 300):
    import transformers

    return transformers.Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, vocab_size=vocab_size,
                                    max_position_embeddings=256, tie_word_embeddings=False)


def tiny_moe_config(kind: str, vocab_size: int = 300):
    """Tiny Qwen3-MoE (3 layers: MoE, dense, MoE; 8 experts, top 2, renormalised) or Mixtral (2 MoE layers, 4
    experts, top 2)."""
    import transformers

    common = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, vocab_size=vocab_size,
                  max_position_embeddings=256, tie_word_embeddings=False, num_experts_per_tok=2)
    if kind == "qwen3_moe":
        return transformers.Qwen3MoeConfig(**common, num_hidden_layers=3, intermediate_size=128, head_dim=16,
                                           num_experts=8, moe_intermediate_size=32, norm_topk_prob=True,
                                           mlp_only_layers=[1])
    if kind == "mixtral":
        return transformers.MixtralConfig(**common, num_hidden_layers=2, intermediate_size=48, num_local_experts=4)
    raise KeyError(kind)


def make_tiny_moe_dir(path: Path, kind: str, seed: int = 0) -> Path:
    """Random-weight tiny MoE model saved as a HF directory (fp32; larger router weights, so tokens spread over
    the experts)."""
    import transformers

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(tiny_moe_config(kind), dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.normal_(0, 0.5)
    model.save_pretrained(path)
    return Path(path)


def make_tiny_model_dir(path: Path, seed: int = 0, with_tokenizer: bool = True) -> Path:
    """Random-weight tiny Qwen2 saved as a HF directory (fp32); tokenizer trained on a few sentences."""
    import transformers

    path = Path(path)
    vocab = 300
    if with_tokenizer:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=special,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(["what is 1 + 2 ? the answer is 3", "user assistant system 0123456789"] * 20,
                                trainer)
        fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                                    pad_token="<|endoftext|>")
        fast.chat_template = CHAT_TEMPLATE
        fast.save_pretrained(path)
        vocab = max(vocab, len(fast))
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(tiny_qwen2_config(vocab), dtype=torch.float32)
    model.save_pretrained(path)
    return path


def make_ppo_batch(batch: int = 4, prompt_len: int = 6, resp_len: int = 5, vocab: int = 300, seed: int = 0,
                   temperature: float = 1.0) -> DataProto:
    """Left-padded prompts + right-padded responses of varying lengths, with old log-probs and advantages."""
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(3, vocab, (batch, prompt_len), generator=g)
    responses = torch.randint(3, vocab, (batch, resp_len), generator=g)
    pmask = torch.ones(batch, prompt_len, dtype=torch.long)
    rmask = torch.ones(batch, resp_len, dtype=torch.long)
    for i in range(batch):
        pmask[i, : i % prompt_len] = 0
        rmask[i, resp_len - (i % resp_len):] = 0
    prompts[pmask == 0] = 0
    responses[rmask == 0] = 0
    attn = torch.cat([pmask, rmask], 1)
    tensors = {"prompts": prompts, "responses": responses, "input_ids": torch.cat([prompts, responses], 1),
               "attention_mask": attn, "position_ids": (attn.cumsum(1) - 1).clamp(min=0),
               "response_mask": rmask.float(),
               "old_log_probs": -5.5 + 0.1 * torch.randn(batch, resp_len, generator=g),
               "ref_log_prob": -5.5 + 0.1 * torch.randn(batch, resp_len, generator=g),
               "advantages": torch.randn(batch, resp_len, generator=g),
               "values": 0.1 * torch.randn(batch, resp_len, generator=g),
               "returns": torch.randn(batch, resp_len, generator=g)}
    return DataProto.from_dict(tensors, meta_info={"temperature": temperature})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world, port, fn, args, errq):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        fn(rank, world, *args)
        # every rank done before any tears the group down (a rank aborted once in CI with "terminate called without
        # an active exception" while its peer was still saving); monitored: a failed peer raises here, not hangs
        dist.monitored_barrier(timeout=timedelta(seconds=120))
    except BaseException:
        errq.put((rank, traceback.format_exc()))
        raise
    finally:
        end_process_group()


def run_ranks(fn, world: int = 2, *args) -> None:
    """Run fn(rank, world, *args) on `world` gloo ranks; re-raise the first failure with its traceback."""
    ctx = mp.get_context("spawn")
    errq = ctx.SimpleQueue()
    mp.start_processes(_entry, args=(world, free_port(), fn, args, errq), nprocs=world, join=True,
                       start_method="spawn")
    if not errq.empty():
        rank, tb = errq.get()
        raise AssertionError(f"rank {rank} failed:\n{tb}")
