"""`hybridrl bench {grpo,rollout,decode,update,logprob,plot} [args]`: run the benchmark scripts of a source checkout.

The scripts live in `benchmarks/` next to the package (they are reproduction recipes, not library code, so they are
not installed); this command finds them from the package location and runs them with the arguments given.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

SCRIPTS = {"grpo": "grpo_step.py", "rollout": "rollout.py", "decode": "profile_decode.py",
           "update": "profile_update.py", "logprob": "logprob_unshard.py", "plot": "plot_results.py"}


def _run(args) -> int:
    script = Path(__file__).resolve().parent.parent / "benchmarks" / SCRIPTS[args.which]
    if not script.exists():
        print(f"hybridrl bench: {script} not found — benchmarks run from a source checkout of hybridrl", file=sys.stderr)
        return 2
    sys.argv = [str(script), *args.script_args]
    runpy.run_path(str(script), run_name="__main__")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("bench", help="run a benchmark script (grpo step, rollout vs HF, decode profile, "
                              "update profile, log-prob unsharding, plots)")
    p.add_argument("which", choices=sorted(SCRIPTS), help=", ".join(f"{k}: benchmarks/{v}" for k, v in SCRIPTS.items()))
    p.add_argument("script_args", nargs="*", help="arguments passed to the script (put them after --)")
    p.set_defaults(func=_run)
