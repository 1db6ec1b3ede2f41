"""`hybridrl bench list | run NAME | {grpo,rollout,decode,update,logprob,plot} [args]`: the benchmarks of a source
checkout.

`run NAME` runs a named scenario of `benchmarks/scenarios.py` (the exact commands of one committed record) from the
repository root, each command's console output in a log under the output folder, and writes `manifest.json` there
(commit and dirty flag, device, versions, the invocation, each command with its environment, exit code and wall
time, the verl overrides); `--dry-run` writes the manifest without running anything. The other subcommands run one
benchmark script with the arguments given. The scripts live in `benchmarks/` next to the package (reproduction
recipes, not library code, so not installed); this command finds them from the package location.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hybridrl import bench_manifest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
SCRIPTS = {"grpo": "grpo_step.py", "rollout": "rollout.py", "decode": "profile_decode.py",
           "update": "profile_update.py", "logprob": "logprob_unshard.py", "plot": "plot_results.py"}
RUN_ENV = {"PYTHONUNBUFFERED": "1", "RAY_DEDUP_LOGS": "0", "TOKENIZERS_PARALLELISM": "false"}


def load_scenarios() -> dict:
    """benchmarks/scenarios.py's SCENARIOS (name -> Scenario)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    import scenarios

    return scenarios.SCENARIOS


def _missing_checkout() -> int:
    print(f"hybridrl bench: {BENCH} not found — benchmarks run from a source checkout of hybridrl", file=sys.stderr)
    return 2


def _list(args) -> int:
    if not BENCH.exists():
        return _missing_checkout()
    for s in load_scenarios().values():
        print(f"{s.name:28s} {s.device:15s} {s.record or '(not run yet)':42s} {s.what}")
    return 0


def _expand(text: str, places: dict[str, str]) -> str:
    for key, value in places.items():
        text = text.replace("{" + key + "}", value)
    return text


def _execute(argv: list[str], env: dict[str, str], log: Path, echo: bool = True) -> int:
    """Run from the repository root, its output to LOG and (`echo`) streamed to the console as well."""
    with open(log, "w") as f:
        if not echo:
            return subprocess.run(argv, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
        with subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) as proc:
            for line in proc.stdout:
                sys.stdout.write(line)
                f.write(line)
    return proc.returncode


def _run(args) -> int:
    if not BENCH.exists():
        return _missing_checkout()
    known = load_scenarios()
    if args.name not in known:
        print(f"hybridrl bench run: no scenario {args.name!r}; `hybridrl bench list` names them", file=sys.stderr)
        return 2
    s = known[args.name]
    if args.parallel > 1 and not s.parallel:
        print(f"hybridrl bench run: scenario {s.name!r} runs its commands one at a time (they read each other's "
              "outputs or each plan for the whole GPU); --parallel is for scenarios marked parallel", file=sys.stderr)
        return 2
    out = Path(args.out or f"runs/bench/{s.name}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    places = {"out": str(out), "work": str(Path(args.work).resolve()), "smollm2": args.smollm2}
    base_env = {**os.environ, **RUN_ENV, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    commands = []
    for i, cmd in enumerate(s.commands, 1):
        argv = [sys.executable if a == "python" else _expand(a, places) for a in cmd.argv]
        script = Path(next((a for a in cmd.argv[1:] if not a.startswith("-")), cmd.argv[0])).stem
        commands.append({"argv": argv, "env": {k: _expand(v, places) for k, v in cmd.env},
                         "log": cmd.log or f"{i:02d}_{script}.log", "overrides": bench_manifest.overrides(argv),
                         "setup": cmd.setup})
    manifest = {"scenario": s.name, "what": s.what, "record": s.record, "device_kind": s.device,
                "command": f"hybridrl bench run {s.name} --out {out} --work {places['work']} --smollm2 {args.smollm2}"
                           + (" --dry-run" if args.dry_run else ""), "dry_run": args.dry_run,
                "placeholders": places, "env": RUN_ENV, "git": bench_manifest.git_state(ROOT),
                "device": bench_manifest.device_facts(), "versions": bench_manifest.versions(),
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "parallel": args.parallel, "commands": commands}
    path = out / "manifest.json"
    path.write_text(json.dumps(manifest, indent=1))
    lock = threading.Lock()

    def run_one(c: dict) -> None:
        print(f"[bench run] {' '.join(c['argv'])}", flush=True)
        t0 = time.time()
        rc = _execute(c["argv"], {**base_env, **c["env"]}, out / c["log"], echo=args.parallel == 1)
        with lock:
            c["rc"], c["wall_s"] = rc, round(time.time() - t0, 2)
            path.write_text(json.dumps(manifest, indent=1))   # after each command: a cut-short run keeps it
        if args.parallel > 1:
            print(f"[bench run] rc {rc} after {c['wall_s']} s: {c['log']}", flush=True)

    todo = [] if args.dry_run else commands
    for c in todo:   # setup commands (data, models the others read) alone, first
        if c["setup"]:
            run_one(c)
    with ThreadPoolExecutor(max_workers=args.parallel) as pool:
        list(pool.map(run_one, [c for c in todo if not c["setup"]]))
    failed = sum(c.get("rc", 0) != 0 for c in commands)
    print(f"[bench run] {s.name}: {len(commands)} commands, {failed} failed; {path}")
    return 1 if failed else 0


def _script(args) -> int:
    script = BENCH / SCRIPTS[args.which]
    if not script.exists():
        return _missing_checkout()
    extra = args.script_args[1:] if args.script_args[:1] == ["--"] else args.script_args
    sys.argv = [str(script), *extra]
    runpy.run_path(str(script), run_name="__main__")
    return 0


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"--parallel must be >= 1, got {value}")
    return value


def register(subparsers) -> None:
    p = subparsers.add_parser("bench", help="run a named benchmark scenario (bench list, bench run NAME) or one "
                              "benchmark script")
    sub = p.add_subparsers(dest="bench_command", required=True)
    sub.add_parser("list", help="the scenarios, one line each: name, machine kind, record, what it measures"
                   ).set_defaults(func=_list)
    r = sub.add_parser("run", help="run a scenario and write manifest.json beside its outputs")
    r.add_argument("name")
    r.add_argument("--out", help="output folder (default runs/bench/NAME)")
    r.add_argument("--work", default="/tmp/hybridrl_bench", help="scratch folder: models, prompts, run directories")
    r.add_argument("--smollm2", default="/tmp/smollm2", help="the converted SmolLM2-135M-Instruct (SmolLM2 scenarios)")
    r.add_argument("--dry-run", action="store_true", help="write the manifest with the expanded commands, run nothing")
    r.add_argument("--parallel", type=_positive_int, default=1,
                   help="commands run at once, each writing only its log (for runs that share a GPU, give each "
                        "trainer.gpu_memory_gb so that no plan sizes itself for the whole card)")
    r.set_defaults(func=_run)
    for which, script in SCRIPTS.items():
        s = sub.add_parser(which, help=f"benchmarks/{script} with the arguments given")
        s.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments passed to the script")
        s.set_defaults(func=_script, which=which)
