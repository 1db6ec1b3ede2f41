"""verl-like entry point: `python -m hybridrl.trainer.main_ppo [--config F] key=value ...`.

Loads and validates the config on the driver (so a bad batch size fails in a second, before Ray or any
worker starts), prints the device layout, then hands over to `hybridrl.trainer.launch.run_ppo`.

SIGTERM and SIGINT stop the run cleanly: the signal raises DriverStopped in the main thread, the run unwinds
through its cleanup (worker groups shut down, loggers finished, the run-directory lock released), a line says
which checkpoint is the last one saved, and the driver exits with 128 + the signal (143, 130) — a second signal
meanwhile kills it at once. Ray is shut down before the exit and the interpreter's own teardown is skipped: with
Ray's threads still alive it aborted (status 134) after the cleanup had already finished.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path

from hybridrl.config.errors import ConfigError, RunStopError
from hybridrl.config.loader import load_config
from hybridrl.config.sections import PPOConfig
from hybridrl.config.validate import validate_config


def run(config: PPOConfig):
    """Validate (errors only; load_config already logged warnings), print the layout, train."""
    from hybridrl.plan.layout import derive_layout

    validate_config(config)
    derive_layout(config)  # batch arithmetic fails here, in a second; the run plan is printed once Ray is up
    from hybridrl.trainer.launch import run_ppo

    return run_ppo(config)


class DriverStopped(BaseException):
    """SIGTERM or SIGINT reached the driver (a BaseException, so no `except Exception` of the run swallows it)."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


def _raise_stopped(signum, frame):
    signal.signal(signum, signal.SIG_DFL)  # a second signal ends the process without waiting for the cleanup
    raise DriverStopped(signum)


def saved_summary(config: PPOConfig) -> str:
    """What a stopped run leaves to resume from: its newest complete checkpoint, or that there is none."""
    from hybridrl.trainer.checkpoint_manager import is_complete, step_of

    root = Path(os.path.expanduser(config.trainer.default_local_dir))
    steps = sorted((step_of(p), p) for p in root.glob("global_step_*")
                   if p.name.removeprefix("global_step_").isdigit() and p.is_dir() and is_complete(p))
    if not steps:
        return (f"no checkpoint saved under {root} (trainer.save_freq={config.trainer.save_freq}); a restart "
                "begins at step 0")
    return f"last checkpoint saved: {steps[-1][1]} (step {steps[-1][0]}); a restart with resume_mode=auto resumes there"


def _exit_stopped(stop: DriverStopped, config: PPOConfig) -> None:
    print(f"{stop}: {saved_summary(config)}", file=sys.stderr, flush=True)
    try:
        import ray

        if ray.is_initialized():
            ray.shutdown()
    except Exception as e:  # the exit status still says what happened
        print(f"ray.shutdown failed: {e!r}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(128 + stop.signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hybridrl.trainer.main_ppo")
    parser.add_argument("--config", metavar="FILE", default=None, help="YAML config (nested, verl key names)")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        config = load_config(args.config, args.overrides)
    except (ConfigError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    try:
        return run_until_stopped(config)
    except RunStopError as e:   # its message says what to do: no traceback
        print(f"error: {e}", file=sys.stderr)
        return 1


def _stop_in(error: BaseException) -> DriverStopped | None:
    """The DriverStopped behind `error`: itself, or in its cause / context chain (Ray wraps an exception raised in
    a signal handler while it waits in C code in a SystemError)."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, DriverStopped):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def run_until_stopped(config: PPOConfig) -> int:
    """`run(config)` with SIGTERM / SIGINT turned into a clean stop: the run's cleanup runs, then the process exits
    with 128 + the signal and a line naming the checkpoint a restart resumes from (`python -m
    hybridrl.trainer.main_ppo` and `hybridrl train` both run this way; init_ray keeps the handlers over ray.init)."""
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _raise_stopped)
    try:
        run(config)
    except BaseException as e:
        stop = _stop_in(e)
        if stop is None:
            raise
        _exit_stopped(stop, config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
