"""Prompts of the number-guessing game (guess_loop.py) in the trainer's parquet schema (verl's columns):

    python examples/agent_loop_guess/make_data.py --out ~/data/guess --train 512 --test 64
"""

import argparse
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from hybridrl.data.tasks.base import PROMPT_TYPE, REWARD_MODEL_TYPE

SCHEMA = pa.schema([("data_source", pa.string()), ("prompt", PROMPT_TYPE), ("ability", pa.string()),
                    ("reward_model", REWARD_MODEL_TYPE),
                    ("extra_info", pa.struct([("split", pa.string()), ("index", pa.int64())]))])


def rows(n: int, split: str, rng: random.Random, low: int = 1, high: int = 20) -> list[dict]:
    ask = (f"I am thinking of a whole number from {low} to {high}. Guess it: answer with one number. "
           "If you are wrong I will say higher or lower.")
    return [{"data_source": "guess_number", "prompt": [{"role": "user", "content": ask}], "ability": "game",
             "reward_model": {"style": "rule", "ground_truth": str(rng.randint(low, high))},
             "extra_info": {"split": split, "index": i}} for i in range(n)]


def write(out: Path, n_train: int, n_test: int, seed: int = 0) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    paths = {}
    for split, n in (("train", n_train), ("test", n_test)):
        paths[split] = out / f"{split}.parquet"
        pq.write_table(pa.Table.from_pylist(rows(n, split, rng), schema=SCHEMA), paths[split])
    return paths


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="~/data/guess")
    parser.add_argument("--train", type=int, default=512)
    parser.add_argument("--test", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for split, path in write(Path(args.out).expanduser(), args.train, args.test, args.seed).items():
        print(f"wrote {split} to {path}")
