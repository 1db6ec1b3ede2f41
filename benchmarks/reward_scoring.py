"""The reward phase's time against reward_model.scorer_workers: one step's samples scored by RewardManager with 1
and more worker processes, for a scorer that waits (a remote judge: `time.sleep`), one that computes (pure-Python
arithmetic on the CPU), and verl's code source `apps` (each sample's program run on 4 stdin cases in the sandbox,
half of the programs right). Each setting runs --repeat times on a warm manager (its processes started by a first,
untimed call); the scores are checked equal to the single-worker ones.

  python benchmarks/reward_scoring.py --samples 256 --workers 1,2,4,8 --repeat 3 --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import torch

SCORERS = textwrap.dedent('''
    import time

    def waiting(data_source, solution_str, ground_truth, extra_info=None):
        time.sleep(0.02)   # a sandboxed program's or a remote judge's answer
        return float(solution_str.strip().endswith(ground_truth))

    def computing(data_source, solution_str, ground_truth, extra_info=None):
        total = 0
        for i in range(150_000):   # ~10 ms of pure-Python work
            total += i % 7
        return float(solution_str.strip().endswith(ground_truth)) + 0 * total
''')


CODE_CASES = json.dumps({"inputs": ["1 2\n", "3 4\n", "5 6\n", "7 8\n"], "outputs": ["3\n", "7\n", "11\n", "15\n"]})
CODE_ANSWERS = ("```python\na, b = map(int, input().split())\nprint(a + b)\n```",
                "```python\na, b = map(int, input().split())\nprint(a + b + 1)\n```")


def _batch(tok, samples: int, source: str = "bench"):
    from hybridrl.protocol import DataProto

    if source == "apps":
        texts, truths = [CODE_ANSWERS[i % 2] for i in range(samples)], [CODE_CASES] * samples
    else:
        texts, truths = [f"the answer is {i % 97}" for i in range(samples)], [str(i % 5) for i in range(samples)]
    ids = [tok.encode(t, add_special_tokens=False) for t in texts]
    width = max(len(x) for x in ids)
    responses = torch.full((samples, width), tok.pad_token_id)
    mask = torch.zeros(samples, width, dtype=torch.long)
    for i, x in enumerate(ids):
        responses[i, :len(x)], mask[i, :len(x)] = torch.tensor(x), 1
    return DataProto.from_dict({"responses": responses, "response_mask": mask},
                               {"data_source": [source] * samples,
                                "reward_model": [{"style": "rule", "ground_truth": t} for t in truths],
                                "extra_info": [{"index": i} for i in range(samples)]})


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=256)
    p.add_argument("--workers", default="1,2,4,8")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)

    from hybridrl.assets.tokenizer import save_tokenizer, train_tokenizer
    from hybridrl.bench_manifest import device_facts
    from hybridrl.rewards import RewardManager, load_custom_reward_function

    work = Path(tempfile.mkdtemp(prefix="reward_scoring_"))
    tok = save_tokenizer(train_tokenizer(), work / "tok")
    (work / "scorers.py").write_text(SCORERS)
    rows = []
    for name in ("waiting", "computing", "sandboxed_code"):
        fn = None if name == "sandboxed_code" else load_custom_reward_function(work / "scorers.py", name)
        source = "apps" if name == "sandboxed_code" else "bench"
        reference = None
        for workers in (int(w) for w in args.workers.split(",")):
            manager = RewardManager(tok, compute_score=fn, timeout_s=30.0, workers=workers)
            try:
                manager(_batch(tok, workers * 2, source))   # start the processes (not timed)
                seconds = []
                for _ in range(args.repeat):
                    start = time.perf_counter()
                    out = manager(_batch(tok, args.samples, source))
                    seconds.append(time.perf_counter() - start)
            finally:
                manager.close()
            reference = out["scores"] if reference is None else reference
            if out["scores"] != reference:
                raise SystemExit(f"{name}: the scores with {workers} workers differ from those with one")
            if name == "sandboxed_code" and sorted(set(out["scores"])) != [0.0, 1.0]:
                raise SystemExit(f"sandboxed_code: expected scores of 0 and 1, got {sorted(set(out['scores']))}")
            rows.append({"scorer": name, "workers": workers, "seconds": seconds,
                         "median_s": statistics.median(seconds), "spread_s": max(seconds) - min(seconds)})
            print(f"{name:14s} workers={workers:2d} median {rows[-1]['median_s']:.2f} s "
                  f"(spread {rows[-1]['spread_s']:.2f})", flush=True)
    for row in rows:
        one = next(r for r in rows if r["scorer"] == row["scorer"] and r["workers"] == 1)
        row["speedup_vs_one_worker"] = one["median_s"] / row["median_s"]
    result = {"command": " ".join(["python", "benchmarks/reward_scoring.py", *sys.argv[1:]]),
              "device": device_facts(), "samples": args.samples, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
