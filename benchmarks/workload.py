"""Write the random-weight model of a size preset and the 256 × 256-token prompts under WORKDIR, as
benchmarks/grpo_step.py does for 64 prompts of 256 tokens (WORKDIR/models/PRESET, WORKDIR/data/prompts_256x256.parquet),
so that benchmarks/trl_grpo.py can run on the same model and prompts before or without a hybridrl run.

    python benchmarks/workload.py --preset qwen2.5-7b --workdir /tmp/hybridrl_bench
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grpo_step import make_prompts  # noqa: E402


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", required=True)
    p.add_argument("--workdir", required=True)
    a = p.parse_args(argv)
    from hybridrl.assets.tiny_model import write_size_preset

    model = Path(a.workdir) / "models" / a.preset
    if not (model / "config.json").exists() or not any(model.glob("*.safetensors")):
        write_size_preset(model, a.preset, weights=True)
    print(make_prompts(Path(a.workdir) / "data", model, 256, 256))


if __name__ == "__main__":
    main()
