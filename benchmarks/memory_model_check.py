"""The memory model's update and rollout predictions for every measured one-H200 configuration, next to the peak
`torch.cuda.max_memory_allocated` measured in that phase (numbers from the runs' JSON under benchmarks/results/:
vs_trl/ and vs_trl/equal_precision/ for 0.5B and 1.5B, qwen2.5-7b_defaults/ and lora_fused/ for 7B; the
micro-batch, recompute and Liger choice each run's plan made are passed explicitly: "auto" recompute is the plan's
partial recompute, and the Liger rows plan as if liger-kernel were installed, as it was on the GPU). CPU only, a
few seconds:

    python benchmarks/memory_model_check.py [-v]      (or: hybridrl bench run memory-model)
"""
import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grpo_step import base_overrides  # noqa: E402

from hybridrl.assets.tiny_model import write_size_preset  # noqa: E402
from hybridrl.config.loader import load_config  # noqa: E402
from hybridrl.plan.run_plan import DeviceSpec, make_plan  # noqa: E402
from hybridrl.training.fsdp import load_hf_config  # noqa: E402

GiB = 1024**3
H200 = DeviceSpec("cuda", "NVIDIA H200", 143771 * 1024**2)
A = "actor_rollout_ref"
LORA = [f"{A}.model.lora_rank=64", f"{A}.model.lora_alpha=128"]
BF16 = [f"{A}.actor.fsdp_config.model_dtype=bf16"]
NO_LIGER = [f"{A}.model.use_liger=false"]   # the runs before Liger
LIGER = [f"{A}.model.use_liger=true"]
RUNS = [  # name, preset, GPUs, micro-batch, recompute, overrides, measured peak GiB (gen, update_actor)
    ("0.5B fp32 masters", "qwen2.5-0.5b", 1, 32, True, [], (8.67, 10.47)),
    ("0.5B bf16 masters", "qwen2.5-0.5b", 1, 32, True, BF16, (5.92, 6.81)),
    ("1.5B fp32 masters", "qwen2.5-1.5b", 1, 32, True, [], (24.63, 28.85)),
    ("1.5B bf16 masters", "qwen2.5-1.5b", 1, 32, True, BF16, (16.00, 16.21)),
    ("7B full, 1 GPU", "qwen2.5-7b", 1, 16, True, [], (108.70, 122.26)),
    ("7B full, 2 GPUs", "qwen2.5-7b", 2, 32, True, [], (61.92, 69.47)),
    ("7B LoRA r64, recompute", "qwen2.5-7b", 1, 32, True, LORA, (39.26, 26.77)),
    ("7B LoRA r64, no recompute", "qwen2.5-7b", 1, 4, False, LORA, (39.26, 31.60)),
    ("7B full, 1 GPU, Liger", "qwen2.5-7b", 1, 32, True, LIGER, (108.68, 124.37)),
    ("7B LoRA r64, Liger, 6 kept", "qwen2.5-7b", 1, 32, "auto", LORA + LIGER, (39.26, 37.52)),
]


def main(verbose: bool) -> None:
    import hybridrl.training.liger as liger

    liger.liger_installed = lambda: True   # the plan's flag only: nothing here runs a kernel
    tmp = Path(tempfile.mkdtemp(prefix="memory_model_check_"))
    for name, preset, gpus, micro, recompute, extra, (gen, update) in RUNS:
        model = tmp / preset
        if not (model / "config.json").exists():
            write_size_preset(model, preset, weights=False)
        a = argparse.Namespace(defaults=True, prompts=64, n=8, prompt_len=256, response_len=256, tp=1, mini_batch=0,
                               grad_ckpt=str(recompute).lower(), gpus=gpus, device="cuda", steps=3, gpu_mem=0.5,
                               logprob_micro=16, micro=micro, keep_eos=False)
        extra = extra if any("use_liger" in o for o in extra) else extra + NO_LIGER
        overrides = base_overrides(a, model, tmp / "prompts.parquet", tmp / "run") + extra + [
            f"{A}.actor.ppo_micro_batch_size_per_gpu={micro}"]
        plan = make_plan(load_config(None, overrides), load_hf_config(str(model)), H200)
        pg, pu = plan.predicted["gen"].total / GiB, plan.predicted["update_actor"].total / GiB
        print(f"{name:28s} gen {pg:7.2f} / {gen:7.2f} GiB ({pg / gen - 1:+.1%})   "
              f"update {pu:7.2f} / {update:7.2f} GiB ({pu / update - 1:+.1%})")
        if verbose:
            print("    update:", plan.predicted["update_actor"].describe())


if __name__ == "__main__":
    main("-v" in sys.argv)
