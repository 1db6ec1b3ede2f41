"""How a model's first assistant turn uses the calculator on bignum prompts (a check of the SFT warm-up's strength
before GRPO, runs on CPU): the prompts rendered as the rollout renders them (chat_template.jinja, the tool config's
schemas in `tools=`), one sampled first turn each (HF generate, T=0.8, 64 new tokens), then the fractions that open
a `<tool_call>`, that parse (rollout/tool_parser.py) as a calculator call, whose expression evaluates to the row's
ground truth, and that answer `#### ...` without a call.

    python examples/smollm2_tools/first_turn_tool_use.py MODEL_DIR DATA/test.parquet [--rows 64] [--out FILE]
"""

from __future__ import annotations

import argparse
import ast
import json
import operator
from pathlib import Path

import pyarrow.parquet as pq
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hybridrl.rollout.tool_parser import parse_hermes
from hybridrl.tools.registry import load_tool_config

HERE = Path(__file__).resolve().parent
TOOLS = HERE.parent / "multiturn_calculator" / "tool_config.yaml"
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def _value(expr: str) -> int | None:
    """An integer + - * expression's value (what the bignum prompts ask for), None for anything else."""
    def walk(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        raise ValueError(expr)
    try:
        return walk(ast.parse(expr, mode="eval").body)
    except (ValueError, SyntaxError):
        return None


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("data")
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16",
                   help="weights and compute dtype; bf16 as the rollout engine runs on a GPU")
    p.add_argument("--out")
    a = p.parse_args(argv)
    tok = AutoTokenizer.from_pretrained(a.model)
    tok.chat_template = (HERE / "chat_template.jinja").read_text()
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16 if a.dtype == "bf16" else torch.float32).eval()
    tools = [tool.schema for tool in load_tool_config(str(TOOLS)).values()]
    rows = pq.read_table(a.data).to_pylist()[:a.rows]
    texts = [tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False, tools=tools) for r in rows]
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    torch.manual_seed(a.seed)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=64, do_sample=True, temperature=0.8, top_p=1.0,
                             pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
    turns = [t.split(tok.eos_token)[0] for t in
             tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=False)]
    counts = dict.fromkeys(("opens_tool_call", "parsed_calculator_call", "right_expression", "answers_directly"), 0)
    for row, turn in zip(rows, turns):
        if "<tool_call>" not in turn:
            counts["answers_directly"] += "####" in turn
            continue
        counts["opens_tool_call"] += 1
        calls = parse_hermes(turn)
        if calls and calls[0].error is None and calls[0].name == "calculator":
            counts["parsed_calculator_call"] += 1
            value = _value(str(calls[0].arguments.get("expression", "")))
            counts["right_expression"] += value is not None and str(value) == str(row["reward_model"]["ground_truth"])
    result = {"model": a.model, "rows": len(rows), **{k: v / len(rows) for k, v in counts.items()},
              "first_turns": turns[:4]}
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    print(json.dumps(main(), indent=1))
