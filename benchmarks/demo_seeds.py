"""Run the embedded demo (`hybridrl train` with no arguments) for several seeds and record what it shows.

Each seed runs in its own process with a fresh HYBRIDRL_HOME (model, data and SFT built from scratch, as on a
fresh install), one after another so the wall times do not share the CPU with each other. After every seed the
JSON is rewritten: per-seed before/after greedy validation accuracy, the accuracy at each validation, wall time,
the machine's load average at the end; and the median, min and max over the seeds finished so far.

    python benchmarks/demo_seeds.py [--seeds 0 1 2] [--out benchmarks/results/demo_seeds.json]
    python benchmarks/demo_seeds.py --table    # the README's "Demo results" table, from the JSON (runs nothing)
    python benchmarks/demo_seeds.py --merge a.json b.json   # seeds run as separate invocations, into --out
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_seed(seed: int, log_dir: Path) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"hybridrl-demo-{seed}-") as home:
        env = {**os.environ, "HYBRIDRL_HOME": home, "HYBRIDRL_DEMO_SEED": str(seed)}
        t0 = time.time()
        with open(log_dir / f"demo_seed{seed}.log", "w") as log:
            proc = subprocess.run([sys.executable, "-m", "hybridrl.trainer.demo"], env=env, stdout=log,
                                  stderr=subprocess.STDOUT)
        if proc.returncode:
            return {"seed": seed, "error": f"exit code {proc.returncode}", "wall_s": time.time() - t0}
        result = json.loads((Path(home) / "demo" / "last_demo.json").read_text())
    keep = ("seed", "metric", "val_acc_before", "val_acc_after", "val_acc_by_step", "wall_s")
    return {**{k: result[k] for k in keep}, "load_avg_1m_at_end": os.getloadavg()[0]}


def summarize(runs: list[dict]) -> dict:
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return {}
    gains = [r["val_acc_after"] - r["val_acc_before"] for r in ok]
    stats = {name: {"median": statistics.median(v), "min": min(v), "max": max(v)}
             for name, v in (("before", [r["val_acc_before"] for r in ok]),
                             ("after", [r["val_acc_after"] for r in ok]), ("gain", gains),
                             ("wall_s", [r["wall_s"] for r in ok]))}
    return {**stats, "seeds_finished": len(ok), "all_up": all(g > 0 for g in gains)}


def table(data: dict) -> str:
    """Markdown: one row per seed (greedy validation accuracy at each validation step, wall time), then the summary."""
    runs = [r for r in data["runs"] if "error" not in r]
    steps = sorted({int(s) for r in runs for s in r["val_acc_by_step"]})
    head = "| seed | " + " | ".join("before GRPO" if s == 0 else f"step {s}" for s in steps) + " | gain | wall time |"
    lines = [head, "|" + "---|" * (len(steps) + 3)]
    for r in runs:
        accs = " | ".join(f"{r['val_acc_by_step'].get(str(s), float('nan')):.2f}" for s in steps)
        gain = r["val_acc_after"] - r["val_acc_before"]
        lines.append(f"| {r['seed']} | {accs} | **{gain:+.2f}** | {r['wall_s'] / 60:.1f} min |")
    sm = data["summary"]
    lines.append("")
    lines.append(f"Median over {sm['seeds_finished']} seeds: {sm['before']['median']:.2f} → {sm['after']['median']:.2f} "
                 f"(gain {sm['gain']['median']:+.2f}, range {sm['gain']['min']:+.2f} to {sm['gain']['max']:+.2f}); "
                 f"wall time {sm['wall_s']['min'] / 60:.1f}–{sm['wall_s']['max'] / 60:.1f} min.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "demo_seeds.json")
    parser.add_argument("--log-dir", type=Path, default=Path(tempfile.gettempdir()) / "hybridrl-demo-seeds",
                        help="each seed's console log (not committed)")
    parser.add_argument("--table", action="store_true", help="print the README table from --out and exit")
    parser.add_argument("--merge", type=Path, nargs="+", help="combine the runs of these JSONs into --out and exit")
    parser.add_argument("--note", default="", help="recorded in the JSON (e.g. how the runs shared the machine)")
    args = parser.parse_args(argv)
    if args.merge:
        parts = [json.loads(p.read_text()) for p in args.merge]
        runs = sorted((r for d in parts for r in d["runs"]), key=lambda r: r["seed"])
        args.out.write_text(json.dumps({"machine": parts[0]["machine"], "note": args.note, "runs": runs,
                                        "summary": summarize(runs)}, indent=2))
        return 0
    if args.table:
        print(table(json.loads(args.out.read_text())))
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    machine = {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}
    runs: list[dict] = []
    for seed in args.seeds:
        runs.append(run_seed(seed, args.log_dir))
        print(json.dumps(runs[-1]), flush=True)
        args.out.write_text(json.dumps({"machine": machine, "note": args.note, "runs": runs,
                                        "summary": summarize(runs)}, indent=2))
    return 0 if all("error" not in r for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
