"""Summarize `hybridrl bench run vs-trl-*` output: per configuration the median step time and peak allocated memory over
runs (each run's step time is its mean over timed steps), their spread (min-max), the ratio hybridrl / TRL at the
same weight precision, and the memory model's predicted peak per phase next to the measured one. Writes
summary JSON and a bar plot.

  python benchmarks/summarize_vs_trl.py benchmarks/results/vs_trl
"""

from __future__ import annotations

import glob
import json
import statistics
import sys
from pathlib import Path


def _stats(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": len(values)}


def hybridrl_runs(path: Path) -> dict[str, dict]:
    out: dict[str, dict] = {}
    data = json.loads(path.read_text())
    for spec, v in data["variants"].items():
        name = "hybridrl bf16 masters" if "model_dtype=bf16" in spec else "hybridrl (defaults, fp32 masters)"
        if "error" in v:
            continue
        e = out.setdefault(name, {"step_s": [], "peak_gb": [], "gen_s": [], "update_s": [], "phases": {}})
        e["step_s"].append(v["step_s"])
        e["gen_s"].append(v["gen_s"])
        e["update_s"].append(v["update_actor_s"])
        e["peak_gb"].append(v["peak_memory_gb"]["perf/max_memory_allocated_gb"])
        last = v["per_step"][-1]
        for k, pred in last.items():
            if k.startswith("plan/predicted_peak_gb/"):
                phase = k.rsplit("/", 1)[1]
                measured = v["peak_memory_gb"].get(f"memory/{phase}/peak_allocated_gb")
                if measured is not None:
                    e["phases"][phase] = {"predicted_gib": pred, "measured_gib": measured,
                                          "error": pred / measured - 1}
    return out


def trl_runs(files: list[str]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for f in files:
        r = json.loads(Path(f).read_text())
        name = f"TRL GRPOTrainer ({r['args']['weights']} weights)"
        e = out.setdefault(name, {"step_s": [], "peak_gb": []})
        e["step_s"].append(statistics.mean(r["step_s"]))
        e["peak_gb"].append(r["peak_allocated_gb"])
    return out


def main(folder: str) -> dict:
    root = Path(folder)
    summary: dict = {"note": "peak = torch.cuda.max_memory_allocated in GiB (hybridrl: max over phases and steps; "
                             "TRL: over the timed steps); step_s per run = mean of its timed steps"}
    for hy in sorted(root.glob("hybridrl_*.json")):
        preset = hy.stem.removeprefix("hybridrl_")
        rows = {**hybridrl_runs(hy), **trl_runs(sorted(glob.glob(str(root / f"trl_{preset}_*.json"))))}
        table = {}
        for name, e in rows.items():
            table[name] = {"step_s": _stats(e["step_s"]), "peak_gib": _stats(e["peak_gb"])}
            for k in ("gen_s", "update_s"):
                if k in e:
                    table[name][k] = _stats(e[k])
            if e.get("phases"):
                table[name]["memory_model"] = e["phases"]
        for ours, peer in (("hybridrl (defaults, fp32 masters)", "TRL GRPOTrainer (fp32 weights)"),
                           ("hybridrl bf16 masters", "TRL GRPOTrainer (bf16 weights)")):
            if ours in table and peer in table:
                table[ours]["vs_" + peer] = {
                    "step_ratio": table[ours]["step_s"]["median"] / table[peer]["step_s"]["median"],
                    "peak_ratio": table[ours]["peak_gib"]["median"] / table[peer]["peak_gib"]["median"]}
        summary[preset] = table
    (root / "summary.json").write_text(json.dumps(summary, indent=1))
    _plot(summary, root / "vs_trl.png")
    return summary


def _plot(summary: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    presets = [k for k in summary if k != "note"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, label in ((axes[0], "step_s", "seconds per GRPO step"), (axes[1], "peak_gib", "peak allocated (GiB)")):
        names = sorted({n for p in presets for n in summary[p]})
        width = 0.8 / max(1, len(names))
        for i, name in enumerate(names):
            xs, ys, lo, hi = [], [], [], []
            for j, p in enumerate(presets):
                if name in summary[p]:
                    s = summary[p][name][key]
                    xs.append(j + i * width)
                    ys.append(s["median"])
                    lo.append(s["median"] - s["min"])
                    hi.append(s["max"] - s["median"])
            ax.bar(xs, ys, width, yerr=[lo, hi], label=name, capsize=3)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(presets))], presets)
        ax.set_ylabel(label)
    axes[0].legend(fontsize=7)
    fig.suptitle("GRPO 64 prompts x 8, 256+256 tokens, one H200: hybridrl defaults vs TRL (median, min-max)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/vs_trl"), indent=1))
