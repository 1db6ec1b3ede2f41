"""TRL `GRPOTrainer` baseline: a few GRPO steps with HF `generate` (no vLLM), timed, written as JSON.

Standalone on purpose (imports nothing from hybridrl) so it measures TRL alone; it reads the same verl-schema
parquet (`prompt` = list of chat messages, `reward_model.ground_truth`) and HF model directory that hybridrl's
benchmarks use, so the two can be run side by side on one GPU.

Choices, and why:
- One optimizer step consumes exactly `batch_prompts * n` completions made in ONE generation round:
  `generation_batch_size = batch_prompts * n`, `per_device_train_batch_size = micro_batch` (TRL's default 8),
  `gradient_accumulation_steps = batch_prompts * n / micro_batch`, so TRL derives
  `steps_per_generation = gradient_accumulation_steps` (checked after the config is built).
  `num_iterations=1`, `beta=0.0` (no KL, so no reference model), TRL's default loss (`loss_type`).
- TRL >= 1.x has no `max_prompt_length`, so `--overlong` decides, on the chat-rendered token ids:
  `truncate-left` (default; what TRL's old `max_prompt_length` did and what `benchmarks/grpo_step.py` sets for
  hybridrl: `data.filter_overlong_prompts=false data.truncation=left`) keeps the last `--max-prompt-len` ids,
  by overriding `GRPOTrainer._tokenize_prompts`, counted in `num_truncated_prompts`; `filter` drops overlong
  rows up front (hybridrl's `filter_overlong_prompts=true`), counted in `num_filtered_prompts`.
- `gradient_checkpointing` is set explicitly from the flag (GRPOConfig's own default is True).
- `--ignore-eos` (random-weight models): `generation_kwargs={"min_new_tokens": max_new_tokens}`, so HF's
  min-new-tokens processor masks every EOS id and each completion is exactly `max_new_tokens` long.
- Timing: wall time between consecutive `on_step_end` callbacks (with `torch.cuda.synchronize()`), the
  first interval measured from `on_train_begin`; step 1 is the warm-up and is excluded. It includes
  generation, scoring, the forward/backward passes and the optimizer step, i.e. what a user waits for.
  The CUDA memory peak is reset after the warm-up step; the peak with warm-up is reported too.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
import tempfile
import time

_INT_RE = re.compile(r"-?\d+")


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--model", required=True, help="HF model directory (random or real weights)")
    p.add_argument(
        "--prompts", required=True, help="parquet in verl's schema (prompt, reward_model.ground_truth)"
    )
    p.add_argument("--steps", type=int, default=3,
                   help="timed optimizer steps (after 1 warm-up step); 0: the warm-up step alone (warmup_step_s), "
                        "for workloads whose steps outlast a device call")
    p.add_argument("--batch-prompts", type=int, default=64)
    p.add_argument("--n", type=int, default=8, help="completions per prompt (num_generations)")
    p.add_argument(
        "--micro-batch",
        type=int,
        default=8,
        help="per_device_train_batch_size (TRL's default 8); must divide batch_prompts * n",
    )
    p.add_argument("--max-prompt-len", type=int, default=256)
    p.add_argument(
        "--overlong",
        choices=("truncate-left", "filter"),
        default="truncate-left",
        help="prompts longer than --max-prompt-len tokens (chat-rendered): keep the last ids, or drop",
    )
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument(
        "--weights",
        choices=("fp32", "bf16"),
        default="fp32",
        help="fp32: fp32 weights + bf16 autocast (GRPOConfig bf16=True); bf16: weights loaded in bf16",
    )
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument(
        "--ignore-eos", action="store_true", help="always generate exactly --max-new-tokens tokens"
    )
    p.add_argument("--reward", choices=("last_int", "constant"), default="last_int")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--val-prompts", help="parquet in the same schema: sampled validation accuracy on it")
    p.add_argument("--val-every", type=int, default=0, help="validate every this many timed steps (0 = never)")
    p.add_argument("--val-temperature", type=float, default=0.8)
    p.add_argument("--val-batch", type=int, default=256, help="prompts per validation generate call")
    p.add_argument("--lora-rank", type=int, default=0, help="> 0: train peft LoRA adapters (all linear layers)")
    p.add_argument("--lora-alpha", type=int, default=16)
    p.add_argument("--lora-targets", default="all-linear",
                   help="peft target_modules: all-linear, or comma-separated module names (e.g. q_proj,k_proj,v_proj,"
                        "o_proj: attention only, as hybridrl's LoRA on an MoE model)")
    p.add_argument("--out", required=True, help="result JSON path")
    a = p.parse_args(argv)
    total = a.batch_prompts * a.n
    if a.n < 2:
        p.error("--n must be >= 2 (GRPO needs a group)")
    if a.steps < 0:
        p.error("--steps must be >= 0")
    if a.val_every and not a.val_prompts:
        p.error("--val-every needs --val-prompts")
    if total % a.micro_batch:
        p.error(f"--micro-batch {a.micro_batch} must divide batch_prompts * n = {total}")
    return a


def last_int_reward(completions, ground_truth, **_):
    """1.0 if the last integer in the completion text equals the ground truth, else 0.0."""
    out = []
    for comp, gt in zip(completions, ground_truth, strict=True):
        text = comp[-1]["content"] if isinstance(comp, list) else comp  # conversational -> last message
        found = _INT_RE.findall(text)
        try:
            ok = bool(found) and int(found[-1]) == int(str(gt).strip())
        except ValueError:
            ok = bool(found) and found[-1] == str(gt).strip()
        out.append(1.0 if ok else 0.0)
    return out


def constant_reward(completions, **_):
    return [1.0] * len(completions)


def load_prompts(path, tokenizer, max_prompt_len, min_rows, drop_overlong):
    """Rows of {prompt: messages, ground_truth: str}; overlong prompts dropped if asked; tiled up to min_rows."""
    import pyarrow.parquet as pq

    table = pq.read_table(path, columns=["prompt", "reward_model"])
    rows, filtered = [], 0
    for prompt, rm in zip(
        table.column("prompt").to_pylist(), table.column("reward_model").to_pylist(), strict=True
    ):
        msgs = [{"role": m["role"], "content": m["content"]} for m in prompt]
        if drop_overlong:
            ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
            if hasattr(ids, "keys"):  # transformers 5 returns a BatchEncoding
                ids = ids["input_ids"]
            if len(ids) > max_prompt_len:
                filtered += 1
                continue
        rows.append({"prompt": msgs, "ground_truth": str(rm["ground_truth"])})
    if not rows:
        raise ValueError(f"{path}: every prompt is longer than --max-prompt-len {max_prompt_len} tokens")
    n_unique = len(rows)
    if len(rows) < min_rows:  # TRL's RepeatSampler drops an incomplete last batch of prompts
        rows = (rows * math.ceil(min_rows / len(rows)))[:min_rows]
    return rows, n_unique, filtered


def sampled_accuracy(model, tokenizer, rows, temperature, max_new_tokens, batch):
    """Share of rows whose one sampled completion (T=temperature, top-p 1, no top-k) has the right last integer.
    HF generate on the training model in eval mode with the KV cache, bf16 autocast as in training."""
    import torch

    was_training = model.training
    model.eval()
    correct = 0
    try:
        for i in range(0, len(rows), batch):
            chunk = rows[i:i + batch]
            texts = [tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False)
                     for r in chunk]
            enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
            with torch.no_grad(), torch.autocast(model.device.type, dtype=torch.bfloat16,
                                                 enabled=model.device.type == "cuda"):
                out = model.generate(**enc, do_sample=True, temperature=temperature, top_p=1.0, top_k=0,
                                     max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                                     use_cache=True)
            completions = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
            correct += sum(last_int_reward(completions, [r["ground_truth"] for r in chunk]))
    finally:
        model.train(was_training)
    return correct / len(rows)


def main(argv=None):
    args = parse_args(argv)
    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    cuda = torch.cuda.is_available()
    torch.manual_seed(args.seed)
    total = args.batch_prompts * args.n
    grad_accum = total // args.micro_batch

    tokenizer = AutoTokenizer.from_pretrained(args.model, padding_side="left", truncation_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    rows, n_unique, n_filtered = load_prompts(
        args.prompts, tokenizer, args.max_prompt_len, args.batch_prompts, args.overlong == "filter"
    )
    dataset = Dataset.from_list(rows)

    val_rows = load_prompts(args.val_prompts, tokenizer, args.max_prompt_len, 0, False)[0] if args.val_prompts else []

    dtype = torch.float32 if args.weights == "fp32" else torch.bfloat16
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype)
    peft_config = None
    if args.lora_rank > 0:
        from peft import LoraConfig

        targets = args.lora_targets if args.lora_targets == "all-linear" else args.lora_targets.split(",")
        peft_config = LoraConfig(r=args.lora_rank, lora_alpha=args.lora_alpha, target_modules=targets,
                                 task_type="CAUSAL_LM")

    generation_kwargs = {"min_new_tokens": args.max_new_tokens} if args.ignore_eos else None
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl_grpo_"),  # nothing is saved (save_strategy="no")
        # MoE models: no load-balancing loss, as hybridrl's actor.router_aux_loss_coef defaults (TRL would take the
        # model config's coefficient)
        router_aux_loss_coef=0.0,
        per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=grad_accum,
        generation_batch_size=total,
        num_generations=args.n,
        num_iterations=1,
        beta=0.0,
        learning_rate=args.lr,
        temperature=args.temperature,
        max_completion_length=args.max_new_tokens,
        generation_kwargs=generation_kwargs,
        use_vllm=False,
        bf16=True,
        gradient_checkpointing=args.gradient_checkpointing,
        max_steps=args.steps + 1,
        lr_scheduler_type="constant",
        logging_steps=1,
        save_strategy="no",
        eval_strategy="no",
        report_to=[],
        seed=args.seed,
        use_cpu=not cuda,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    # one optimizer step == one generation round of batch_prompts * n completions
    assert config.generation_batch_size == total, config.generation_batch_size
    assert config.steps_per_generation == config.gradient_accumulation_steps == grad_accum, (
        config.steps_per_generation,
        config.gradient_accumulation_steps,
    )

    class Timer(TrainerCallback):
        def __init__(self):
            self.t_last = None
            self.step_s = []
            self.peak_warmup = 0
            self.logs = []
            self.val = []  # {step, train_wall_s (validation excluded), acc}

        def _validate(self, model, step):
            if not val_rows:
                return
            t0 = time.perf_counter()
            acc = sampled_accuracy(model, tokenizer, val_rows, args.val_temperature, args.max_new_tokens,
                                   args.val_batch)
            self.val.append({"step": step, "train_wall_s": sum(self.step_s), "acc": acc,
                             "val_s": time.perf_counter() - t0})
            print(f"[trl] step {step} val acc {acc:.3f} train wall {sum(self.step_s):.1f}s", flush=True)

        def _sync(self):
            if cuda:
                torch.cuda.synchronize()

        def on_train_begin(self, a, state, control, model=None, **kw):
            self._validate(model, 0)
            self._sync()
            self.t_last = time.perf_counter()

        def on_step_end(self, a, state, control, model=None, **kw):
            self._sync()
            now = time.perf_counter()
            self.step_s.append(now - self.t_last)
            if len(self.step_s) == 1 and cuda:  # after the warm-up step: its peak, then reset
                self.peak_warmup = torch.cuda.max_memory_allocated()
                torch.cuda.reset_peak_memory_stats()
                peak_gb, which = self.peak_warmup / 1024**3, "warm-up step's peak"
            else:
                peak_gb, which = (torch.cuda.max_memory_allocated() / 1024**3 if cuda else 0.0), "peak since warm-up"
            print(f"[trl] step {state.global_step} {self.step_s[-1]:.2f} s, {which} {peak_gb:.2f} GiB",
                  flush=True)  # a run cut short by a time limit keeps its numbers in the log
            if args.val_every and state.global_step % args.val_every == 0:
                self._validate(model, state.global_step)  # outside the timed interval
            self._sync()
            self.t_last = time.perf_counter()

        def on_log(self, a, state, control, logs=None, **kw):
            if logs and "reward" in logs:
                self.logs.append(dict(logs, step=state.global_step))

    n_truncated = [0]
    max_prompt_len = args.max_prompt_len

    class LeftTruncatingGRPOTrainer(GRPOTrainer):
        """Keeps the last max_prompt_len chat-rendered prompt ids (TRL's removed `max_prompt_length`)."""

        def _tokenize_prompts(self, prompts):
            prompt_ids, images, multimodal_fields = super()._tokenize_prompts(prompts)
            n_truncated[0] += sum(len(ids) > max_prompt_len for ids in prompt_ids)
            return [list(ids)[-max_prompt_len:] for ids in prompt_ids], images, multimodal_fields

    if args.overlong == "truncate-left" and not hasattr(GRPOTrainer, "_tokenize_prompts"):
        raise RuntimeError(
            f"TRL {trl.__version__} has no GRPOTrainer._tokenize_prompts; use --overlong filter"
        )
    trainer_cls = LeftTruncatingGRPOTrainer if args.overlong == "truncate-left" else GRPOTrainer
    timer = Timer()
    reward_fn = last_int_reward if args.reward == "last_int" else constant_reward
    trainer = trainer_cls(
        model=model,
        reward_funcs=reward_fn,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[timer],
        peft_config=peft_config,
    )
    lora = None
    if peft_config is not None:  # which modules peft wrapped (e.g. attention only, not the MoE experts/router)
        wrapped = [n for n, m in trainer.model.named_modules() if hasattr(m, "lora_A")]
        lora = {"wrapped_modules": len(wrapped),
                "wrapped_names": sorted({re.sub(r"\.\d+\.", ".N.", n) for n in wrapped}),
                "trainable_params": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
                "total_params": sum(p.numel() for p in trainer.model.parameters())}
        print(f"[trl] lora: {json.dumps(lora)}", flush=True)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()

    timed = timer.step_s[1:]
    peak = torch.cuda.max_memory_allocated() if cuda else 0
    gb = 1024**3
    step_logs = sorted(timer.logs, key=lambda r: r["step"])
    result = {
        "framework": "trl",
        "trl_version": trl.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "args": vars(args),
        "trl_config": {
            "per_device_train_batch_size": config.per_device_train_batch_size,
            "gradient_accumulation_steps": config.gradient_accumulation_steps,
            "generation_batch_size": config.generation_batch_size,
            "steps_per_generation": config.steps_per_generation,
            "num_generations": config.num_generations,
            "num_iterations": config.num_iterations,
            "beta": config.beta,
            "loss_type": config.loss_type,
            "lr_scheduler_type": getattr(config.lr_scheduler_type, "value", config.lr_scheduler_type),
            "bf16": config.bf16,
            "gradient_checkpointing": config.gradient_checkpointing,
            "generation_kwargs": config.generation_kwargs,
            "use_vllm": config.use_vllm,
            "router_aux_loss_coef": config.router_aux_loss_coef,
            "model_dtype": str(dtype),
        },
        "lora": lora,
        "num_prompts_unique": n_unique,
        "num_filtered_prompts": n_filtered,
        "num_truncated_prompts": n_truncated[0],  # prompt copies (x n) truncated, warm-up included
        "warmup_step_s": timer.step_s[0] if timer.step_s else None,
        "step_s": timed,
        "median_step_s": statistics.median(timed) if timed else None,
        "peak_allocated_gb": peak / gb if timed else None,  # timed steps only; --steps 0: see incl_warmup
        "peak_allocated_gb_incl_warmup": max(peak, timer.peak_warmup) / gb,
        "val_curve": timer.val,  # validation at step 0 and every --val-every steps (not in step_s)
        "reward_mean_per_step": [r["reward"] for r in step_logs][1:],  # timed steps only, like step_s
        "reward_mean_warmup": step_logs[0]["reward"] if step_logs else None,
        "completion_mean_length_per_step": [r.get("completions/mean_length") for r in step_logs][1:],
        "completion_mean_length_warmup": step_logs[0].get("completions/mean_length") if step_logs else None,
        "command": sys.argv,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(
        json.dumps(
            {
                k: result[k]
                for k in (
                    "trl_version",
                    "device",
                    "step_s",
                    "median_step_s",
                    "peak_allocated_gb",
                    "reward_mean_per_step",
                )
            }
        )
    )
    return result


if __name__ == "__main__":
    main()
