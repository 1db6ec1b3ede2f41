"""`hybridrl assets tiny-model DIR [--arch] [--layers] [--hidden] [--heads] [--kv-heads] [--size PRESET] [--seed]`.

`register(subparsers)` adds the `assets` command to the top-level parser (hybridrl/cli.py); each leaf parser
sets `func(args)`, which the top-level CLI calls (returns the exit code, 0).
"""

from __future__ import annotations

import argparse

from hybridrl.assets.tiny_model import ARCHS, SIZE_PRESETS, build_tiny_model, write_size_preset

__all__ = ["register", "run_tiny_model"]


def run_tiny_model(args: argparse.Namespace) -> int:
    if args.size is not None:
        path = write_size_preset(args.dir, args.size, weights=not args.no_weights, seed=args.seed)
    else:
        path = build_tiny_model(args.dir, arch=args.arch, layers=args.layers, hidden=args.hidden, heads=args.heads,
                                kv_heads=args.kv_heads, intermediate=args.intermediate, seed=args.seed)
    print(f"wrote model and tokenizer to {path}")
    return 0


def register(subparsers) -> argparse.ArgumentParser:
    assets = subparsers.add_parser("assets", help="build offline model assets (tiny models, size presets)")
    sub = assets.add_subparsers(dest="assets_command", required=True)
    p = sub.add_parser("tiny-model", help="write a random HF model + trained BPE tokenizer into DIR")
    p.add_argument("dir", help="output directory")
    p.add_argument("--arch", choices=ARCHS, default="qwen2")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--intermediate", type=int, default=None, help="default: 2 * hidden")
    p.add_argument("--size", choices=sorted(SIZE_PRESETS), default=None,
                   help="a real architecture's shapes instead of the tiny ones (ignores --arch/--layers/...)")
    p.add_argument("--no-weights", action="store_true", help="with --size: write only config + tokenizer")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run_tiny_model)
    return assets
