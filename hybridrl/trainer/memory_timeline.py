"""GPU memory by phase over training steps: record, save as JSON, plot; and scheme A vs hybrid side by side.

The numbers are given, not measured here (workers report `memory/{phase}/peak_allocated_gb` and
`memory/{phase}/peak_reserved_gb` in their metrics; `record_from_metrics` picks them up).
The workers measure them with `hybridrl.hybrid.memory.track_phase` (CUDA peak counters per phase; nothing
on CPU, where no GPU memory exists to report).
Choices:
- a phase seen twice in one step keeps the larger value (these are peaks);
- phases are ordered as one step runs (gen, reshard, old_log_prob, ref, values, adv, update_critic,
  update_actor), unknown phases after them in order of first appearance;
- the plot's x axis is the sequence (step, phase) — a timeline, so the sawtooth of wake/sleep
  within a step is visible — with step boundaries marked; reserved is dashed, allocated solid;
- the comparison figure has three panels: each run's timeline on a shared y axis, and per-phase
  peaks (max over steps) as grouped bars annotated with the hybrid/A change in percent;
- matplotlib with the Agg backend, imported only when plotting (no display here or on the GPU box).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["MemoryTimeline", "plot_comparison", "PHASE_ORDER"]

logger = logging.getLogger("hybridrl.memory")

PHASE_ORDER = ("reshard", "gen", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor")
KINDS = ("allocated", "reserved")
_METRIC = re.compile(r"^memory/(?P<phase>.+)/peak_(?P<kind>allocated|reserved)_gb$")


def _check_gb(value, what: str) -> float:
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"MemoryTimeline: {what} must be a finite number >= 0 (GB), got {value}")
    return value


@dataclass
class MemoryTimeline:
    name: str = "run"
    # {step: {phase: {"allocated": gb, "reserved": gb}}}
    data: dict[int, dict[str, dict[str, float]]] = field(default_factory=dict)

    def record(self, step: int, phase: str, peak_allocated_gb: float, peak_reserved_gb: float | None = None) -> None:
        if not isinstance(phase, str) or not phase:
            raise ValueError(f"MemoryTimeline.record: phase must be a non-empty string, got {phase!r}")
        entry = self.data.setdefault(int(step), {}).setdefault(phase, {})
        values = {"allocated": peak_allocated_gb, "reserved": peak_reserved_gb}
        for kind, value in values.items():
            if value is not None:
                value = _check_gb(value, f"step {step} phase {phase!r} peak_{kind}_gb")
                entry[kind] = max(entry.get(kind, 0.0), value)

    def record_from_metrics(self, step: int, metrics: dict) -> int:
        """Take every `memory/{phase}/peak_{allocated|reserved}_gb` in metrics; returns how many were taken."""
        taken = 0
        for key, value in metrics.items():
            m = _METRIC.match(key)
            if m:
                is_alloc = m.group("kind") == "allocated"
                self.record(step, m.group("phase"), value if is_alloc else None, None if is_alloc else value)
                taken += 1
        return taken

    record_metrics = record_from_metrics  # the name the PPO trainer calls

    # ------------------------------------------------------------------ views
    def steps(self) -> list[int]:
        return sorted(self.data)

    def phases(self) -> list[str]:
        seen = list(dict.fromkeys(p for s in self.steps() for p in self.data[s]))
        return [p for p in PHASE_ORDER if p in seen] + [p for p in seen if p not in PHASE_ORDER]

    def series(self, kind: str = "allocated") -> list[tuple[int, str, float]]:
        """[(step, phase, gb)] in timeline order; phases without a value of that kind are left out."""
        if kind not in KINDS:
            raise ValueError(f"MemoryTimeline: kind must be one of {KINDS}, got {kind!r}")
        order = self.phases()
        return [(s, p, self.data[s][p][kind]) for s in self.steps() for p in order
                if p in self.data[s] and kind in self.data[s][p]]

    def peak_gb(self, kind: str = "allocated") -> float:
        return max((v for _, _, v in self.series(kind)), default=0.0)

    def phase_peaks(self, kind: str = "allocated") -> dict[str, float]:
        out: dict[str, float] = {}
        for _, phase, v in self.series(kind):
            out[phase] = max(out.get(phase, 0.0), v)
        return out

    # ------------------------------------------------------------------ persistence
    def to_dict(self) -> dict:
        return {"name": self.name, "phases": self.phases(), "peak_allocated_gb": self.peak_gb("allocated"),
                "peak_reserved_gb": self.peak_gb("reserved"),
                "steps": {str(s): self.data[s] for s in self.steps()}}

    def to_json(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1), encoding="utf-8")
        return path

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> MemoryTimeline:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"memory timeline file {str(path)!r} does not exist")
        raw = json.loads(path.read_text(encoding="utf-8"))
        tl = cls(name=raw.get("name", path.stem))
        for step, phases in raw["steps"].items():
            for phase, kinds in phases.items():
                tl.record(int(step), phase, kinds.get("allocated"), kinds.get("reserved"))
        return tl

    # ------------------------------------------------------------------ plotting
    def _draw(self, ax) -> None:
        alloc = self.series("allocated")
        labels = [f"{s}:{p}" for s, p, _ in alloc]
        xs = list(range(len(alloc)))
        line = ax.plot(xs, [v for *_, v in alloc], marker="o", ms=3, label="peak allocated")[0]
        index = {(s, p): i for i, (s, p, _) in enumerate(alloc)}
        reserved = [(index[(s, p)], v) for s, p, v in self.series("reserved") if (s, p) in index]
        if reserved:
            ax.plot(*zip(*reserved), ls="--", color=line.get_color(), alpha=0.6, label="peak reserved")
        for i in range(1, len(alloc)):
            if alloc[i][0] != alloc[i - 1][0]:
                ax.axvline(i - 0.5, color="grey", lw=0.5, alpha=0.5)
        if len(labels) <= 40:
            ax.set_xticks(xs, labels, rotation=90, fontsize=6)
        ax.set_xlabel("step:phase")
        ax.set_ylabel("GPU memory (GB)")
        ax.set_title(f"{self.name} — peak {self.peak_gb():.2f} GB allocated")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)

    def plot(self, path_png: str | os.PathLike, title: str | None = None) -> Path:
        """PNG of the timeline. With no records (workers reported no memory metrics) the figure says so,
        and a warning is logged: the end of a training run must not fail on a missing plot."""
        plt = _pyplot()
        fig, ax = plt.subplots(figsize=(max(6.0, 0.18 * len(self.series()) + 3), 4.5))
        if self.data:
            self._draw(ax)
        else:
            logger.warning("MemoryTimeline %r has no records; %s shows an empty plot", self.name, path_png)
            ax.text(0.5, 0.5, "no memory/{phase}/peak_*_gb metrics were recorded", ha="center", va="center")
            ax.set_axis_off()
        if title:
            fig.suptitle(title)
        return _save(fig, plt, path_png)


def plot_comparison(baseline: MemoryTimeline, hybrid: MemoryTimeline, path_png: str | os.PathLike,
                    title: str = "GPU memory: scheme A vs hybrid engine") -> Path:
    """Side by side: baseline timeline | hybrid timeline (shared y) | per-phase peak bars with % change."""
    for tl in (baseline, hybrid):
        if not tl.data:
            raise ValueError(f"plot_comparison: timeline {tl.name!r} has no records")
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(16, 5), gridspec_kw={"width_ratios": [2, 2, 1.4]})
    baseline._draw(axes[0])
    hybrid._draw(axes[1])
    top = max(baseline.peak_gb("allocated"), baseline.peak_gb("reserved"),
              hybrid.peak_gb("allocated"), hybrid.peak_gb("reserved"))
    for ax in axes[:2]:
        ax.set_ylim(0, top * 1.1 if top > 0 else 1.0)
    a, b = baseline.phase_peaks(), hybrid.phase_peaks()
    phases = [p for p in PHASE_ORDER if p in a or p in b] + sorted((set(a) | set(b)) - set(PHASE_ORDER))
    xs = range(len(phases))
    axes[2].bar([x - 0.2 for x in xs], [a.get(p, 0.0) for p in phases], width=0.4, label=baseline.name)
    axes[2].bar([x + 0.2 for x in xs], [b.get(p, 0.0) for p in phases], width=0.4, label=hybrid.name)
    for x, p in zip(xs, phases):
        if a.get(p, 0.0) > 0 and p in b:
            axes[2].annotate(f"{100 * (b[p] - a[p]) / a[p]:+.0f}%", (x, max(a[p], b[p])), ha="center",
                             va="bottom", fontsize=7)
    axes[2].set_xticks(list(xs), phases, rotation=45, ha="right", fontsize=7)
    axes[2].set_ylabel("peak allocated (GB)")
    axes[2].set_title("per-phase peak (max over steps)")
    axes[2].legend(fontsize=7)
    pa, pb = baseline.peak_gb(), hybrid.peak_gb()
    change = f" ({100 * (pb - pa) / pa:+.1f}%)" if pa > 0 else ""
    fig.suptitle(f"{title}: peak allocated {pa:.2f} → {pb:.2f} GB{change}")
    return _save(fig, plt, path_png)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, plt, path_png) -> Path:
    path = Path(path_png)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
