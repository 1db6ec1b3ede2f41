"""The facts a benchmark run's `manifest.json` records beside its outputs: the checkout's commit and whether it had
uncommitted changes, the device as torch sees it, the versions of the packages that set the numbers, and the verl
overrides found in the commands."""

from __future__ import annotations

import os
import platform
import re
import subprocess
from importlib import metadata
from pathlib import Path

PACKAGES = ("hybridrl", "torch", "transformers", "ray", "trl", "peft", "liger-kernel", "triton")
OVERRIDE = re.compile(r"[A-Za-z_]\w*(?:\.\w+)+=[^;,\s]*")


def git_state(root: Path) -> dict:
    """{"commit": HEAD or None outside a checkout, "dirty": tracked or untracked changes not ignored}."""
    def git(*args: str) -> str | None:
        try:
            return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                                  check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def device_facts() -> dict:
    """CPU count and, where CUDA is available, each GPU's name and memory and the CUDA runtime torch was built with."""
    facts: dict = {"platform": platform.platform(), "cpus": os.cpu_count()}
    try:
        import torch

        from hybridrl.plan import visible_gpus  # the GPUs as the run plan sees them (it needs torch)
    except ImportError:
        return facts
    facts["cuda_available"] = torch.cuda.is_available()
    if facts["cuda_available"]:
        facts["cuda"] = torch.version.cuda
        facts["gpus"] = [{"name": gpu.name, "memory_gib": round(gpu.total_bytes / 1024**3, 2)}
                         for gpu in visible_gpus()]
    return facts


def versions() -> dict:
    """Python and each of PACKAGES' installed version (None where not installed)."""
    found: dict = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def overrides(argv: list[str]) -> list[str]:
    """The `dotted.key=value` overrides in a command's arguments, including those inside `--variants NAME:K=V;K=V`."""
    return [m for arg in argv for m in OVERRIDE.findall(arg)]
