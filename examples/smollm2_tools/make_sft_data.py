"""Tool-call traces for the SFT warm-up of examples/smollm2_tools: bignum prompts answered the way the multi-turn
rollout would, in verl's multi-turn SFT format.

    python examples/smollm2_tools/make_sft_data.py --data DATA/train.parquet --tools TOOL_CONFIG --out FILE --rows N

Each of the first `--rows` rows of DATA (the bignum task's verl-schema parquet: system + user prompt, the product's
expression in extra_info) becomes one conversation in the `messages` column: the prompt; an assistant message whose
`tool_calls` call the calculator on the expression; a `tool` message with the calculator's real answer (run through
the tool config, cut as the rollout cuts tool answers: `--max-tool-response-length`, `--truncate-side`); and an
assistant message `#### N`. A tool answer that is not the row's ground truth is an error (the trace would teach a
wrong answer). The `tools` column holds the tool schemas (JSON) that the chat template lists, the same ones the
rollout's tool config gives it. `hybridrl sft data.multiturn.enable=true` trains on it (loss on assistant turns).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from hybridrl.rollout.multi_turn import MultiTurnSettings, truncate_tool_response
from hybridrl.tools.registry import load_tool_config

TOOL = "calculator"


def conversation(row: dict, calculator, limit: int, side: str) -> list[dict]:
    arguments = {"expression": row["extra_info"]["expression"]}
    outcome = calculator.run(arguments)
    truth = row["reward_model"]["ground_truth"]
    if outcome.status != "ok" or outcome.text != truth:
        raise ValueError(f"row {row['extra_info']['index']}: the calculator answered {outcome.text!r} "
                         f"({outcome.status}) for {arguments['expression']!r}, the ground truth is {truth!r}")
    call = {"type": "function", "function": {"name": TOOL, "arguments": arguments}}
    return [*row["prompt"], {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": truncate_tool_response(outcome.text, limit, side)},
            {"role": "assistant", "content": f"#### {truth}"}]


def main(argv=None) -> Path:
    defaults = MultiTurnSettings()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="bignum parquet (hybridrl data make bignum)")
    p.add_argument("--tools", required=True, help="tool config YAML (multi_turn.tool_config_path)")
    p.add_argument("--out", required=True, help="output parquet")
    p.add_argument("--rows", type=int, required=True, help="conversations to write (the first rows of --data)")
    p.add_argument("--max-tool-response-length", type=int, default=defaults.max_tool_response_length)
    p.add_argument("--truncate-side", default=defaults.tool_response_truncate_side)
    args = p.parse_args(argv)
    rows = pq.read_table(args.data).to_pylist()
    if not 1 <= args.rows <= len(rows):
        p.error(f"--rows={args.rows}: must be in [1, {len(rows)}] (the rows of {args.data})")
    tools = load_tool_config(args.tools)
    if TOOL not in tools:
        p.error(f"--tools={args.tools}: no {TOOL!r} tool (tools: {sorted(tools)})")
    schemas = json.dumps([t.schema for t in tools.values()])
    out = [{"messages": conversation(r, tools[TOOL], args.max_tool_response_length, args.truncate_side),
            "tools": schemas, "data_source": r["data_source"]} for r in rows[:args.rows]]
    path = Path(args.out).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(out), path)
    print(f"wrote {len(out)} tool-call conversations to {path}")
    return path


if __name__ == "__main__":
    main()
