"""docs/multinode.md on a Ray cluster of two simulated machines: GRPO with trainer.nnodes=2 puts one worker on
each machine, ranks in machine order, and a pool asking for more machines than there are is refused."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_e2e_runs import arith_dir  # noqa: F401  (a fixture)

pytestmark = pytest.mark.slow
JOB = Path(__file__).resolve().parent / "multinode_job.py"


def test_grpo_across_two_simulated_machines(tiny_model_dir, arith_dir, tmp_path):  # noqa: F811
    repo = JOB.parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])}  # for Ray's workers
    proc = subprocess.run([sys.executable, str(JOB), str(tiny_model_dir), str(arith_dir), str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=300, cwd=repo, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("MULTINODE_REPORT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-5000:]
    report = json.loads(lines[-1].removeprefix("MULTINODE_REPORT "))

    placement = report["placement"]
    assert [p["rank"] for p in placement] == [0, 1]
    assert [p["node_rank"] for p in placement] == [0, 1]  # ranks follow the machines, machine 0 first
    assert [p["local_rank"] for p in placement] == [0, 0]  # one process per machine
    machines = [report["machines"][p["node_id"]] for p in placement]
    assert sorted(machines) == [["machine0"], ["machine1"]], machines  # one worker on each simulated machine

    assert [s["training/global_step"] for s in report["steps"]] == [1, 2]
    assert all(math.isfinite(s["actor/pg_loss"]) for s in report["steps"])
    refusal = report["three_machines"]
    assert refusal and "could not reserve [1, 1, 1]" in refusal and "2 machines" in refusal, refusal
