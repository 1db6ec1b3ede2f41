"""The `hybridrl` command.

    hybridrl config show  [--config F] [key=value ...]   resolved YAML
    hybridrl config check [--config F] [key=value ...]  validate, print the run plan; exit 1 on error
    hybridrl train [--config F] [key=value ...]          run PPO/GRPO; with no arguments, the embedded demo

Other areas add subcommands through `register(subparsers)` in their own modules (`_PLUGINS`). A module
that fails to import must not take the whole CLI down, nor vanish: its subcommand still exists, is
marked unavailable in `--help`, and running it prints the import error and exits 2. Heavy imports
(torch, ray) happen only inside the command that needs them, and `hybridrl config ...` skips the plugins.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import traceback

# (module, the subcommand name shown when the module cannot be imported)
_PLUGINS = [
    ("hybridrl.data.cli", "data"),
    ("hybridrl.assets.cli", "assets"),
    ("hybridrl.training.merge", "merge"),
    ("hybridrl.trainer.sft_trainer", "sft"),
    ("hybridrl.benchmarks_cli", "bench"),
]


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", default=None, help="YAML config (nested, verl key names)")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="verl-style overrides: a.b=1, +a.free_dict.k=v (add), ++a.b=v (force)")


def _load(args):
    from hybridrl.config.loader import load_config

    return load_config(args.config, args.overrides)


def _config_show(args) -> int:
    print(_load(args).to_yaml(), end="")
    return 0


def _config_check(args) -> int:
    """Validate, then print a summary (the verdict; the memory plan's peak, or the one reason there is no plan; the
    paths `hybridrl train` would stop on) and the run plan (layout, chosen micro-batches, KV blocks, predicted peak per
    phase) against this machine's device or, with --gpu-memory-gb, a GPU of that size; exit 1 if the config is invalid
    or cannot fit. Missing paths do not fail the check: the config may be meant for another machine."""
    import os
    from dataclasses import replace

    from hybridrl.config.paths import path_problems
    from hybridrl.plan import DeviceSpec, derive_layout, local_device, make_plan, reward_model_hf_config

    if args.config is None and args.overrides and "=" not in args.overrides[0]:
        args.config = args.overrides.pop(0)  # `config check FILE key=value ...`, the older form
    config = _load(args)
    if args.host_memory_gb and not args.gpu_memory_gb:
        raise SystemExit("config check: --host-memory-gb goes with --gpu-memory-gb (without it the plan reads this "
                         "machine's GPU and host memory)")
    host = int(args.host_memory_gb * 1024**3) if args.host_memory_gb else None
    if args.gpu_name and not args.gpu_memory_gb:
        raise SystemExit("config check: --gpu-name goes with --gpu-memory-gb (the name gives the datasheet peaks the "
                         "floors and speculative decoding's verify rows use, not the memory)")
    name = args.gpu_name or (f"a {args.gpu_memory_gb:g} GiB GPU" if args.gpu_memory_gb else None)
    device = (DeviceSpec("cuda", name, int(args.gpu_memory_gb * 1024**3), host)
              if args.gpu_memory_gb else local_device(config))
    problems = path_problems(config)
    unplanned = _no_plan_reason(config)
    plan = None
    if unplanned is None:
        from hybridrl.training.fsdp import load_hf_config

        model_path = os.path.expanduser(config.actor_rollout_ref.model.path)
        hf_config = load_hf_config(model_path, override_config=config.actor_rollout_ref.model.override_config)
        plan = make_plan(config, hf_config, device, rm_hf_config=reward_model_hf_config(config))
    print(f"{args.config or 'defaults + overrides'}: valid")
    print(f"memory plan: {_plan_summary(plan) if plan is not None else 'none: ' + unplanned}")
    if problems:
        print(f"missing or unusable: {len(problems)} path(s) `hybridrl train` stops on before starting any worker:")
        print("\n".join(f"  - {p}" for p in problems))
    print(plan if plan is not None else replace(derive_layout(config), device=device.type))
    return 0


def _no_plan_reason(config) -> str | None:
    """Why no memory plan can be made (the model shapes it needs are read from each model's config.json), or None."""
    import os

    models = [("actor_rollout_ref.model.path", config.actor_rollout_ref.model.path)]
    if config.reward_model.enable and config.reward_model.style == "model":
        models.append(("reward_model.model.path", config.reward_model.model.path))
    for key, path in models:
        path = os.path.expanduser(str(path))
        if not os.path.isfile(os.path.join(path, "config.json")):
            return (f"{key}={path!r} has no config.json to read the model's shape from (a config alone is enough: "
                    "`hybridrl assets tiny-model DIR --size qwen2.5-7b --no-weights` writes one of a known shape)")
    return None


def _plan_summary(plan) -> str:
    """The predicted peak, its phase and what it is measured against, in one line."""
    gib = 1024**3
    if not plan.predicted:
        return f"made for {plan.device} (no per-phase prediction)"
    phase, peak = max(((name, pm.total) for name, pm in plan.predicted.items()), key=lambda x: x[1])
    if plan.device.total_bytes is None:
        return (f"peak {peak / gib:.2f} GiB per worker predicted ({phase}); a CPU has no device memory to hold it "
                "against (--gpu-memory-gb N plans for GPUs of N GiB)")
    return (f"peak {peak / gib:.2f} GiB per GPU predicted ({phase}) of {plan.device.total_bytes / gib:.1f} GiB "
            f"({plan.device.name}): fits")


def _train(args) -> int:
    if args.config is None and not args.overrides:
        from hybridrl.trainer.demo import run_demo

        run_demo(args)
        return 0
    from hybridrl.trainer.main_ppo import run_until_stopped

    return run_until_stopped(_load(args))


def _unavailable(module: str, error: str):
    def handler(args) -> int:
        print(f"hybridrl: the '{args.command}' command is unavailable: {module} failed to import:\n{error}",
              file=sys.stderr)
        return 2

    return handler


def _register_plugins(sub) -> None:
    for module, name in _PLUGINS:
        try:
            importlib.import_module(module).register(sub)
        except Exception as e:  # shown, never hidden: see the module docstring
            if name in sub.choices:  # register() failed half-way; keep what it added
                continue
            err = "".join(traceback.format_exception_only(type(e), e)).strip()
            p = sub.add_parser(name, help=f"(unavailable: {module} failed to import)", add_help=False)
            p.set_defaults(func=_unavailable(module, err), accepts_any_args=True)


def build_parser(with_plugins: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hybridrl", description="RL post-training of LLMs with a 3D-HybridEngine")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    cfg = sub.add_parser("config", help="show or check a config")
    cfg_sub = cfg.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    show = cfg_sub.add_parser("show", help="print the resolved config as YAML")
    _add_config_args(show)
    show.set_defaults(func=_config_show)
    check = cfg_sub.add_parser("check", help="validate a config and print its run plan (layout, micro-batches, "
                                             "KV cache, predicted memory per phase)")
    _add_config_args(check)
    check.add_argument("--gpu-memory-gb", type=float, default=None,
                       help="plan for GPUs of this memory (GiB) instead of this machine's device")
    check.add_argument("--gpu-name", default=None,
                       help="with --gpu-memory-gb: the GPU's name as torch reports it (e.g. 'NVIDIA H200'), for its "
                            "datasheet peaks (hybridrl/device_peaks.py)")
    check.add_argument("--host-memory-gb", type=float, default=None,
                       help="with --gpu-memory-gb: the host memory available per node (GiB), to check what the "
                            "offloads pin (unchecked without it)")
    check.set_defaults(func=_config_check)
    train = sub.add_parser("train", help="run PPO/GRPO (no arguments: the embedded demo)")
    _add_config_args(train)
    train.set_defaults(func=_train)
    if with_plugins:
        _register_plugins(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from hybridrl.config.errors import ConfigError, RunStopError

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    argv = sys.argv[1:] if argv is None else list(argv)
    # plugins import torch & co (seconds): `config` does not need them
    parser = build_parser(with_plugins=not argv or argv[0] != "config")
    args, extra = parser.parse_known_args(argv)
    if extra and isinstance(getattr(args, "overrides", None), list) and all("=" in e for e in extra):
        args.overrides += extra  # key=value after an option (argparse stops the positional list there)
        extra = []
    if extra and not getattr(args, "accepts_any_args", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (ConfigError, FileNotFoundError, RunStopError) as e:
        print(f"hybridrl: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
