"""The Qwen2.5-7B-shape records beside TRL's GRPOTrainer: 64 prompts × 8, 256 + 256 tokens (EOS ignored), hybridrl
with only the workload's verl keys (`grpo_step.py --defaults`), TRL with bf16 weights and gradient checkpointing.
Each scenario is one results folder; its commands run in the order the record's device calls ran them."""

from scenario_kit import (
    LORA64,
    ONE_GPU_7B,
    Cmd,
    Scenario,
    gpu_tests,
    grpo,
    py,
    seven_b,
    summarize,
    trl,
    workload,
)

P7 = "qwen2.5-7b"
T = "tests/training/"


def profile_update(out: str, *args: str) -> Cmd:
    return py("benchmarks/profile_update.py", "--preset", P7, "--workdir", "{work}", "--rows", "512",
              "--prompt-len", "256", "--response-len", "256", *args, "--out", "{out}/" + out)


def fused_head() -> Cmd:
    return py("benchmarks/fused_head.py", "--out", "{out}/fused_head.json")


SEVEN_B = [
    Scenario("qwen7b-first-defaults", "7B full and LoRA r64 at the first defaults beside TRL and TRL + peft, one GPU "
             "each", "nvidia-h200-x2", "qwen2.5-7b_defaults", (
                 workload(P7),
                 grpo("hybridrl_qwen2.5-7b_1gpu.json", "--preset", P7, "--gpus", "1", "--defaults", "--grad-ckpt",
                      "--steps", "3", "--variants", f"full,lora64:{LORA64}"),
                 trl("trl_qwen2.5-7b_lora0.json", P7, 2, lora=0),
                 trl("trl_qwen2.5-7b_lora64.json", P7, 2, lora=64),
                 gpu_tests("gpu_tests.txt", "tests"))),
    Scenario("qwen7b-2gpu", "7B full fine-tuning at the defaults on two GPUs", "nvidia-h200-x2",
             "qwen2.5-7b_defaults", (
                 grpo("hybridrl_qwen2.5-7b_2gpu_full.json", "--preset", P7, "--gpus", "2", "--defaults",
                      "--grad-ckpt", "--steps", "3", "--variants", "full"),)),
    Scenario("qwen7b-lora-recompute", "7B LoRA r64: recompute off at 4 rows a micro-batch vs on at 32, beside TRL + "
             "peft", "nvidia-h200", "qwen2.5-7b_defaults", (
                 workload(P7),
                 grpo("hybridrl_qwen2.5-7b_lora_recompute_ab.json", *ONE_GPU_7B, "--variants",
                      f"lora64:{LORA64},lora64_ckpt:{LORA64};actor_rollout_ref.model.enable_gradient_checkpointing=true"),
                 trl("trl_qwen2.5-7b_lora64_run2.json", P7, 1, lora=64))),
    Scenario("qwen7b-lora-fused", "7B after the fused LoRA linear, Liger and partial recompute, beside TRL",
             "nvidia-h200", "lora_fused", (
                 workload(P7),
                 profile_update("profile_update_lora_fused_vs_peft.json", "--repeat", "1", "--configs",
                                "lora64:ckpt:32,lora64:ckpt:32:peft"),
                 gpu_tests("gpu_tests.log", T + "test_liger_gpu.py", T + "test_update_sync_gpu.py"),
                 seven_b("lora", "runs12", repeat=2), seven_b("lora", "run3", repeat=1),
                 seven_b("full", "runs12", repeat=2), seven_b("full", "run3"),
                 trl("trl_qwen2.5-7b_lora64.json", P7, 1, lora=64), trl("trl_qwen2.5-7b_lora0.json", P7, 1, lora=0),
                 summarize("summarize_7b.py", "benchmarks/results/qwen2.5-7b_defaults"))),
    Scenario("qwen7b-prefix-grouper", "7B with shared-prompt training forwards, beside TRL", "nvidia-h200",
             "prefix_grouper", (
                 workload(P7),
                 gpu_tests("gpu_tests.log", T + "test_gpu_packing.py"),
                 seven_b("full", "runs12", repeat=2), trl("trl_qwen2.5-7b_lora0.json", P7, 1, lora=0),
                 seven_b("lora", "run1", repeat=1), seven_b("full", "run3"), seven_b("lora", "runs23", repeat=2),
                 seven_b("full_bf16"), trl("trl_qwen2.5-7b_lora64.json", P7, 1, lora=64),
                 summarize("summarize_7b.py", "benchmarks/results/lora_fused"))),
    Scenario("qwen7b-rows-on-host", "7B with rows on the host, the in-GEMM head gradient, one reduction a mini-batch",
             "nvidia-h200", "rows_on_host", (
                 workload(P7),
                 gpu_tests("gpu_tests_part17.log", T + "test_gpu_packing.py", T + "test_update_sync_gpu.py"),
                 *(profile_update(f"profile_update_share_{s}.json", "--n", "8", "--repeat", "1",
                                  "--use-prefix-grouper", s, "--configs", "full:ckpt:32") for s in ("true", "false")),
                 gpu_tests("gpu_tests.log", T + "test_update_sync_gpu.py", T + "test_gpu_packing.py",
                           T + "test_fused_logprob.py"),
                 fused_head(), seven_b("full", "run1"), seven_b("full_bf16", "run1"),
                 seven_b("full_bf16", "run2"), seven_b("full", "run2"))),
    Scenario("qwen7b-bf16-one-rank", "7B full fine-tuning with bf16 masters reduced at one rank, three runs beside "
             "three of TRL", "nvidia-h200", "bf16_one_rank", (
                 workload(P7), fused_head(),
                 gpu_tests("gpu_tests.log", T + "test_fused_logprob.py", T + "test_update_sync_gpu.py"),
                 trl("trl_qwen2.5-7b_lora0_run1.json", P7, 2), seven_b("full_bf16", "run1"),
                 trl("trl_qwen2.5-7b_lora0_run2.json", P7, 2), seven_b("full_bf16", "run2"),
                 seven_b("full_bf16", "run3"), trl("trl_qwen2.5-7b_lora0_run3.json", P7, 2),
                 seven_b("full", "run1"), gpu_tests("gpu_tests_all.log", "tests"), seven_b("lora", "run1"),
                 summarize("summarize_7b.py", "benchmarks/results/prefix_grouper"))),
    Scenario("activation-offload-1.5b", "1.5B at the defaults with and without activation offload in the update",
             "nvidia-h200", "bf16_one_rank", (
                 grpo("hybridrl_qwen2.5-1.5b_activation_offload.json", "--preset", "qwen2.5-1.5b", "--gpus", "1",
                      "--defaults", "--steps", "3", "--variants",
                      "full,offload:actor_rollout_ref.model.enable_activation_offload=true"),)),
    Scenario("profile-update-7b", "where the 7B update's GPU time goes per micro-batch size (update alone, no Ray)",
             "nvidia-h200", None, (
                 profile_update("profile_update_qwen2.5-7b.json", "--repeat", "1", "--configs",
                                "lora64:ckpt:32,lora64:nockpt:4,lora64:nockpt:8,lora64:nockpt:16,full:ckpt:16"),)),
    *(Scenario(f"qwen7b-2gpu-{kind}-repeat", f"7B {label} on two GPUs at the defaults, three runs", "nvidia-h200-x2",
               None, (grpo(f"hybridrl_qwen2.5-7b_2gpu_{kind}.json", "--preset", P7, "--gpus", "2", "--defaults",
                           "--steps", "3", "--repeat", "3", "--variants", variant),))
      for kind, label, variant in (("full", "full fine-tuning", "full"), ("lora", "LoRA r64", f"lora64:{LORA64}"))),
]
