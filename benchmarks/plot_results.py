"""Plots for docs/benchmarks.md from the committed results JSON (no GPU needed):

  python benchmarks/plot_results.py   → docs/img/memory_{7b,1.5b,llama3-8b}_scheme_a_vs_hybrid.png,
                                        docs/img/stability_7b_util07.png (from the stability run's console log),
                                        docs/img/smollm2_algorithms.png (the real model's curves per algorithm),
                                        docs/img/cascade_decode.png (cascade decode attention against prefix size),
                                        docs/img/decode_fused_mlp.png (the decode MLP, fused and not, against rows)
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

from hybridrl.trainer.memory_timeline import MemoryTimeline, plot_comparison

ROOT = Path(__file__).resolve().parent.parent
RESULTS, IMG = ROOT / "benchmarks" / "results", ROOT / "docs" / "img"


def timeline(variant: dict, name: str) -> MemoryTimeline:
    tl = MemoryTimeline(name)
    for step, metrics in enumerate(variant["per_step"], start=1):
        tl.record_from_metrics(step, metrics)
    return tl


def console_steps(log: Path) -> list[dict]:
    """The trainer's console lines `step N | key value | ...` as dicts (numbers only)."""
    rows = []
    for line in log.read_text().splitlines():
        if re.match(r"step \d+ \|", line):
            fields = [f.strip().rsplit(" ", 1) for f in line.split("|")]
            rows.append({k: float(v) for k, v in fields})
    return rows


def plot_stability(log: Path, out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = console_steps(log)
    steps = [r["step"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.5))
    ax1.plot(steps, [r["mem_gb"] for r in rows], marker="o")
    ax1.set(xlabel="step", ylabel="peak allocated GB (busiest rank)", title="memory")
    ax1.set_ylim(0, 140)
    ax2.plot(steps, [r["step_s"] for r in rows], marker="o", label="step")
    ax2.plot(steps, [r["gen_s"] for r in rows], marker="o", label="rollout (gen)")
    ax2.plot(steps, [r["upd_s"] for r in rows], marker="o", label="update_actor")
    ax2.set(xlabel="step", ylabel="seconds", title="time")
    ax2.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def validation_curve(metrics: Path) -> dict[int, float]:
    """{step: sampled validation accuracy} of a run's metrics.jsonl (the file logger's rows)."""
    curve = {}
    for line in metrics.read_text().splitlines():
        row = json.loads(line)
        for key, value in (row.get("data") or row).items():
            if key.startswith("val-core/") and key.endswith("acc/mean@1"):
                curve[int(row["step"])] = value
    return curve


SMOLLM2_RUNS = (  # label, files under results/smollm2_defaults (one per seed)
    ("defaults (GRPO)", "seeds/summary.json"),
    ("bypass, ppo_clip", "algorithms/m_bypass_clip_seed{s}.jsonl"),
    ("bypass, reinforce + token IS", "algorithms/m_bypass_reinforce_seed{s}.jsonl"),
    ("optimal token baseline", "algorithms/m_otb_seed{s}.jsonl"),
    ("partial rollouts, 96 of 128 tokens", "partial_rollout/m_partial96_seed{s}.jsonl"),
    ("partial rollouts, 64 tokens", "partial_rollout/m_partial_seed{s}.jsonl"),
    ("PF-PPO on GAE", "algorithms/m_pf_ppo_seed{s}.jsonl"),
    ("GAE alone", "algorithms/m_gae_seed{s}.jsonl"),
)


def plot_smollm2_algorithms(out: Path) -> None:
    """Median and range over seeds 1-3 (those run) of the sampled validation accuracy at steps 0, 10 and 20."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = RESULTS / "smollm2_defaults"
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, (label, pattern) in enumerate(SMOLLM2_RUNS):
        if pattern.endswith("summary.json"):
            runs = json.loads((base / pattern).read_text())["runs"]
            curves = [{int(k): v for k, v in runs[f"fused1_seed{s}"]["val_acc"].items()} for s in (1, 2, 3)]
        else:
            curves = [validation_curve(base / pattern.format(s=s)) for s in (1, 2, 3)
                      if (base / pattern.format(s=s)).exists()]
        steps = sorted(set.intersection(*(set(c) for c in curves)))
        values = [sorted(c[t] for c in curves) for t in steps]
        mid = [statistics.median(v) for v in values]
        x = [t + (i - len(SMOLLM2_RUNS) / 2) * 0.25 for t in steps]
        ax.errorbar(x, mid, yerr=[[m - v[0] for m, v in zip(mid, values)], [v[-1] - m for m, v in zip(mid, values)]],
                    marker="o", capsize=3, label=f"{label} ({len(curves)} seed{'s' * (len(curves) > 1)})")
    ax.set(xlabel="step", ylabel="sampled validation accuracy (T = 0.8)", xticks=[0, 10, 20],
           title="SmolLM2-135M a + b, 20 GRPO steps: median and range over seeds")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_cascade_decode(out: Path) -> None:
    """One layer's decode attention, cascade over per-row, against the groups' prefix K/V a layer (each once), with
    the GPU's L2 size: the cascade pays once the prefixes outgrow L2."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads((RESULTS / "cascade_decode" / "cascade_decode.json").read_text())
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for model, marker in (("1.5B", "o"), ("7B", "s")):
        for own_long, fill in ((False, "full"), (True, "none")):
            cases = [c for c in data["cases"] if c["model"] == model and c["prefix_mb"] > 0
                     and (c["own"] >= 2000) == own_long]
            ax.scatter([c["prefix_mb"] for c in cases], [c["speedup"] for c in cases], marker=marker,
                       facecolors="none" if fill == "none" else None, edgecolors="C0" if model == "1.5B" else "C1",
                       color="C0" if model == "1.5B" else "C1",
                       label=f"{model} heads, {'≥ 2,000' if own_long else '< 2,000'} own tokens a row")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.axvline(data["device"]["l2_mb"], color="grey", ls="--", lw=0.8)
    ax.text(data["device"]["l2_mb"] * 1.05, 0.62, "L2", color="grey")
    ax.set(xscale="log", xlabel="prefixes' K/V a layer, each group's once (MB)",
           ylabel="per-row µs / cascade µs",
           title=f"Cascade decode attention, one layer ({data['device']['gpu']})")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_decode_fused_mlp(out: Path) -> None:
    """A 1.5B layer's decode MLP (µs, 28 layers in a CUDA graph) against the rows of the step: cuBLAS gate|up,
    silu_mul and cuBLAS down, against the one-kernel MLP with its reduce, and the weight bytes' floor."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = {}
    for name in ("decode_fused_mlp_1.5b.json", "decode_fused_mlp_1.5b_rows_16_32_4.json"):
        data = json.loads((RESULTS / "long_tail" / name).read_text())
        rows.update({int(m): r for m, r in data["rows"].items()})
    ms = sorted(rows)
    fig, ax = plt.subplots(figsize=(6.5, 4))
    ax.plot(ms, [rows[m]["current_no_residual_us_per_layer"] for m in ms], "o-", label="cuBLAS + silu_mul + cuBLAS")
    ax.plot(ms, [rows[m]["fused_no_residual_us_per_layer"] for m in ms], "s-", label="one Triton kernel + reduce")
    ax.plot(ms, [rows[m]["floor_us_per_layer"] for m in ms], "--", color="grey", label="weight bytes / copy bandwidth")
    ax.axvline(16.5, color="grey", lw=0.8, ls=":")
    ax.text(15.5, ax.get_ylim()[1] - 2.5, "the engine fuses\nup to 16 rows", color="grey", fontsize=8, ha="right")
    ax.set(xscale="log", xticks=ms, xticklabels=[str(m) for m in ms], xlabel="rows (running sequences)",
           ylabel="µs per layer", title=f"Qwen2.5-1.5B decode MLP, one layer ({data['device']['gpus'][0]['name']})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main():
    IMG.mkdir(parents=True, exist_ok=True)
    for name, file in (("7b", "grpo_qwen2.5-7b"), ("1.5b", "grpo_qwen2.5-1.5b"), ("llama3-8b", "grpo_llama3-8b")):
        data = json.loads((RESULTS / f"{file}.json").read_text())["variants"]
        out = IMG / f"memory_{name}_scheme_a_vs_hybrid.png"
        model = "Llama-3-8B shape" if name.startswith("llama") else f"Qwen2.5-{name.upper()}"
        plot_comparison(timeline(data["scheme_a"], "scheme A (resident engine)"),
                        timeline(data["hybrid"], "hybrid engine"), out,
                        title=f"{model} GRPO on 2×H200, 64 prompts × n=8: peak allocated GB per phase")
        print(out)
    out = IMG / "stability_7b_util07.png"
    plot_stability(RESULTS / "grpo_qwen2.5-7b_stability.log", out,
                   "Qwen2.5-7B hybrid engine, 2×H200, 16 prompts × n=8, gpu_memory_utilization=0.7")
    print(out)
    out = IMG / "smollm2_algorithms.png"
    plot_smollm2_algorithms(out)
    print(out)
    out = IMG / "cascade_decode.png"
    plot_cascade_decode(out)
    print(out)
    out = IMG / "decode_fused_mlp.png"
    plot_decode_fused_mlp(out)
    print(out)


if __name__ == "__main__":
    main()
