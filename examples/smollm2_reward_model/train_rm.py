"""Train a reward model for the a + b recipe from a causal-LM directory (SmolLM2-135M-Instruct, or any Llama/Qwen2).

    python examples/smollm2_reward_model/train_rm.py --policy MODEL --data DATA --out RM [options]

1. Policy samples: `--prompts` questions of DATA/train.parquet, each answered `--samples` times by the policy
   itself (hybridrl's rollout engine, T=`--temperature`, at most `--max-tokens` tokens), so the reward model
   learns on the distribution GRPO will show it; each answer is labelled by the recipe's rule (its last integer
   is the sum: examples/smollm2_arith/reward.py).
2. Synthetic pairs: for `--synthetic` of those answers per question, one copy whose last integer is set to the
   sum (label 1) and one set to a near miss (label 0): the same words, only the answer differs, so both classes
   are present (the untrained policy is mostly wrong) and only the arithmetic tells them apart.
3. Inputs are what the reward-model worker reads with `reward_model.model.input_tokenizer: null`: the prompt
   rendered by the policy's chat template with the generation prompt, then the response tokens (ending with the
   end-of-turn token when the answer stopped); the score is the head's output at the last token.
4. `--heldout` of the questions, with all their samples, are kept out of training. A
   ForSequenceClassification(num_labels=1) built on the policy's weights is trained with BCE on the score
   (AdamW, linear decay after 5% warm-up, `--epochs` over shuffled batches; bf16 autocast on CUDA, fp32 on CPU).
5. OUT gets the model (config.pad_token_id set) with the policy's tokenizer files copied unchanged (the trainer
   checks that a reward model reading the policy's ids has its tokenizer) — a `reward_model.model.path` — and
   OUT/rm_eval.json: the losses and, on the held-out questions, accuracy (score > 0 against the rule label) and
   ROC AUC over all samples and over the policy's own samples alone (AUC null where one class is missing).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import time
from pathlib import Path

import pyarrow.parquet as pq
import torch
import torch.nn.functional as F
from reward import rule  # this directory's reward.py: the a + b rule it reports
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    get_linear_schedule_with_warmup,
)

from hybridrl.config.tokenizer_files import TOKENIZER_FILES
from hybridrl.rollout.config import EngineConfig
from hybridrl.rollout.engine import LLMEngine
from hybridrl.rollout.sampling_params import SamplingParams
from hybridrl.training.reward_model import last_token_scores, score_sequences

NEAR_MISSES = (-10, -2, -1, 1, 2, 10)


def sample_answers(policy: str, prompts: list[list[int]], args, device, eos: int) -> list[list[list[int]]]:
    """`args.samples` sampled response token lists per prompt."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(policy, dtype=dtype)
    seqs, block = min(256, len(prompts) * args.samples), 16
    max_len = max(map(len, prompts)) + args.max_tokens
    config = EngineConfig(dtype=dtype, block_size=block, max_num_seqs=seqs, num_kv_blocks=seqs * -(-max_len // block),
                          max_model_len=max_len, max_num_batched_tokens=max(8192, max_len),
                          enforce_eager=device.type != "cuda", eos_token_ids=(eos,))
    engine = LLMEngine(model.config, config, device=device)
    engine.wake_up(("weights",))
    engine.load_weights(model.state_dict().items())
    engine.wake_up(("kv_cache",))
    params = SamplingParams(n=args.samples, temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed)
    outputs = engine.generate(prompts, params)
    engine.sleep()
    return [[list(c.token_ids) for c in r.outputs] for r in outputs]


def with_answer(text: str, answer: int) -> str:
    """`text` with its last integer replaced by `answer`, or with a closing sentence stating it if it has none."""
    found = list(rule.INTEGER.finditer(text))
    if not found:
        return f"{text.rstrip()} The answer is {answer}."
    return text[:found[-1].start()] + str(answer) + text[found[-1].end():]


def labelled(tokenizer, prompt: list[int], truth: int, answers, synthetic: int, rng) -> list[tuple]:
    """(input ids, rule label, from the policy) for one question's answers and its synthetic pairs."""
    out = []
    for ids in answers:
        out.append((prompt + ids, float(rule.last_integer(tokenizer.decode(ids, skip_special_tokens=True)) == truth),
                    True))
    for ids in answers[:synthetic]:
        text = tokenizer.decode(ids, skip_special_tokens=True)
        for answer, label in ((truth, 1.0), (truth + rng.choice(NEAR_MISSES), 0.0)):
            edited = tokenizer.encode(with_answer(text, answer), add_special_tokens=False)
            out.append((prompt + edited + [tokenizer.eos_token_id], label, False))
    return out


def train(model, tokenizer, examples, args, device) -> list[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    steps = args.epochs * -(-len(examples) // args.batch)
    schedule = get_linear_schedule_with_warmup(opt, max(1, steps // 20), steps)
    rng, losses = random.Random(args.seed), []
    model.train()
    for _ in range(args.epochs):
        order = rng.sample(range(len(examples)), len(examples))
        for start in range(0, len(order), args.batch):
            rows = [examples[i] for i in order[start:start + args.batch]]
            padded = tokenizer.pad({"input_ids": [r[0] for r in rows]}, return_tensors="pt").to(device)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda"):
                scores = last_token_scores(model, padded["input_ids"], padded["attention_mask"])
            loss = F.binary_cross_entropy_with_logits(scores.float(), torch.tensor([r[1] for r in rows], device=device))
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            schedule.step()
            losses.append(loss.item())
    return losses


def binary_metrics(scores: torch.Tensor, labels: torch.Tensor) -> dict:
    """Accuracy of score > 0, and ROC AUC = P(a positive outscores a negative), ties counting half."""
    pos, neg = scores[labels == 1], scores[labels == 0]
    auc = None
    if len(pos) and len(neg):
        auc = ((pos[:, None] > neg[None]).double().mean() + 0.5 * (pos[:, None] == neg[None]).double().mean()).item()
    return {"n": len(labels), "positives": len(pos), "accuracy": ((scores > 0).float() == labels).float().mean().item(),
            "auc": auc}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, kind, default in [("policy", str, None), ("data", str, None), ("out", str, None),
                                ("prompts", int, 1024), ("samples", int, 4), ("synthetic", int, 2),
                                ("max-tokens", int, 128), ("temperature", float, 0.8), ("heldout", float, 0.2),
                                ("epochs", int, 2), ("batch", int, 32), ("lr", float, 2e-5), ("seed", int, 0),
                                ("device", str, "cuda" if torch.cuda.is_available() else "cpu")]:
        p.add_argument(f"--{name}", type=kind, default=default, required=default is None)
    args = p.parse_args(argv)
    for name, ok, rule_text in [("prompts", args.prompts >= 2, ">= 2"), ("samples", args.samples >= 1, ">= 1"),
                                ("synthetic", 0 <= args.synthetic <= args.samples, "in [0, --samples]"),
                                ("max_tokens", args.max_tokens >= 1, ">= 1"), ("heldout", 0 < args.heldout < 1, "in (0, 1)"),
                                ("epochs", args.epochs >= 1, ">= 1"), ("batch", args.batch >= 1, ">= 1")]:
        if not ok:
            p.error(f"--{name.replace('_', '-')}={getattr(args, name)!r}: must be {rule_text}")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    device, rng, out = torch.device(args.device), random.Random(args.seed), Path(args.out)
    tokenizer = AutoTokenizer.from_pretrained(args.policy)
    if tokenizer.pad_token_id is None:  # for padding batches here only: the saved tokenizer is the policy's own
        tokenizer.pad_token = tokenizer.eos_token
    rows = pq.read_table(Path(args.data) / "train.parquet").to_pylist()
    rows = rng.sample(rows, min(args.prompts, len(rows)))
    prompts = [tokenizer.encode(tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False),
                                add_special_tokens=False) for r in rows]
    t0 = time.perf_counter()
    answers = sample_answers(args.policy, prompts, args, device, tokenizer.eos_token_id)
    sample_s = time.perf_counter() - t0
    n_held = max(1, round(args.heldout * len(rows)))
    if n_held >= len(rows):
        raise ValueError(f"--heldout={args.heldout} of {len(rows)} questions leaves none to train on")
    splits = {"heldout": [], "train": []}
    for i, (row, prompt, group) in enumerate(zip(rows, prompts, answers)):
        truth = int(row["reward_model"]["ground_truth"])
        splits["heldout" if i < n_held else "train"] += labelled(tokenizer, prompt, truth, group, args.synthetic, rng)

    torch.manual_seed(args.seed)  # the new score head's initialization
    model = AutoModelForSequenceClassification.from_pretrained(args.policy, num_labels=1, dtype=torch.float32)
    model.config.pad_token_id = tokenizer.pad_token_id
    model.to(device)
    t0 = time.perf_counter()
    losses = train(model, tokenizer, splits["train"], args, device)
    train_s = time.perf_counter() - t0
    model.eval()
    held = splits["heldout"]
    scores = score_sequences(model, [e[0] for e in held], args.batch, tokenizer.pad_token_id, device)
    labels, own = torch.tensor([e[1] for e in held]), torch.tensor([e[2] for e in held])
    k = max(1, len(losses) // 10)
    policy_labels = torch.tensor([e[1] for split in splits.values() for e in split if e[2]])
    report = {"policy": args.policy, "args": vars(args), "sample_s": sample_s, "train_s": train_s,
              "questions": {"train": len(rows) - n_held, "heldout": n_held},
              "train_examples": len(splits["train"]), "train_positives": int(sum(e[1] for e in splits["train"])),
              "policy_rule_accuracy": policy_labels.mean().item(),
              "loss_first": sum(losses[:k]) / k, "loss_last": sum(losses[-k:]) / k, "losses": losses,
              "heldout": binary_metrics(scores, labels), "heldout_policy_samples": binary_metrics(scores[own], labels[own])}
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    for name in (*TOKENIZER_FILES, "chat_template.jinja"):  # byte for byte: the trainer checks it is the policy's
        if (Path(args.policy) / name).is_file():
            shutil.copyfile(Path(args.policy) / name, out / name)
    (out / "rm_eval.json").write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k not in ("losses", "args")}, indent=1))
    return report


if __name__ == "__main__":
    main()
