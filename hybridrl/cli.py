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

from omegaconf import OmegaConf

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
    print(OmegaConf.to_yaml(_load(args)), end="")
    return 0


def _config_check(args) -> int:
    """Validate, then print the run plan (layout, chosen micro-batches, KV blocks, predicted peak per phase)
    against this machine's GPU or, with --gpu-memory-gb, a GPU of that size; exit 1 if it cannot fit."""
    import os

    from hybridrl.config.layout import derive_layout

    if args.config is None and args.overrides and "=" not in args.overrides[0]:
        args.config = args.overrides.pop(0)  # `config check FILE key=value ...`, the older form
    config = _load(args)
    print(f"{args.config or 'defaults + overrides'}: OK")
    model_path = os.path.expanduser(config.actor_rollout_ref.model.path)
    if not os.path.isfile(os.path.join(model_path, "config.json")):
        print(derive_layout(config))
        print(f"(no memory plan: actor_rollout_ref.model.path={model_path!r} has no config.json)")
        return 0
    from hybridrl.plan import DeviceSpec, local_device, make_plan, reward_model_hf_config
    from hybridrl.training.fsdp import load_hf_config

    device = (DeviceSpec("cuda", f"a {args.gpu_memory_gb:g} GiB GPU", int(args.gpu_memory_gb * 1024**3))
              if args.gpu_memory_gb else local_device(config))
    hf_config = load_hf_config(model_path, override_config=config.actor_rollout_ref.model.override_config)
    print(make_plan(config, hf_config, device, rm_hf_config=reward_model_hf_config(config)))
    return 0


def _train(args) -> int:
    if args.config is None and not args.overrides:
        from hybridrl.trainer.demo import run_demo

        run_demo(args)
        return 0
    from hybridrl.trainer.main_ppo import run

    run(_load(args))
    return 0


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
    check.set_defaults(func=_config_check)
    train = sub.add_parser("train", help="run PPO/GRPO (no arguments: the embedded demo)")
    _add_config_args(train)
    train.set_defaults(func=_train)
    if with_plugins:
        _register_plugins(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from hybridrl.config.validate import ConfigError

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
    except (ConfigError, FileNotFoundError) as e:
        print(f"hybridrl: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
