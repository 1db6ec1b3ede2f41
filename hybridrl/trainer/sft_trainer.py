"""SFT trainer: supervised fine-tuning on the verl-schema parquet, producing the HF model the RL run starts from.

Choices:
- Each example is rendered as chat_template(prompt, add_generation_prompt=True) + response + eos, tokenised
  with `add_special_tokens=False` (the template carries the special tokens). Loss only on response + eos.
- `data.multiturn.enable`: rows are conversations instead (verl's multi-turn SFT format: `messages` with
  assistant `tool_calls` and `tool` messages, optional `tools` schemas), laid out as a multi-turn rollout is
  (data/sft_conversation.py): the prompt up to the first assistant turn, then the rest as the response, with the
  loss only on the assistant's tokens and their eos (tool and user messages are attended, not trained).
- `model.custom_chat_template` replaces the tokenizer's chat template (as the RL key does) and is saved with the
  model.
- Batches use the RL layout (prompt left-padded, response right-padded), so the FSDP engine's
  `forward_response_logits` (packed varlen attention when `model.use_remove_padding`) computes logits only at
  the positions predicting response tokens; the loss is a token mean over the whole optimizer step on each rank,
  accumulated exactly over micro-batches (training/micro_batches.py), then averaged across ranks by FSDP.
- Over-long examples: `data.truncation` error (default) | left (drop the prompt's head) | right (drop the
  response's tail); counted in `data/truncated`. Rows left over after the last full `train_batch_size` of an
  epoch are skipped and counted in `data/dropped_rows`.
- Runs in-process (CPU or one GPU: a one-rank gloo/nccl group is made and torn down) or under torchrun
  (WORLD_SIZE > 1: the group is made from the environment). The final model is written with `save_hf_model`
  to `{trainer.default_local_dir}/huggingface` (config, safetensors, tokenizer; with LoRA the merged weights).
- verl's SFT keys: `data.prompt_dict_keys` / `response_dict_keys` reach into struct columns, `data.*_max_samples`
  take the first rows, `data.micro_batch_size` (global, deprecated) is divided over the ranks, `model.lora_rank`
  trains adapters only (optimizer state for them alone), `trainer.test_freq` adds val/loss every N steps,
  `trainer.save_freq` writes resumable checkpoints every N steps and at the last (trainer/sft_state.py; verl also
  saves at the last step when save_freq is -1, here the final HF model is that output) and `trainer.resume_mode`
  resumes from them: the data orders of the epochs before are drawn again, so a resumed run trains on the rows an
  uninterrupted one would. Loggers other than console get the step's metrics through the RL run's trackers, under
  `{trainer.default_local_dir}/logs`.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist

from hybridrl.algorithms import logprobs_from_logits
from hybridrl.config.loader import load_config
from hybridrl.config.sections import SFTConfig
from hybridrl.config.sections.optim import OptimConfig
from hybridrl.data.sft_conversation import normalize_messages, tokenize_conversation
from hybridrl.models.tokenizer import resolve_chat_template
from hybridrl.plan.actor_plan import resolve_liger
from hybridrl.plan.shape import sft_sequence_parallel, sft_training_mesh
from hybridrl.protocol import DataProto
from hybridrl.trainer.sft_state import data_order_facts, resume_sft, save_sft_checkpoint, sft_checkpoints
from hybridrl.training.checkpoint import save_hf_model
from hybridrl.training.fsdp import FSDPDtypes, ModelSource, build_fsdp_model, load_hf_config
from hybridrl.training.lora import lora_settings
from hybridrl.training.micro_batches import loss_scale, make_micro_batches
from hybridrl.training.optim import build_lr_scheduler, build_optimizer
from hybridrl.training.response_forward import forward_response_logits
from hybridrl.training.updater import clip_grad_norm

__all__ = ["collate", "load_sft_config", "main", "read_rows", "register", "run_sft", "tokenize_examples"]



def load_sft_config(config_file: str | Path | None = None, overrides: list[str] | None = None) -> SFTConfig:
    """sft_trainer.yaml <- `config_file` <- `overrides` (the PPO config's loader and override syntax), typed."""
    return load_config(config_file, list(overrides or ()), defaults="sft_trainer")



# ---------------------------------------------------------------------------------------------- data
def _field(row: dict, key: str, path: str, name: str):
    value = row
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            raise ValueError(f"{name}={key!r}: row of {path} has no {part!r} (columns: {sorted(row)})")
        value = value[part]
    return value


def _path(key: str, dict_keys) -> str:
    """verl's `prompt_key` + `prompt_dict_keys` as one dotted path into the row."""
    return ".".join([key, *(dict_keys or [])])


def read_rows(files, d, max_samples: int = -1) -> list[dict]:
    """Rows as {"messages", "response"} (single turn) or {"messages", "tools", "where"} (data.multiturn.enable); the
    first `max_samples` of the files in order (-1: all)."""
    import pyarrow.parquet as pq

    if max_samples == 0 or max_samples < -1:
        raise ValueError(f"data.train_max_samples / val_max_samples = {max_samples}: use -1 (all rows) or a positive "
                         "count")
    files = [files] if isinstance(files, str) else list(files)
    multiturn = d.multiturn.enable
    prompt_key, response_key = _path(d.prompt_key, d.prompt_dict_keys), _path(d.response_key, d.response_dict_keys)
    rows = []
    for f in files:
        path = os.path.expanduser(f)
        if not os.path.exists(path):
            raise FileNotFoundError(f"data file {path} (from data.train_files/val_files) does not exist")
        for i, row in enumerate(pq.read_table(path).to_pylist()):
            if multiturn:
                messages = _field(row, d.multiturn.messages_key, path, "data.multiturn.messages_key")
                tools = row.get(d.multiturn.tools_key)
                messages, tools = normalize_messages(messages, tools)
                rows.append({"messages": messages, "tools": tools, "where": f"{path} row {i}"})
                continue
            prompt = _field(row, prompt_key, path, "data.prompt_key")
            if isinstance(prompt, str):
                prompt = [{"role": "user", "content": prompt}]
            rows.append({"messages": list(prompt), "response": str(_field(row, response_key, path,
                                                                          "data.response_key"))})
    rows = rows if max_samples == -1 else rows[:max_samples]
    if not rows:
        raise ValueError(f"data files {files} hold no rows")
    return rows


def _encode(row: dict, tokenizer) -> tuple[list, list, list]:
    if "response" not in row:
        return tokenize_conversation(tokenizer, row["messages"], row["tools"], row["where"])
    text = tokenizer.apply_chat_template(row["messages"], add_generation_prompt=True, tokenize=False)
    p = tokenizer.encode(text, add_special_tokens=False)
    r = tokenizer.encode(row["response"], add_special_tokens=False) + [tokenizer.eos_token_id]
    return p, r, [1] * len(r)


def tokenize_examples(rows, tokenizer, max_length: int, truncation: str) -> tuple[list[tuple[list, list, list]], int]:
    """-> ([(prompt_ids, response_ids, loss_mask)], number truncated). Single-turn responses end in eos and are
    trained throughout; conversations train only their assistant tokens."""
    if truncation not in ("error", "left", "right"):
        raise ValueError(f"data.truncation={truncation!r}: use error, left or right")
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no eos_token; SFT appends eos to every response")
    out, truncated = [], 0
    for i, row in enumerate(rows):
        p, r, m = _encode(row, tokenizer)
        excess = len(p) + len(r) - max_length
        if excess > 0:
            if truncation == "error":
                raise ValueError(f"example {i} has {len(p) + len(r)} tokens > data.max_length={max_length}; "
                                 "raise max_length or set data.truncation=left|right")
            truncated += 1
            if truncation == "left":
                p = p[excess:]
            else:
                r, m = r[: len(r) - excess], m[: len(m) - excess]
            if not p or not any(m):
                raise ValueError(f"example {i}: data.max_length={max_length} leaves no prompt or no trained token")
        out.append((p, r, m))
    return out, truncated


def collate(examples, pad_id: int) -> DataProto:
    """RL layout: prompts left-padded to the longest prompt, responses right-padded to the longest response;
    `response_mask` is the examples' loss mask (attention covers every response token)."""
    P, R = max(len(p) for p, _, _ in examples), max(len(r) for _, r, _ in examples)
    n = len(examples)
    prompts = torch.full((n, P), pad_id, dtype=torch.long)
    responses = torch.full((n, R), pad_id, dtype=torch.long)
    pmask, rmask = torch.zeros(n, P, dtype=torch.long), torch.zeros(n, R, dtype=torch.long)
    loss_mask = torch.zeros(n, R)
    for i, (p, r, m) in enumerate(examples):
        prompts[i, P - len(p):], pmask[i, P - len(p):] = torch.tensor(p), 1
        responses[i, : len(r)], rmask[i, : len(r)] = torch.tensor(r), 1
        loss_mask[i, : len(m)] = torch.tensor(m, dtype=torch.float)
    attn = torch.cat([pmask, rmask], 1)
    return DataProto.from_dict({"input_ids": torch.cat([prompts, responses], 1), "attention_mask": attn,
                                "position_ids": (attn.cumsum(1) - 1).clamp(min=0), "responses": responses,
                                "response_mask": loss_mask})


# ---------------------------------------------------------------------------------------------- training
def _nll(module, micro: DataProto, device, use_remove_padding: bool, sp_group=None) -> torch.Tensor:
    """[b, R] token NLL of the responses (0 off the loss mask); with `sp_group` every rank of the Ulysses group gets
    the same rows and the whole result."""
    b = {k: v.to(device) for k, v in micro.batch.items()}
    targets = b["responses"].reshape(-1)
    logp = forward_response_logits(module, b["input_ids"], b["attention_mask"], b["position_ids"],
                                   b["responses"].shape[1], use_remove_padding, sp_group=sp_group,
                                   row_fn=lambda rows, flat: logprobs_from_logits(rows.float(), targets[flat])[:, None])
    return -logp[..., 0] * b["response_mask"]   # [b, R]


def _setup_dist(device_pref: str):
    """Returns (device, world, rank, created_group)."""
    use_cuda = torch.cuda.is_available() if device_pref == "auto" else device_pref == "cuda"
    if device_pref not in ("auto", "cuda", "cpu"):
        raise ValueError(f"trainer.device={device_pref!r}: use auto, cuda or cpu")
    if use_cuda and not torch.cuda.is_available():
        raise ValueError("trainer.device=cuda but no CUDA device is visible")
    created = False
    if not dist.is_initialized():
        backend = "nccl" if use_cuda else "gloo"
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            dist.init_process_group(backend)
        else:  # one process: an in-memory store (a file store would leave its directory behind in /tmp)
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        created = True
    rank, world = dist.get_rank(), dist.get_world_size()
    if use_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        return torch.device("cuda", torch.cuda.current_device()), world, rank, created
    return torch.device("cpu"), world, rank, created


def _all_mean(x: float, device) -> float:
    t = torch.tensor([x], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t.item()) / dist.get_world_size()


def run_sft(config: SFTConfig | None = None) -> dict:
    """Train (`config` None: the packaged defaults)."""
    cfg = config if config is not None else load_sft_config()
    from transformers import AutoTokenizer

    device, world, rank, created = _setup_dist(cfg.trainer.device)
    try:
        with _run_dir(cfg.trainer, rank):
            return _train(cfg, device, world, rank, AutoTokenizer)
    finally:
        if created:
            dist.destroy_process_group()


def _micro_size(d, dp: int) -> int:
    """data.micro_batch_size_per_gpu, or verl's deprecated global data.micro_batch_size over the `dp`
    data-parallel ranks."""
    if d.micro_batch_size is None:
        return d.micro_batch_size_per_gpu
    if d.micro_batch_size <= 0 or d.micro_batch_size % dp:
        raise ValueError(f"data.micro_batch_size={d.micro_batch_size} must be a positive multiple of the data-parallel "
                         f"size {dp} (it is divided over them; or set data.micro_batch_size_per_gpu)")
    return d.micro_batch_size // dp


def _tracker(cfg, rank: int):
    """The RL run's trackers for the loggers other than console (whose line the trainer prints), on rank 0, writing
    under {trainer.default_local_dir}/logs."""
    from hybridrl.trainer.tracking import Tracking, logger_names

    backends = [b for b in logger_names(cfg.trainer.logger) if b != "console"]
    if rank != 0 or not backends:
        return None

    t = cfg.trainer
    return Tracking(t.project_name, t.experiment_name, backends, config=cfg.to_dict(),
                    log_dir=Path(os.path.expanduser(t.default_local_dir)) / "logs")


@contextmanager
def _run_dir(t, rank: int):
    """Rank 0 holds the lock of {trainer.default_local_dir} for the run (no second run cleans its temporary
    checkpoint directories) and checks it and the log directory are writable."""
    if rank != 0:
        yield
        return
    from hybridrl.trainer.run_dir import claim_run_dir, run_log_dirs
    from hybridrl.trainer.tracking import logger_names

    root = Path(os.path.expanduser(t.default_local_dir))
    with claim_run_dir(root, run_log_dirs(logger_names(t.logger), root / "logs")):
        yield


def _train(cfg, device, world, rank, AutoTokenizer) -> dict:
    d, m, o, t = cfg.data, cfg.model, cfg.optim, cfg.trainer
    model_path = os.path.expanduser(m.partial_pretrain)
    if not os.path.isdir(model_path):
        raise FileNotFoundError(f"model.partial_pretrain={model_path} is not a directory")
    tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=m.trust_remote_code)
    template = resolve_chat_template(m.custom_chat_template, key="model.custom_chat_template")
    if template is not None:
        tokenizer.chat_template = template
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    examples, truncated = tokenize_examples(read_rows(d.train_files, d, d.train_max_samples), tokenizer,
                                            d.max_length, d.truncation)
    val = None
    if d.val_files:
        val, val_truncated = tokenize_examples(read_rows(d.val_files, d, d.val_max_samples), tokenizer, d.max_length,
                                               d.truncation)
    mesh = sft_training_mesh(cfg, world, device.type)
    sp_group, dp_rank, dp = sft_sequence_parallel(cfg, world, rank, device.type)
    bsz, micro = d.train_batch_size, _micro_size(d, dp)
    if bsz <= 0 or bsz % dp:
        raise ValueError(f"data.train_batch_size={bsz} must be a positive multiple of the data-parallel size {dp} "
                         f"(world {world} / ulysses_sequence_parallel_size)")
    if bsz > len(examples):
        raise ValueError(f"data.train_batch_size={bsz} exceeds the {len(examples)} training examples")
    steps_per_epoch = len(examples) // bsz
    total_steps = t.total_training_steps or steps_per_epoch * t.total_epochs

    choices: list[str] = []
    liger = resolve_liger(m.use_liger, device.type, load_hf_config(model_path).model_type, choices,
                          key="model.use_liger")
    if rank == 0 and choices:
        print(f"[sft] auto: {choices[0]}", flush=True)
    module = build_fsdp_model(ModelSource(model_path, dict(m.override_config), m.trust_remote_code),
                              FSDPDtypes.of(m.fsdp_config), mesh, device, role="causal_lm",
                              use_varlen_attention=m.use_remove_padding, lora=lora_settings(m, "model"),
                              gradient_checkpointing=m.enable_gradient_checkpointing, liger=liger)
    # SFT's optim keys in the PPO optimizer's section (warmup by ratio only, verl's fsdp_sft_trainer)
    optim_cfg = OptimConfig(lr=o.lr, weight_decay=o.weight_decay, betas=list(o.betas), lr_warmup_steps=-1,
                            lr_warmup_steps_ratio=o.warmup_steps_ratio, warmup_style=o.lr_scheduler,
                            min_lr_ratio=o.min_lr_ratio, total_training_steps=total_steps)
    optimizer = build_optimizer([p for p in module.parameters() if p.requires_grad], optim_cfg,
                                fused=device.type == "cuda")   # with LoRA: the adapters only
    scheduler = build_lr_scheduler(optimizer, optim_cfg)
    manager = sft_checkpoints(t, rank)
    facts = data_order_facts(cfg, len(examples))
    start = resume_sft(t, manager, module, optimizer, scheduler, facts)
    if rank == 0 and start:
        print(f"[sft] resumed at step {start}", file=sys.stderr)
    tracker = _tracker(cfg, rank)

    def validate() -> dict:
        return {"val/loss": _eval_loss(module, val[dp_rank::dp], pad_id, micro, device, m.use_remove_padding,
                                       sp_group)}

    history: list[dict] = []
    step, epoch = start, 0
    gen = torch.Generator().manual_seed(t.seed)
    per_rank = bsz // dp
    while step < total_steps:   # every epoch's order is drawn, the resumed ones' too: the same orders as one run
        order = torch.randperm(len(examples), generator=gen).tolist() if d.shuffle else list(range(len(examples)))
        first, epoch = epoch * steps_per_epoch, epoch + 1
        for s in range(max(0, step - first), steps_per_epoch):
            if step >= total_steps:
                break
            rows = order[s * bsz: (s + 1) * bsz][dp_rank * per_rank: (dp_rank + 1) * per_rank]
            batch = collate([examples[i] for i in rows], pad_id)
            metrics = _train_step(module, optimizer, batch, micro, device, m.use_remove_padding, o.clip_grad,
                                  sp_group)
            metrics = {"train/loss": _all_mean(metrics["loss"], device), "train/grad_norm": metrics["grad_norm"],
                       "train/lr": scheduler.get_last_lr()[0]}
            scheduler.step()
            step += 1
            last = step == total_steps
            if val is not None and t.test_freq > 0 and step % t.test_freq == 0 and not last:
                metrics.update(validate())
            if t.save_freq > 0 and (step % t.save_freq == 0 or last):
                save_sft_checkpoint(manager, step, module, optimizer, scheduler, tokenizer, t.checkpoint.contents,
                                    facts)
            history.append(metrics)
            if tracker is not None:
                tracker.log(metrics, step)
            if rank == 0 and t.log_freq and step % t.log_freq == 0:
                print(f"[sft] step {step}/{total_steps} " + " ".join(f"{k}={v:.4g}" for k, v in metrics.items()),
                      file=sys.stderr)
    result = dict(history[-1]) if history else {}
    result.update({"train/loss_first": history[0]["train/loss"] if history else float("nan"),
                   "training/global_step": step, "data/truncated": truncated,
                   "data/dropped_rows": len(examples) - steps_per_epoch * bsz})
    if val is not None:
        final = validate()
        result.update(final, **{"data/val_truncated": val_truncated})
        if tracker is not None:
            tracker.log(final, step)
    out_dir = Path(os.path.expanduser(t.default_local_dir)) / "huggingface"
    save_hf_model(module, out_dir, hf_config=module.config, tokenizer=tokenizer, role="causal_lm",
                  dtype=t.save_dtype)
    result["hf_model_dir"] = str(out_dir)
    if tracker is not None:
        tracker.finish()
    return result


def _train_step(module, optimizer, batch: DataProto, micro: int, device, use_remove_padding, clip,
                sp_group=None) -> dict:
    module.train()
    optimizer.zero_grad(set_to_none=True)
    total = float(batch.batch["response_mask"].sum().item())
    loss_sum = 0.0
    for mb in make_micro_batches(batch, False, micro, None, size_key="data.micro_batch_size_per_gpu")[0]:
        nll = _nll(module, mb, device, use_remove_padding, sp_group)
        tokens = mb.batch["response_mask"].to(device)
        loss = nll.sum() / tokens.sum().clamp(min=1)
        (loss * loss_scale(tokens, total, "token-mean")).backward()
        loss_sum += float(nll.sum().item())
    grad_norm = clip_grad_norm(module, clip)
    if torch.isfinite(torch.tensor(grad_norm)):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {"loss": loss_sum / max(total, 1.0), "grad_norm": grad_norm}


@torch.no_grad()
def _eval_loss(module, examples, pad_id, micro, device, use_remove_padding, sp_group=None) -> float:
    module.eval()
    nll_sum, tokens = 0.0, 0.0
    count = torch.tensor([-(-len(examples) // micro)], device=device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX)     # every rank runs as many forwards (FSDP collectives)
    for i in range(int(count.item())):
        chunk = examples[i * micro: (i + 1) * micro]
        mb = collate(chunk or examples[:1] or [([pad_id], [pad_id], [1])], pad_id)
        nll = _nll(module, mb, device, use_remove_padding, sp_group)
        if chunk:
            nll_sum += float(nll.sum().item())
            tokens += float(mb.batch["response_mask"].sum().item())
    t = torch.tensor([nll_sum, tokens], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t[0] / t[1].clamp(min=1))


# ---------------------------------------------------------------------------------------------- CLI
def _cli(args) -> int:
    result = run_sft(load_sft_config(args.config, args.overrides))
    print({k: v for k, v in result.items()})
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("sft", help="supervised fine-tuning (warm start for RL)")
    p.add_argument("overrides", nargs="*", help="config overrides key=value (see hybridrl/config/sft_trainer.yaml)")
    p.add_argument("--config", default=None, help="a YAML merged over the default sft config")
    p.set_defaults(func=_cli)


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="hybridrl")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["sft", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
