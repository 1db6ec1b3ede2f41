"""SIGTERM and SIGINT to the driver: a clean exit status (128 + the signal, not an abort) and a line naming the
checkpoint a restart resumes from."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hybridrl.trainer.checkpoint_manager import CheckpointManager

REPO = Path(__file__).resolve().parents[2]
# the driver with the run replaced by a wait: what matters is how main() meets the signal
DRIVER = """
import sys, time
sys.path.insert(0, {repo!r})
from hybridrl.trainer import main_ppo
def run(config):
    try:  # "running" inside: the signal may come the instant it is read
        print("running", flush=True)
        time.sleep(60)
    finally:
        print("cleanup ran", flush=True)
main_ppo.run = run
sys.exit(main_ppo.main(["trainer.default_local_dir={run_dir}", "trainer.save_freq=5"]))
"""


def _stop_driver(run_dir: Path, signum: int) -> subprocess.CompletedProcess:
    proc = subprocess.Popen([sys.executable, "-c", DRIVER.format(repo=str(REPO), run_dir=str(run_dir))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while proc.stdout.readline().strip() != "running":
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
    proc.send_signal(signum)
    proc.wait(timeout=60)  # the output is a few lines: no pipe fills
    # read through the same buffered streams: readline() may already hold what came after "running"
    return subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.read(), proc.stderr.read())


@pytest.mark.parametrize("signum, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_exits_cleanly_naming_the_last_checkpoint(tmp_path, signum, status):
    run_dir = tmp_path / "run"
    CheckpointManager(run_dir, fsync=False).save(3, lambda tmp: (tmp / "state.json").write_text("{}"))
    done = _stop_driver(run_dir, signum)
    assert done.returncode == status, done.stderr
    assert "cleanup ran" in done.stdout
    name = signal.Signals(signum).name
    assert f"stopped by {name}: last checkpoint saved: {run_dir / 'global_step_3'} (step 3)" in done.stderr


def test_signal_without_a_checkpoint_says_so(tmp_path):
    done = _stop_driver(tmp_path / "empty", signal.SIGTERM)
    assert done.returncode == 143
    assert "stopped by SIGTERM: no checkpoint saved under" in done.stderr and "trainer.save_freq=5" in done.stderr


# the same through `hybridrl train`, with a local Ray started first: ray.init must not take SIGTERM over
CLI_DRIVER = """
import sys, time
sys.path.insert(0, {repo!r})
from hybridrl import cli
from hybridrl.controller.resource_pool import init_ray
from hybridrl.trainer import main_ppo
def run(config):
    init_ray(num_cpus=1)
    try:
        print("running", flush=True)
        time.sleep(60)
    finally:
        print("cleanup ran", flush=True)
main_ppo.run = run
sys.exit(cli.main(["train", "trainer.default_local_dir={run_dir}", "trainer.save_freq=5"]))
"""


def test_hybridrl_train_with_ray_up_exits_cleanly_on_sigterm(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "DRIVER", CLI_DRIVER)
    done = _stop_driver(tmp_path / "run", signal.SIGTERM)
    assert done.returncode == 143, done.stderr[-2000:]
    assert "cleanup ran" in done.stdout and "stopped by SIGTERM: no checkpoint saved under" in done.stderr
