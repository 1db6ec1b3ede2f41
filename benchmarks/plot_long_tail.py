"""The long-tail GRPO step across its milestones, one figure for the docs (no GPU needed).

Reads the benchmark records in benchmarks/results/long_tail/*.json (written by benchmarks/long_tail.py /
grpo_step.py) and writes docs/img/long_tail_steps.png: one horizontal bar per milestone of the 1.5B step
(32 prompts x 8, responses up to 4,096 tokens), split into generation / update / other, with the step's
bandwidth + FLOP floor as a tick and the 15 s target of issue 31 as a dashed line.

  python benchmarks/plot_long_tail.py
"""

from __future__ import annotations

import json
from pathlib import Path
from statistics import mean, median

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "long_tail"
OUT = ROOT / "docs" / "img" / "long_tail_steps.png"
TARGET_S = 15.0

# (label, [(file, variant-name prefix)]), oldest first.
MILESTONES = [
    ("previous plan (2-row micro-batches)", [("before_54a27ec.json", "hybrid")]),
    ("no Liger, sync scheduling", [("after_no_liger_sync.json", "hybrid")]),
    ("Flex attention in the update", [("defaults_before_flash.json", "hybrid")]),
    ("FlashAttention varlen", [("defaults_before_head_and_unshard.json", "hybrid")]),
    (
        "Triton log-prob head, weights gathered once",
        [("defaults.json", "hybrid"), ("defaults_run3.json", "hybrid")],
    ),
    (
        "32k-token micro-batches, no recompute; decode kernels retuned",
        [("defaults_time_first.json", "hybrid#")],
    ),
    (
        "same, captures without warm-up",
        [("defaults_warm_capture_1.json", "hybrid#"), ("defaults_warm_capture_23.json", "hybrid#")],
    ),
    (
        "this tree: grouped K/V heads in the update's FlashAttention",
        [("defaults_gqa_native.json", "hybrid#"), ("defaults_gqa_native_3.json", "hybrid#")],
    ),
]
PARTS = [("generation", "tab:blue"), ("update", "tab:orange"), ("other", "tab:gray")]
FLOOR_KEYS = ("perf/floor_s/gen_decode", "perf/floor_s/update_actor")


def load_runs(name: str, prefix: str) -> list[dict] | None:
    """The successful variants of one record whose names start with `prefix`; None if the file is missing."""
    path = RESULTS / name
    if not path.exists():
        return None
    variants = json.loads(path.read_text())["variants"]
    return [v for k, v in variants.items() if k.startswith(prefix) and "error" not in v]


def floor_s(run: dict) -> float | None:
    """Mean over the timed steps (all but the first) of the decode + update floors, where both are logged."""
    floors = [sum(s[k] for k in FLOOR_KEYS) for s in run["per_step"][1:] if all(k in s for k in FLOOR_KEYS)]
    return mean(floors) if floors else None


def summarize(runs: list[dict]) -> dict:
    """Medians over the runs of the step and of its parts, the floor, and the run count."""
    step = median(r["step_s"] for r in runs)
    gen = median(r["gen_s"] for r in runs)
    update = median(r["update_actor_s"] for r in runs)
    other = median(r["step_s"] - r["gen_s"] - r["update_actor_s"] for r in runs)
    floors = [f for f in map(floor_s, runs) if f is not None]
    return {
        "step": step,
        "parts": [gen, update, other],
        "floor": median(floors) if floors else None,
        "runs": len(runs),
    }


def collect() -> list[tuple[str, dict]]:
    """(label, summary) for each milestone whose records exist, oldest first."""
    rows = []
    for label, sources in MILESTONES:
        runs, missing = [], []
        for name, prefix in sources:
            found = load_runs(name, prefix)
            if found is None:
                missing.append(name)
            else:
                runs += found
        for name in missing:
            print(f"{label}: {name} not found, skipped")
        if runs:
            rows.append((label, summarize(runs)))
        else:
            print(f"{label}: no successful run, milestone skipped")
    return rows


def draw_bar(ax, y: int, row: dict) -> None:
    """One stacked bar with its floor tick and its step label."""
    left = 0.0
    for width, (_, color) in zip(row["parts"], PARTS):
        ax.barh(y, width, left=left, color=color, height=0.6)
        left += width
    if row["floor"] is not None:
        ax.plot([row["floor"]] * 2, [y - 0.38, y + 0.38], color="black", lw=1.2)
    runs = f"  ({row['runs']} runs)" if row["runs"] > 1 else ""
    ax.text(max(row["step"], left) + 0.4, y, f"{row['step']:.2f} s{runs}", va="center", fontsize=9)


def plot(rows: list[tuple[str, dict]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    fig, ax = plt.subplots(figsize=(10, 0.55 * len(rows) + 2.2))
    for y, (_, row) in enumerate(rows):
        draw_bar(ax, y, row)
    ax.set_yticks(range(len(rows)), [label for label, _ in rows], fontsize=9)
    ax.invert_yaxis()  # oldest at the top
    ax.axvline(TARGET_S, color="tab:red", ls="--", lw=1.2)
    ax.text(TARGET_S + 0.3, len(rows) - 0.45, "target (issue 31)", color="tab:red", fontsize=9, va="bottom")
    xmax = max(row["step"] for _, row in rows)
    ax.set_xlim(0, xmax * 1.18)
    ax.set_xlabel("seconds")
    ax.set_title("Long-tail GRPO step, Qwen2.5-1.5B shape, one H200")
    handles = [Patch(color=c, label=n) for n, c in PARTS]
    handles.append(Line2D([], [], color="black", lw=1.2, label="floor"))
    ax.legend(handles=handles, loc="lower right", fontsize=9, frameon=False)
    fig.text(
        0.01,
        0.01,
        "bars: median of runs; generation / update / other; tick: bandwidth + FLOP floor of decode and update",
        fontsize=8,
        color="dimgray",
    )
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)


def report(rows: list[tuple[str, dict]]) -> None:
    for label, row in rows:
        gen, update, other = row["parts"]
        floor = f"{row['floor']:.2f}" if row["floor"] is not None else "-"
        print(
            f"{label}: step {row['step']:.2f}  gen {gen:.2f}  update {update:.2f}  "
            f"other {other:.2f}  floor {floor}  runs {row['runs']}"
        )


def main():
    rows = collect()
    report(rows)
    plot(rows, OUT)
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
