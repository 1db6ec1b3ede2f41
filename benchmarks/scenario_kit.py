"""What a benchmark scenario is (`Scenario`, `Cmd`) and the builders the registry (`scenarios.py`) writes them with.

In a command's arguments `{out}` is the output folder, `{work}` the scratch folder (random-weight models, prompts,
run directories; reused across scenarios) and `{smollm2}` the converted SmolLM2-135M-Instruct
(`hybridrl assets smollm2 DIR`); `hybridrl bench run` substitutes them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Cmd:
    """One command: argv (`python` means the running interpreter), extra environment, the file under the output
    folder that receives its console output (default: `NN_<script>.log`), and `setup`: it prepares what others read
    (data, models), so `bench run --parallel` runs it alone, before them."""

    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    log: str = ""
    setup: bool = False


@dataclass(frozen=True)
class Scenario:
    """A named record: `record` is where its committed outputs live under benchmarks/results/ (None: scripted, not
    run yet), `device` the machine kind it ran on ("cpu" for the CPU ones); `parallel`: its commands other than setup
    ones are independent and each planned for a share of the GPU (trainer.gpu_memory_gb), so `bench run --parallel`
    may run several at once."""

    name: str
    what: str
    device: str
    record: str | None
    commands: tuple[Cmd, ...]
    parallel: bool = False


A = "actor_rollout_ref"
LORA64 = f"{A}.model.lora_rank=64;{A}.model.lora_alpha=128"
BF16 = f"{A}.actor.fsdp_config.model_dtype=bf16"
ONE_GPU_7B = ("--preset", "qwen2.5-7b", "--gpus", "1", "--defaults", "--steps", "3")
TWO_GPU_WORKLOAD = ("--prompts", "64", "--n", "8", "--prompt-len", "256", "--response-len", "256", "--gpus", "2")
ADD = "{work}/smollm2_add"


def py(script: str, *args: str, log: str = "", setup: bool = False, **env: str) -> Cmd:
    return Cmd(("python", script, *args), tuple(env.items()), log, setup)


def grpo(out: str, *args: str) -> Cmd:
    """benchmarks/grpo_step.py writing {out}/OUT (the model and prompts go under {work})."""
    return py("benchmarks/grpo_step.py", *args, "--workdir", "{work}", "--out", "{out}/" + out)


def trl(out: str, preset: str, steps: int, weights: str = "bf16", lora: int | None = None, prompts: int = 64,
        extra: tuple[str, ...] = ()) -> Cmd:
    """benchmarks/trl_grpo.py on the model and prompts a grpo() of the same preset wrote (`prompts` × 8, 256 + 256;
    grpo() writes 4 × its prompts rows); `extra`: more trl_grpo.py arguments."""
    lora_args = () if lora is None else ("--lora-rank", str(lora), "--lora-alpha", "128")
    return py("benchmarks/trl_grpo.py", "--model", f"{{work}}/models/{preset}",
              "--prompts", f"{{work}}/data/prompts_{4 * prompts}x256.parquet",
              "--steps", str(steps), "--batch-prompts", str(prompts), "--n", "8", "--max-prompt-len", "256",
              "--max-new-tokens", "256", "--weights", weights, "--gradient-checkpointing", "--ignore-eos",
              "--reward", "last_int", *lora_args, *extra, "--out", "{out}/" + out)


def gpu_tests(log: str, *paths: str) -> Cmd:
    return Cmd(("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", *paths), log=log)


def recipe(script: str, metrics: str, log: str, *overrides: str, **env: str) -> Cmd:
    """An examples/ recipe (bash) on the converted SmolLM2, its per-step metrics in {out}/METRICS."""
    return Cmd(("bash", script, *overrides),
               (("VERL_FILE_LOGGER_PATH", "{out}/" + metrics), ("MODEL", "{smollm2}"), *env.items()), log)


def smollm2_trl(out: str, log: str, *args: str) -> Cmd:
    return py("benchmarks/trl_grpo.py", "--model", "{smollm2}", "--prompts", f"{ADD}/train.parquet", *args,
              "--batch-prompts", "64", "--n", "8", "--micro-batch", "8", "--max-prompt-len", "128",
              "--max-new-tokens", "128", "--lr", "1e-5", "--temperature", "0.8", "--weights", "fp32",
              "--gradient-checkpointing", "--reward", "last_int", "--out", "{out}/" + out, log=log)


def summarize(script: str, *args: str) -> Cmd:
    return py(f"benchmarks/{script}", "{out}", *args, log="summarize.log")


def workload(preset: str) -> Cmd:
    """The model and prompts trl() reads, written before any hybridrl run (a no-op for the model if present)."""
    return py("benchmarks/workload.py", "--preset", preset, "--workdir", "{work}", log="workload.log")


def seven_b(kind: str, suffix: str = "", repeat: int | None = None) -> Cmd:
    """GRPO runs of the 7B shape on one GPU at the defaults: full (fp32 masters), full_bf16 (bf16 masters) or lora
    (r64), written to hybridrl_qwen2.5-7b_KIND[_SUFFIX].json, the names benchmarks/summarize_7b.py reads."""
    variant = {"full": "full", "full_bf16": f"bf16:{BF16}", "lora": f"lora64:{LORA64}"}[kind]
    rep = () if repeat is None else ("--repeat", str(repeat))
    name = f"hybridrl_qwen2.5-7b_{kind}{'_' + suffix if suffix else ''}.json"
    return grpo(name, *ONE_GPU_7B, *rep, "--variants", variant)


