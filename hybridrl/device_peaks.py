"""Datasheet peaks of the GPUs runs are planned for: HBM bandwidth and dense bf16 matrix throughput, the
denominators of each phase's floor (bytes or FLOPs a phase cannot avoid, over the device's peak).

Choices:
- Vendor datasheet figures (dense, no sparsity), looked up by the name torch reports; a floor from them is a
  lower bound the measured time is compared with, never a prediction. Measured ceilings are lower (an H200 copies
  at ~4.25 TB/s and multiplies bf16 at ~780 TFLOP/s in benchmarks/decode_floor.py), so "1.5x the floor" is a
  datasheet-relative margin.
- The L2 size (the cascade decode forecast of `hybridrl config check`) as torch reports it on these GPUs (an H100
  50 MiB and an H200 60 MiB, read on this project's machines); the engine itself reads the GPU it runs on.
- Unknown devices (and the CPU) have no peaks: callers then log no floor rather than a guessed one.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DevicePeaks:
    hbm_bytes_per_s: float
    bf16_flops: float
    l2_bytes: int | None = None     # L2 cache as torch reports it (None: not recorded here)


MiB = 1 << 20
_PEAKS = (  # (name fragment, lower case, most specific first) -> peaks
    ("h200", DevicePeaks(4.8e12, 989e12, 60 * MiB)),
    ("h100 pcie", DevicePeaks(2.0e12, 756e12, 50 * MiB)),
    ("h100", DevicePeaks(3.35e12, 989e12, 50 * MiB)),
    ("h800", DevicePeaks(3.35e12, 989e12, 50 * MiB)),
    ("b200", DevicePeaks(8.0e12, 2250e12)),
    ("a100-sxm4-80gb", DevicePeaks(2.039e12, 312e12, 40 * MiB)),
    ("a100 80gb pcie", DevicePeaks(1.935e12, 312e12, 40 * MiB)),
    ("a100", DevicePeaks(1.555e12, 312e12, 40 * MiB)),
    ("a800", DevicePeaks(2.039e12, 312e12, 40 * MiB)),
    ("l40s", DevicePeaks(0.864e12, 362e12, 96 * MiB)),
)


def peaks_of(device_name: str | None) -> DevicePeaks | None:
    """The datasheet peaks of a GPU named as torch.cuda.get_device_name() names it, or None if unknown."""
    name = (device_name or "").lower()
    return next((p for key, p in _PEAKS if key in name), None)
