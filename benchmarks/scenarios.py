"""The benchmark scenarios: each name is the commands, with their exact arguments, that produce one record.

`hybridrl bench list` prints them; `hybridrl bench run NAME [--out DIR]` runs one from the repository root and
writes `manifest.json` (commit, device, versions, commands) beside its outputs. The builders and the placeholders
(`{out}`, `{work}`, `{smollm2}`) are in scenario_kit.py; the 7B records in scenarios_7b.py.
"""

from scenario_kit import (
    ADD,
    BF16,
    TWO_GPU_WORKLOAD,
    Cmd,
    Scenario,
    gpu_tests,
    grpo,
    py,
    recipe,
    smollm2_trl,
    summarize,
    trl,
)
from scenarios_7b import SEVEN_B

ARITH = "examples/smollm2_arith/run.sh"
ONE_GPU = ("--gpus", "1", "--defaults")
EARLY = "actor_rollout_ref.actor.early_update"


def long_tail_update(configs: str, out: str, repeat: int = 1, **env: str):
    """benchmarks/profile_update.py on the long-tail 1.5B update (256 rows, mean 1,000 of 4,096 response tokens)."""
    return py("benchmarks/profile_update.py", "--preset", "qwen2.5-1.5b", "--workdir", "{work}/hb", "--rows", "256",
              "--n", "8", "--prompt-len", "256", "--response-len", "4096", "--mean-response-len", "1000", "--repeat",
              str(repeat), "--profile-skip", "2", "--profile-micro", "2", "--configs", configs, "--out",
              "{out}/" + out, **env)


MAKE_ADD = py("examples/smollm2_arith/make_data.py", "--out", ADD, "--train", "3000", "--test", "200", "--seed", "0",
              log="make_data.log", setup=True)
VARLEN_7B = ("--shape", "7B", "--prompts", "16", "--limit", "16384", "--mean-len", "3500", "--at-limit", "0.023",
             "--micro-tokens", "16640")   # the 7B / 16k long tail's micro-batches
SHARE_GPU = "trainer.gpu_memory_gb=16"   # a seed run's plan (13.2 GiB predicted): four share an 80 GB GPU


def trl_long_tail(micro_batch: int, out: str) -> tuple:
    """TRL's first GRPO step on the long-tail 1.5B model and prompts (built and calibrated by long_tail.py)."""
    return (py("benchmarks/long_tail.py", "--preset", "qwen2.5-1.5b", "--response-len", "4096", "--mean-len", "1000",
               "--workdir", "{work}/long_tail", "--calibrate-only", "--out", "{out}/calibration.json"),
            py("benchmarks/trl_grpo.py", "--model", "{work}/long_tail/models/qwen2.5-1.5b-eos1000-r4096",
               "--prompts", "{work}/long_tail/data/prompts_256x256.parquet", "--batch-prompts", "32", "--n", "8",
               "--micro-batch", str(micro_batch), "--max-new-tokens", "4096", "--weights", "bf16",
               "--gradient-checkpointing", "--steps", "0", "--out", "{out}/" + out))

def arith_seed_runs(tag: str, *keys: str) -> tuple:
    """The 20-step SmolLM2 a + b recipe with `keys` over seeds 1-3 (the seeds of smollm2-arith-20-seeds, so each
    curve has its defaults' beside it), each planned for 16 GiB so that they can share a GPU (`bench run --parallel`;
    the committed records ran before, each planned for the whole GPU); `tag` names the files (m_{tag}_seedS.jsonl,
    log_..., run directories)."""
    return tuple(recipe(ARITH, f"m_{tag}_seed{seed}.jsonl", f"log_{tag}_seed{seed}.log",
                        "trainer.total_training_steps=20", f"trainer.seed={seed}", f"data.seed={41 + seed}", *keys,
                        "actor_rollout_ref.rollout.gpu_memory_utilization=0.1", SHARE_GPU,
                        f"trainer.default_local_dir={{work}}/smollm2_{tag}_{seed}", DATA=ADD)
                 for seed in (1, 2, 3))


def partial_arith_runs(tokens: int, tag: str) -> tuple:
    """The 20-step SmolLM2 a + b recipe with partial rollouts of `tokens` new tokens per sample and step, seeds 1-3;
    `tag` names their files (m_partial{tag}_seedS.jsonl, log_..., run directories)."""
    return arith_seed_runs(f"partial{tag}", "actor_rollout_ref.rollout.partial_rollout.enable=true",
                           f"actor_rollout_ref.rollout.partial_rollout.max_new_tokens_per_step={tokens}")


CPU = [
    Scenario("reward-scoring", "one step's 256 samples scored with 1-8 scorer worker processes "
             "(reward_model.scorer_workers), a waiting and a computing scorer, and verl's apps source in the sandbox",
             "cpu", "reward_scoring.json",
             (py("benchmarks/reward_scoring.py", "--samples", "256", "--workers", "1,2,4,8", "--repeat", "3",
                 "--out", "{out}/reward_scoring.json"),)),
    Scenario("memory-model", "the plan's memory prediction per phase beside every measured one-H200 peak",
             "cpu", "memory_model_check", (py("benchmarks/memory_model_check.py", log="predicted.txt"),)),
    Scenario("plan-capacity", "what fits on one H200 per the memory model: hybrid vs scheme A, 0.5B-7B",
             "cpu", "plan_capacity.json",
             (py("benchmarks/plan_capacity.py", "--presets", "qwen2.5-0.5b,qwen2.5-1.5b,qwen2.5-7b",
                 "--response-lens", "1024,4096,16384", "--prompts", "64", "--n", "8", "--prompt-len", "256",
                 "--gpu-memory-gb", "139.8", "--out", "{out}/plan_capacity.json"),)),
    Scenario("moe-plan", "what fits on one H200 for MoE shapes: Qwen3-30B-A3B LoRA with the engine borrowing the "
             "frozen base vs copying it, a 7B-A1B shape fully fine-tuned", "cpu", "moe_plan", tuple(
                 py("benchmarks/plan_capacity.py", "--presets", preset, *(a for kv in sets for a in ("--set", kv)),
                    "--out", f"{{out}}/{name}.json")
                 for name, preset, sets in (
                     ("lora_30b_borrowed", "qwen3-30b-a3b", ("actor_rollout_ref.model.lora_rank=32",)),
                     ("lora_30b_copied", "qwen3-30b-a3b", ("actor_rollout_ref.model.lora_rank=32",
                                                           "actor_rollout_ref.rollout.dtype=float16")),
                     ("full_7b_a1b_bf16_masters", "qwen3-moe-7b-a1b",
                      ("actor_rollout_ref.actor.fsdp_config.model_dtype=bf16",)),
                     ("full_7b_a1b_fp32_masters", "qwen3-moe-7b-a1b", ())))),
    Scenario("logprob-unshard-cpu", "log-prob pass with blocks all-gathered once vs per micro-batch, 2 gloo ranks",
             "cpu", "logprob_unshard_cpu.json",
             (py("benchmarks/logprob_unshard.py", "--tiny", "--device", "cpu", "--ranks", "2", "--rows", "16",
                 "--prompt-len", "64", "--response-len", "64", "--micro", "1,4,16", "--reps", "2",
                 "--out", "{out}/logprob_unshard_cpu.json"),)),
    Scenario("multi-turn-tiny-cpu", "multi-turn rollout with tool calls on a tiny model", "cpu",
             "multi_turn_tiny_cpu.json",
             (py("benchmarks/multi_turn.py", "--model", "tiny", "--device", "cpu", "--prompts", "16", "--n", "4",
                 "--prompt-len", "256", "--turn-len", "32", "--inject", "24", "--turns", "4", "--tool-ms", "50",
                 "--repeats", "3", "--out", "{out}/multi_turn_tiny_cpu.json"),)),
    Scenario("spec-decode-tiny-cpu", "speculative decoding on vs off on a tiny model, greedy (the smoke test)", "cpu",
             None, (py("benchmarks/spec_decode.py", "--tiny", "--num-prompts", "4", "--n", "4", "--prompt-len", "32",
                       "--max-tokens", "48", "--temperature", "0", "--max-running-seqs", "16", "--repeat", "2",
                       "--workdir", "{work}", "--out", "{out}/spec_decode_tiny_cpu.json"),)),
    Scenario("demo-seeds", "`hybridrl train` (the demo) over three seeds: greedy accuracy before/after GRPO",
             "cpu", "demo_seeds.json",
             (py("benchmarks/demo_seeds.py", "--seeds", "0", "1", "2", "--out", "{out}/demo_seeds.json"),)),
]

SMALL = [
    Scenario("vs-trl-0.5b", "0.5B at the defaults (fp32 and bf16 masters) beside TRL (bf16 and fp32 weights)",
             "nvidia-h200", "vs_trl", (
                 grpo("hybridrl_qwen2.5-0.5b.json", "--preset", "qwen2.5-0.5b", *ONE_GPU, "--grad-ckpt", "--steps",
                      "3", "--repeat", "3", "--variants", f"hybrid,hybrid_bf16:{BF16}"),
                 *(trl(f"trl_qwen2.5-0.5b_{w}_{i}.json", "qwen2.5-0.5b", 2, weights=w)
                   for w in ("bf16", "fp32") for i in (1, 2, 3)),
                 summarize("summarize_vs_trl.py"))),
    Scenario("vs-trl-1.5b", "1.5B at the defaults (fp32 masters) beside TRL (bf16 weights)", "nvidia-h200", "vs_trl", (
        grpo("hybridrl_qwen2.5-1.5b.json", "--preset", "qwen2.5-1.5b", *ONE_GPU, "--grad-ckpt", "--steps", "3",
             "--repeat", "3", "--variants", "hybrid"),
        *(trl(f"trl_qwen2.5-1.5b_bf16_{i}.json", "qwen2.5-1.5b", 2) for i in (1, 2)),
        summarize("summarize_vs_trl.py"))),
    Scenario("vs-trl-equal-precision", "1.5B with bf16 masters beside TRL with bf16 weights; a 0.5B bf16-master run",
             "nvidia-h200", "vs_trl/equal_precision", (
                 grpo("hybridrl_qwen2.5-1.5b.json", "--preset", "qwen2.5-1.5b", *ONE_GPU, "--steps", "4", "--repeat",
                      "3", "--variants", f"hybrid_bf16:{BF16}"),
                 *(trl(f"trl_qwen2.5-1.5b_bf16_{i}.json", "qwen2.5-1.5b", 2) for i in (1, 2)),
                 grpo("hybridrl_qwen2.5-0.5b.json", "--preset", "qwen2.5-0.5b", *ONE_GPU, "--steps", "3",
                      "--variants", f"hybrid_bf16:{BF16}"),
                 summarize("summarize_vs_trl.py"))),
    Scenario("memory-model-live", "the bf16-master 1.5B and 0.5B runs the update's memory model is checked on",
             "nvidia-h200", "memory_model_check", tuple(
                 grpo(f"hybridrl_qwen2.5-{size}_bf16.json", "--preset", f"qwen2.5-{size}", *ONE_GPU, "--steps", "3",
                      "--variants", f"hybrid_bf16:{BF16}") for size in ("1.5b", "0.5b"))),
    Scenario("need-kv-scheme-a", "hybrid engine vs scheme A with the KV cache sized to the step, 0.5B and 1.5B",
             "nvidia-h200", "hybrid_vs_schemeA_need_kv", tuple(
                 grpo(f"hybrid_vs_schemeA_qwen2.5-{size}.json", "--preset", f"qwen2.5-{size}", *ONE_GPU,
                      "--grad-ckpt", "--steps", "3", "--variants", "hybrid,schemeA:actor_rollout_ref.hybrid_engine=false")
                 for size in ("0.5b", "1.5b"))),
    Scenario("long-tail-1.5b", "GRPO with long-tailed response lengths (mean 1,000, limit 4,096), 1.5B, three runs",
             "nvidia-h200", "long_tail", (
                 py("benchmarks/long_tail.py", "--preset", "qwen2.5-1.5b", "--response-len", "4096", "--mean-len",
                    "1000", "--workdir", "{work}/long_tail", "--defaults", "--gpus", "1", "--prompts", "32", "--n",
                    "8", "--steps", "3", "--variants", "hybrid", "--repeat", "3", "--out", "{out}/defaults.json"),)),
    Scenario("long-tail-1.5b-early-update", "the long-tail 1.5B with the early update (actor.early_update=auto: on) "
             "beside the same with it off, two runs of each, interleaved", "nvidia-h200", "long_tail", (
                 py("benchmarks/long_tail.py", "--preset", "qwen2.5-1.5b", "--response-len", "4096", "--mean-len",
                    "1000", "--workdir", "{work}/long_tail", "--defaults", "--gpus", "1", "--prompts", "32", "--n",
                    "8", "--steps", "3", "--variants", ",".join([f"hybrid:{EARLY}=auto", f"hybrid_waited:{EARLY}=false"]
                                                                  * 2), "--repeat", "1",
                    "--out", "{out}/early_update.json"),)),
    Scenario("long-tail-1.5b-levers", "the long-tail 1.5B with speculative decoding on (2 runs) and with partial "
             "rollouts of 1,024 new tokens per sample and step (2 runs of 5 steps)", "nvidia-h200", "long_tail", (
                 py("benchmarks/long_tail.py", "--preset", "qwen2.5-1.5b", "--response-len", "4096", "--mean-len",
                    "1000", "--workdir", "{work}/long_tail", "--defaults", "--gpus", "1", "--prompts", "32", "--n",
                    "8", "--steps", "3", "--repeat", "2", "--variants",
                    "hybrid_spec:actor_rollout_ref.rollout.speculative.enable=true",
                    "--out", "{out}/defaults_spec_probe.json"),
                 py("benchmarks/long_tail.py", "--preset", "qwen2.5-1.5b", "--response-len", "4096", "--mean-len",
                    "1000", "--workdir", "{work}/long_tail", "--defaults", "--gpus", "1", "--prompts", "32", "--n",
                    "8", "--steps", "5", "--repeat", "2", "--variants",
                    "hybrid_partial:actor_rollout_ref.rollout.partial_rollout.enable=true;"
                    "actor_rollout_ref.rollout.partial_rollout.max_new_tokens_per_step=1024",
                    "--out", "{out}/partial_rollout.json"))),
    Scenario("fixed-256-1.5b", "the fixed-length 256 + 256 row of §0 (1.5B, 64 x 8) at this tree's defaults, three "
             "runs (hybridrl's side only)", "nvidia-h200", "long_tail", (
                 grpo("fixed_256_256_1.5b.json", "--preset", "qwen2.5-1.5b", *ONE_GPU, "--grad-ckpt", "--steps",
                      "3", "--repeat", "3", "--variants", "hybrid"),)),
    Scenario("cascade-decode", "cascade decode attention (each shared prompt read once per group) against the "
             "per-row kernel, one layer's K/V, 1.5B and 7B heads, prompts of 64-4,096 tokens", "nvidia-h100-x1",
             "cascade_decode", (py("benchmarks/cascade_decode.py", "--out", "{out}/cascade_decode.json"),)),
    Scenario("long-prompt-cascade-1.5b", "GRPO 1.5B, 32 x 8, 2,048-token prompts + 1,024 generated tokens (EOS "
             "ignored), cascade attention off / on (HYBRIDRL_CASCADE), three runs each", "nvidia-h100-x1",
             "cascade_decode", tuple(
                 py("benchmarks/grpo_step.py", "--preset", "qwen2.5-1.5b", "--gpus", "1", "--defaults", "--prompts",
                    "32", "--n", "8", "--prompt-len", "2048", "--response-len", "1024", "--steps", "3", "--variants",
                    "hybrid", "--repeat", "3", "--workdir", "{work}/long_prompt",
                    "--out", f"{{out}}/long_prompt_cascade{c}.json", HYBRIDRL_CASCADE=c) for c in ("0", "1"))),
    Scenario("long-tail-prompt2048-cascade-1.5b", "the long-tail 1.5B workload with 2,048-token prompts (EOS scale "
             "of the 256-token calibration), cascade attention off / on, one run each", "nvidia-h100-x1", "cascade_decode", tuple(
                 py("benchmarks/long_tail.py", "--preset", "qwen2.5-1.5b", "--prompt-len", "2048", "--response-len",
                    "4096", "--mean-len", "1000", "--eos-scale", "4.33313453443048", "--workdir", "{work}/long_tail",
                    "--defaults", "--gpus", "1", "--prompts", "32", "--n", "8", "--steps", "3", "--variants", "hybrid",
                    "--repeat", "1", "--out", f"{{out}}/long_tail_prompt2048_cascade{c}.json", HYBRIDRL_CASCADE=c) for c in ("0", "1"))),
    Scenario("host-step", "the engine's host work per decode step (scheduling, input staging, appending samples) "
             "with the model and sampler stubbed, 64-512 rows, async scheduling on / off", "cpu", "host_step",
             (py("benchmarks/host_step.py", "--out", "{out}/after.json"),)),
    Scenario("decode-floor-1.5b", "decode steps against the bandwidth floor: single-pass vs split kernels vs async",
             "nvidia-h200", "long_tail", (
                 py("benchmarks/decode_floor.py", "--out", "{out}/decode_floor.json"),
                 py("benchmarks/decode_floor.py", "--engine-only", "--out", "{out}/decode_async.json"))),
    Scenario("decode-gemm", "the decode step's GEMMs at 1-256 rows: cuBLAS, TunableOp and a Triton skinny GEMM "
             "against the weight-bytes floor, 1.5B and 7B shapes", "nvidia-h200", "long_tail", (
                 py("benchmarks/decode_gemm.py", "--models", "1.5B,7B", "--rows", "1,8,32,64,256",
                    "--out", "{out}/decode_gemm.json"),)),
    Scenario("decode-pdl", "a decode layer's GEMM chain (28 layers) at 1-64 rows: cuBLAS against Triton skinny GEMMs "
             "without and with programmatic dependent launch, and with L2 prefetch; 1.5B and 7B shapes", "nvidia-h200",
             "long_tail", (
                 py("benchmarks/decode_pdl.py", "--model", "1.5B", "--rows", "1,8,64",
                    "--out", "{out}/decode_pdl_1.5b.json"),
                 py("benchmarks/decode_pdl.py", "--model", "7B", "--rows", "8,64", "--out", "{out}/decode_pdl_7b.json"))),
    Scenario("decode-fused-mlp", "a decode layer's dense MLP (28 layers) at 1-32 rows: cuBLAS gate|up, silu_mul and "
             "cuBLAS down against one Triton kernel plus a reduce (models/fused_mlp.py), tiles swept and checked "
             "first; 1.5B and 7B shapes", "nvidia-h200", "long_tail", (
                 py("benchmarks/decode_fused_mlp.py", "--model", "1.5B", "--rows", "1,4,8,16,32",
                    "--out", "{out}/decode_fused_mlp_1.5b.json"),
                 py("benchmarks/decode_fused_mlp.py", "--model", "7B", "--rows", "1,8,16",
                    "--out", "{out}/decode_fused_mlp_7b.json"))),
    Scenario("decode-fused-qkv", "a decode layer's attention input side (28 layers) at 1-16 rows: add_rmsnorm, "
             "cuBLAS qkv and rope_store_kv against two Triton kernels (norm + qkv partials; reduce + bias + RoPE + "
             "K/V store), tiles swept and checked first; 1.5B and 7B shapes (an experiment, not in the engine: 1.08-1.23x "
             "the unfused time on an H100)",
             "nvidia-h200", "long_tail", (
                 py("benchmarks/decode_fused_qkv.py", "--model", "1.5B", "--rows", "1,4,8,16",
                    "--out", "{out}/decode_fused_qkv_1.5b.json"),
                 py("benchmarks/decode_fused_qkv.py", "--model", "7B", "--rows", "1,8,16",
                    "--out", "{out}/decode_fused_qkv_7b.json"))),
    Scenario("decode-fused-mlp-engine", "the engine's CUDA-graph decode step (1.5B, 1,024-token contexts) at 8-32 rows "
             "with the decode MLP fused (taken up to 32 rows here) and not, with each step's kernels profiled",
             "nvidia-h200", "long_tail",
             tuple(py("benchmarks/profile_decode.py", "--model", "1.5B", "--batch", str(rows), "--prompt-len", "1024",
                      "--new-tokens", "256", "--fused-mlp-max-rows", "32",
                      "--out", f"{{out}}/fused_mlp_e2e/pd_b{rows}_mlp{flag}.json", HYBRIDRL_FUSED_MLP=flag)
                   for rows in (8, 16, 24, 32) for flag in ("1", "0"))),
    Scenario("long-tail-1.5b-fused-mlp", "the long-tail 1.5B at the defaults (the decode MLP fused at <= 16 rows) "
             "beside HYBRIDRL_FUSED_MLP=0, two runs of each, alternating on one machine", "nvidia-h200", "long_tail",
             tuple(py("benchmarks/long_tail.py", "--preset", "qwen2.5-1.5b", "--response-len", "4096", "--mean-len",
                      "1000", "--workdir", "{work}/long_tail", "--defaults", "--gpus", "1", "--prompts", "32", "--n",
                      "8", "--steps", "3", "--variants", "hybrid", "--repeat", "1",
                      "--out", f"{{out}}/fused_mlp_{mode}_{run}.json", HYBRIDRL_FUSED_MLP=flag)
                   for run in (1, 2) for mode, flag in (("on", "1"), ("off", "0")))),
    Scenario("varlen-attention", "the update's packed causal attention (forward + backward, shared prompts) on "
             "long-tailed micro-batches: FlashAttention-2 with grouped K/V heads (HYBRIDRL_GQA=native, the default) "
             "against torch's varlen_attn (K/V repeated before torch 2.13), 1.5B and 7B heads; then the long-tail "
             "1.5B update with each", "nvidia-h200", "long_tail", (
                 py("benchmarks/varlen_attention.py", "--shape", "1.5B", "--out", "{out}/varlen_attention_1.5b.json"),
                 py("benchmarks/varlen_attention.py", *VARLEN_7B, "--out", "{out}/varlen_attention_7b.json"),
                 long_tail_update("full:nockpt:tok32768", "update_gqa_native.json", repeat=3, HYBRIDRL_GQA="native"),
                 long_tail_update("full:nockpt:tok32768", "update_gqa_varlen_attn.json", repeat=3,
                                  HYBRIDRL_GQA="varlen_attn"))),
    Scenario("varlen-attention-fa4", "FlashAttention-4's CuTe kernels (the fa4 extra; Hopper / Blackwell; opt-in: "
             "HYBRIDRL_FLASH=auto or fa4) against FlashAttention-2 on the update's packed attention, 1.5B and 7B heads, "
             "checked against each other first; then the long-tail 1.5B update with each, and the long-tail step "
             "with each", "nvidia-h200", "long_tail", (
                 py("benchmarks/varlen_attention.py", "--shape", "1.5B", "--variants", "fa2,fa4",
                    "--out", "{out}/varlen_fa4_1.5b.json"),
                 py("benchmarks/varlen_attention.py", *VARLEN_7B, "--variants", "fa2,fa4",
                    "--out", "{out}/varlen_fa4_7b.json"),
                 long_tail_update("full:nockpt:tok32768:once", "update_fa4.json", repeat=3, HYBRIDRL_FLASH="fa4"),
                 long_tail_update("full:nockpt:tok32768:once", "update_fa2.json", repeat=3, HYBRIDRL_FLASH="fa2"),
                 *(py("benchmarks/long_tail.py", "--preset", "qwen2.5-1.5b", "--response-len", "4096", "--mean-len",
                      "1000", "--workdir", "{work}/long_tail", "--defaults", "--gpus", "1", "--prompts", "32", "--n",
                      "8", "--steps", "3", "--variants", "hybrid", "--repeat", "3",
                      "--out", f"{{out}}/defaults_{impl}.json", HYBRIDRL_FLASH=impl) for impl in ("fa4", "fa2")))),
    Scenario("update-unshard-once-1.5b", "the long-tail 1.5B update (256 rows, mean 1,000 of 4,096, 16k-token "
             "micro-batches): weights gathered per micro-batch vs once per mini-batch, with 14 or 13 kept layers",
             "nvidia-h200", "long_tail", (
                 long_tail_update("full:keep14:tok16384,full:keep13:tok16384:once,full:keep14:tok16384:once,"
                                  "full:keep14:tok16384", "update_unshard_once.json", repeat=2),)),
    Scenario("long-tail-trl-1.5b", "TRL's GRPOTrainer (HF generate, bf16, gradient checkpointing, micro-batch 8: "
             "TRL's default; it peaked at 33.5 GiB; 32: long-tail-trl-1.5b-mb32) on the long-tail 1.5B model and "
             "prompts (32 x 8, <= 4,096 new tokens): its first step alone, which takes ~6 minutes; compare with "
             "long-tail-1.5b", "nvidia-h200", "long_tail", trl_long_tail(8, "trl_long_tail.json")),
    Scenario("long-tail-trl-1.5b-mb32", "long-tail-trl-1.5b with TRL's micro-batch at 32 x 8 accumulation steps "
             "(peak 38.3 GiB)", "nvidia-h200", "long_tail", trl_long_tail(32, "trl_long_tail_mb32.json")),
    Scenario("long-tail-7b-16k", "GRPO with long-tailed response lengths on a 7B (mean ~4,000, limit 16,384), 16 x 8, "
             "at the defaults (the plan turns on activation and optimizer offload), two steps: the first call builds "
             "and calibrates the model, the second runs it", "nvidia-h200", "long_tail", (
                 py("benchmarks/long_tail.py", "--preset", "qwen2.5-7b", "--response-len", "16384", "--mean-len",
                    "4000", "--calibration-rows", "32", "--workdir", "{work}/long_tail_7b", "--calibrate-only",
                    "--out", "{out}/calibration_7b_16k.json"),
                 py("benchmarks/long_tail.py", "--preset", "qwen2.5-7b", "--response-len", "16384", "--mean-len",
                    "4000", "--calibration-rows", "32", "--workdir", "{work}/long_tail_7b", "--defaults", "--gpus",
                    "1", "--prompts", "16", "--n", "8", "--steps", "2", "--variants", "hybrid", "--repeat", "1",
                    "--out", "{out}/long_tail_7b_16k.json"))),
    Scenario("long-tail-7b-16k-calibrated", "the long-tail-7b-16k run on the model built with its calibrated EOS "
             "scale (calibration_7b_16k_rerun.json: 2.4243), no calibration pass: one run of two steps, ~7 minutes",
             "nvidia-h200", "long_tail", (
                 py("benchmarks/long_tail.py", "--preset", "qwen2.5-7b", "--response-len", "16384", "--mean-len",
                    "4000", "--calibration-rows", "32", "--eos-scale", "2.424346481734104", "--workdir",
                    "{work}/long_tail_7b", "--defaults", "--gpus", "1", "--prompts", "16", "--n", "8", "--steps", "2",
                    "--variants", "hybrid", "--repeat", "1", "--out", "{out}/long_tail_7b_16k_deferred_3.json"),)),
    Scenario("kv-admission-sim", "the 7B / 16k rollout's admission policies on the engine's real scheduler without "
             "a model: sequences capped at what fits at full length vs all at once with preemption, long-tailed "
             "and all-at-the-limit lengths, a bandwidth-floor time model", "cpu", "long_tail", (
                 py("benchmarks/kv_admission_sim.py", "--out", "{out}/kv_admission_sim.json"),)),
    Scenario("optimizer-offload", "AdamW state of the 1.5B and 7B shapes to host memory and back: pinned buffers "
             "kept across offloads vs the previous fresh pageable copies (1.5B only)", "nvidia-h200", "long_tail", (
                 py("benchmarks/optimizer_offload.py", "--presets", "qwen2.5-1.5b,qwen2.5-7b", "--pageable-presets",
                    "qwen2.5-1.5b", "--repeat", "3", "--out", "{out}/optimizer_offload.json"),)),
    Scenario("update-ops-1.5b", "the long-tail 1.5B update: half the layers recomputed at 16k-token micro-batches vs "
             "none at 32k, with the GPU time of each torch op (where the host leaves the GPU idle)",
             "nvidia-h200", "long_tail", (
                 long_tail_update("full:keep14:tok16384:once,full:nockpt:tok32768:once", "update_ops.json"),)),
    Scenario("decode-kernels-1.5b", "launch choices of the decode step's Triton kernels (attention splits and tiles, "
             "SiLU-and-mul, RoPE + K/V store) on the 1.5B's shapes, each layer on its own buffers",
             "nvidia-h200", "long_tail", (
                 py("benchmarks/decode_kernels.py", "--out", "{out}/decode_kernels.json"),)),
    Scenario("long-tail-1.5b-early-update-tail", "the long-tail 1.5B with actor.early_update=true (groups handed to "
             "the update in the rollout's tail), one run", "nvidia-h200", "long_tail", (
                 py("benchmarks/long_tail.py", "--preset", "qwen2.5-1.5b", "--response-len", "4096", "--mean-len",
                    "1000", "--workdir", "{work}/long_tail", "--defaults", "--gpus", "1", "--prompts", "32", "--n",
                    "8", "--steps", "3", "--variants", f"hybrid_early:{EARLY}=true", "--repeat", "1",
                    "--out", "{out}/early_update_tail.json"),)),
    Scenario("fused-head-1.5b", "the update's log-prob head at 16k rows of the 1.5B (vocab 151,936): torch path vs "
             "Triton kernels, each checked against plain PyTorch first", "nvidia-h200", "long_tail", (
                 py("benchmarks/fused_head.py", "--rows", "16384", "--hidden", "1536", "--vocab", "151936",
                    "--out", "{out}/fused_head_triton.json"),
                 gpu_tests("gpu_tests_triton_head.log", "tests/training/test_triton_logprob.py",
                           "tests/training/test_fused_logprob.py", "tests/training/test_update_sync_gpu.py"))),
    Scenario("spec-decode", "speculative decoding on vs off: the long-tail 1.5B (32 x 8, <= 4,096), SmolLM2 on a + b "
             "(64 x 8, the recipe's sampling); then its GPU tests", "nvidia-h200", None, (
                 py("benchmarks/spec_decode.py", "--long-tail", "--preset", "qwen2.5-1.5b", "--response-len", "4096",
                    "--mean-len", "1000", "--num-prompts", "32", "--n", "8", "--workdir", "{work}",
                    "--out", "{out}/spec_decode_long_tail_1.5b.json"),
                 MAKE_ADD,
                 py("benchmarks/spec_decode.py", "--model", "{smollm2}", "--prompts", f"{ADD}/train.parquet",
                    "--num-prompts", "64", "--n", "8", "--prompt-len", "128", "--max-tokens", "128",
                    "--temperature", "0.8", "--out", "{out}/spec_decode_smollm2_arith.json"),
                 gpu_tests("gpu_tests.log", "tests/rollout/test_rollout_gpu.py"))),
    Scenario("spec-decode-greedy-1.5b", "speculation where a decode step is GPU-bound: a random-weight Qwen2.5-1.5B "
             "decoding greedily, 16 sequences x 1,024 tokens (all within the speculation threshold), off vs on",
             "nvidia-h200", "long_tail", (
                 Cmd(("python", "-m", "hybridrl.cli", "assets", "tiny-model", "{work}/spec_greedy_1.5b", "--size",
                      "qwen2.5-1.5b")),
                 py("benchmarks/spec_decode.py", "--model", "{work}/spec_greedy_1.5b", "--num-prompts", "16", "--n", "1",
                    "--max-tokens", "1024", "--temperature", "0", "--repeat", "3", "--workdir", "{work}/sg",
                    "--out", "{out}/spec_decode_greedy_1.5b.json"))),
    Scenario("smollm2-long-spec", "a real model's long tail: SmolLM2 on a + b with responses up to 1,024 tokens, GRPO "
             "at the recipe's settings for 20 steps with speculation off, then on (same seed); then the rollout alone, "
             "off vs on, three seeds", "nvidia-h200", "long_tail/smollm2_long_spec", (
                 MAKE_ADD,
                 *(recipe(ARITH, f"metrics_spec_{name}.jsonl", f"run_spec_{name}.log", "trainer.total_training_steps=20",
                          "data.max_response_length=1024", f"trainer.default_local_dir={{work}}/smollm2_long_{name}",
                          f"actor_rollout_ref.rollout.speculative.enable={flag}", DATA=ADD)
                   for name, flag in (("off", "false"), ("on", "true"))),
                 py("benchmarks/spec_decode.py", "--model", "{smollm2}", "--prompts", f"{ADD}/train.parquet",
                    "--num-prompts", "64", "--n", "8", "--max-tokens", "1024", "--temperature", "0.8", "--repeat", "3",
                    "--out", "{out}/spec_decode_smollm2_long.json"))),
    # the GPU side of multi-turn-tiny-cpu (benchmarks/multi_turn.py's defaults: random-weight 0.5B shape, 64 x 4
    # prompts of 512 tokens, 4 turns of 64 tokens, 48-token tool messages after 50 ms)
    Scenario("multi-turn-0.5b", "multi-turn rollout: continuing on the cached KV vs re-prefilling every turn vs "
             "single-turn at the same token budget, 0.5B shape on one GPU", "nvidia-h200", "multi_turn_gpu",
             (py("benchmarks/multi_turn.py", "--device", "cuda", "--out", "{out}/multi_turn.json"),
              gpu_tests("gpu_tests_prefill_varlen.log", "tests/rollout/test_prefill_varlen.py",
                        "tests/rollout/test_rollout_gpu.py"))),
    Scenario("moe-experts", "MoE experts of a Qwen3-30B-A3B layer: CUDA-graph safety, engine tokens with graphs, "
             "grouped GEMMs vs HF's grouped_mm and per-expert loop", "nvidia-h200", "moe_experts",
             (py("benchmarks/moe_experts.py", "--out", "{out}/moe_experts.json", log="moe_experts.log"),)),
    # MoE GRPO on one GPU (each writes its random-weight model under {work}: 57 GiB for the 30B-A3B shape, so run
    # them on separate machines or remove {work}/models between them)
    Scenario("moe-grpo-30b-lora", "Qwen3-30B-A3B shape with LoRA r32 on one GPU, the engine borrowing the frozen "
             "base: step, phases, predicted vs measured peaks", "nvidia-h200", "moe_grpo",
             (grpo("grpo_qwen3-30b-a3b_lora32.json", "--preset", "qwen3-30b-a3b", *ONE_GPU, "--prompts", "32",
                   "--steps", "3", "--variants", "lora32:actor_rollout_ref.model.lora_rank=32"),)),
    Scenario("moe-trl-30b-lora", "the moe-grpo-30b-lora step beside TRL's GRPOTrainer with peft LoRA r32 on the same "
             "attention projections, same model, prompts and lengths; TRL's first step only (~3 minutes)",
             "nvidia-h200", "moe_grpo/30b_a3b_lora32_vs_trl", (
                 grpo("grpo_qwen3-30b-a3b_lora32.json", "--preset", "qwen3-30b-a3b", *ONE_GPU, "--prompts", "32",
                      "--steps", "3", "--variants", "lora32:actor_rollout_ref.model.lora_rank=32"),
                 trl("trl_qwen3-30b-a3b_lora32.json", "qwen3-30b-a3b", 0, lora=32, prompts=32,
                     extra=("--lora-targets", "q_proj,k_proj,v_proj,o_proj", "--micro-batch", "16")))),
    # the same model directory as moe-grpo-30b-lora ({work}/models/qwen3-30b-a3b): one 57 GiB copy on the disk
    Scenario("update-ops-moe-30b", "where the Qwen3-30B-A3B LoRA r32 update's GPU time goes (experts' grouped GEMMs, "
             "routing and token permutation, attention, other), 32 x 8 rows of 256 + 256, the first 24 of 48 layers "
             "recomputed at 16k- and 8k-token micro-batches (no recompute would not fit: the plan predicts 183.5 "
             "GiB at 16k)", "nvidia-h200", "moe_grpo", (
                 py("benchmarks/profile_update.py", "--preset", "qwen3-30b-a3b", "--workdir", "{work}", "--rows",
                    "256", "--n", "8", "--prompt-len", "256", "--response-len", "256", "--repeat", "2",
                    "--profile-skip", "1", "--profile-micro", "2", "--configs",
                    "lora32:keep24:tok16384,lora32:keep24:tok8192", "--out", "{out}/update_ops_moe_30b.json"),)),
    Scenario("update-moe-experts-30b", "the Qwen3-30B-A3B LoRA r32 update with hybridrl's experts forward "
             "(training/moe_experts.py) vs transformers' grouped_mm, same model, three timed updates each, then "
             "their GPU tests", "nvidia-h200", "moe_grpo/experts_forward", (
                 *(py("benchmarks/profile_update.py", "--preset", "qwen3-30b-a3b", "--workdir", "{work}", "--rows",
                      "256", "--n", "8", "--prompt-len", "256", "--response-len", "256", "--repeat", "3",
                      "--profile-skip", "1", "--profile-micro", "2", "--configs", "lora32:keep24:tok16384", *extra,
                      "--out", f"{{out}}/update_ops_moe_30b_experts_{name}.json")
                   for name, extra in (("hybridrl", ()), ("grouped_mm", ("--experts-implementation", "grouped_mm")))),
                 gpu_tests("gpu_tests_moe_experts.log", "tests/training/test_moe_experts.py"))),
    Scenario("moe-trl-7b-a1b", "the Qwen3-MoE 7B-A1B shape fully fine-tuned at the defaults (two runs), then TRL's "
             "GRPOTrainer on the same model and prompts (full, bf16, micro-batch 32 x 16 accumulation steps), its "
             "first step (~2.5 minutes)", "nvidia-h200", "moe_grpo/experts_forward", (
                 grpo("grpo_qwen3-moe-7b-a1b_experts.json", "--preset", "qwen3-moe-7b-a1b", *ONE_GPU, "--steps", "3",
                      "--repeat", "2", "--variants", "defaults"),
                 trl("trl_qwen3-moe-7b-a1b.json", "qwen3-moe-7b-a1b", 0, extra=("--micro-batch", "32")))),
    Scenario("moe-grpo-7b-a1b", "Qwen3-MoE 7B-A1B shape, full fine-tuning on one GPU with bf16 masters (the engine "
             "borrows its whole tensors) and fp32 masters (it copies), one run each", "nvidia-h200", "moe_grpo",
             (grpo("grpo_qwen3-moe-7b-a1b.json", "--preset", "qwen3-moe-7b-a1b", *ONE_GPU, "--steps", "3",
                   "--repeat", "1", "--variants", f"bf16_masters:{BF16},fp32_masters"),)),
    Scenario("rollout-vs-hf", "the rollout engine vs HF generate, n=1 and n=8 with shared prompts, 0.5B-7B",
             "nvidia-h200", "rollout.json", (
                 py("benchmarks/rollout.py", "--models", "7B,0.5B,1.5B", "--ab-unfused", "7B,0.5B",
                    "--out", "{out}/rollout.json"),)),
    Scenario("profile-decode-7b", "where a 7B decode step goes (torch.profiler), batch 256", "nvidia-h200",
             "profile_decode.json", (py("benchmarks/profile_decode.py", "--out", "{out}/profile_decode.json"),)),
    Scenario("rollout-async", "rollout with async scheduling vs without, 0.5B and 7B; then the GPU tests",
             "nvidia-h200", None, (
                 py("benchmarks/rollout.py", "--models", "0.5B,7B", "--skip-hf", "--ab-async", "0.5B,7B",
                    "--out", "{out}/rollout_async.json"),
                 gpu_tests("gpu_tests.log", "tests"))),
]

TP2 = (*TWO_GPU_WORKLOAD, "--tp", "2")
LP = "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"
UTIL07 = "actor_rollout_ref.rollout.gpu_memory_utilization=0.7"
TWO_GPUS = [
    Scenario("scheme-a-1.5b-2gpu", "1.5B hybrid vs scheme A at gpu_memory_utilization 0.5; rollout TP 1; offload",
             "nvidia-h200-x2", "grpo_qwen2.5-1.5b.json", (
                 grpo("grpo_qwen2.5-1.5b.json", "--preset", "qwen2.5-1.5b", *TP2, "--steps", "3", "--micro", "8",
                      "--logprob-micro", "16", "--variants",
                      "hybrid,scheme_a,hybrid_tp1:actor_rollout_ref.rollout.tensor_model_parallel_size=1,"
                      "hybrid_offload:actor_rollout_ref.actor.fsdp_config.param_offload=true;"
                      "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true"),)),
    *(Scenario(f"scheme-a-{tag}-2gpu", f"{label} hybrid vs scheme A at gpu_memory_utilization 0.5", "nvidia-h200-x2",
               f"grpo_{preset}.json", (
                   grpo(f"grpo_{preset}.json", "--preset", preset, *TP2, "--steps", "3", "--micro", "4",
                        "--logprob-micro", "16", "--grad-ckpt", "--variants", "hybrid,scheme_a"),))
      for tag, label, preset in (("7b", "Qwen2.5-7B", "qwen2.5-7b"), ("llama3-8b", "Llama-3-8B", "llama3-8b"))),
    Scenario("scheme-a-7b-util07", "7B at gpu_memory_utilization 0.7: scheme A runs out of memory, hybrid runs",
             "nvidia-h200-x2", "grpo_qwen2.5-7b_util07.json", (
                 grpo("grpo_qwen2.5-7b_util07.json", "--preset", "qwen2.5-7b", *TP2, "--steps", "2", "--micro", "4",
                      "--logprob-micro", "16", "--grad-ckpt", "--variants",
                      f"scheme_a_util07:actor_rollout_ref.hybrid_engine=false;{UTIL07},"
                      f"hybrid_util07:actor_rollout_ref.hybrid_engine=true;{UTIL07}"),)),
    Scenario("stability-7b-util07", "20 steps of the hybrid engine at gpu_memory_utilization 0.7, 7B, 16 × 8",
             "nvidia-h200-x2", "grpo_qwen2.5-7b_stability.log", (
                 grpo("grpo_qwen2.5-7b_20steps.json", "--preset", "qwen2.5-7b", "--prompts", "16",
                      *TWO_GPU_WORKLOAD[2:], "--tp", "2", "--steps", "20", "--micro", "4", "--logprob-micro", "16",
                      "--grad-ckpt", "--variants", f"hybrid_util07:{UTIL07}"),)),
    Scenario("logprob-micro-1.5b-2gpu", "old-log-prob micro-batch 1/4/8/16, 1.5B, rollout TP 1", "nvidia-h200-x2",
             "grpo_qwen2.5-1.5b_logprob_micro_full.json", (
                 grpo("grpo_qwen2.5-1.5b_logprob_micro_full.json", "--preset", "qwen2.5-1.5b", *TWO_GPU_WORKLOAD,
                      "--tp", "1", "--steps", "3", "--micro", "8", "--variants",
                      ",".join(f"lp{m}:{LP}={m}" for m in (1, 4, 8, 16))),)),
    Scenario("logprob-unshard-1.5b-2gpu", "log-prob pass with blocks all-gathered once, 1.5B on two GPUs",
             "nvidia-h200-x2", None, (
                 py("benchmarks/logprob_unshard.py", "--preset", "qwen2.5-1.5b", "--ranks", "2", "--rows", "64",
                    "--micro", "1,4,16", "--out", "{out}/logprob_unshard_qwen2.5-1.5b.json"),)),
    Scenario("packing-ulysses-1.5b-2gpu", "padded vs packed training forwards, and Ulysses sp=2, 1024-token responses",
             "nvidia-h200-x2", None, (
                 grpo("grpo_qwen2.5-1.5b_packing_ulysses.json", "--preset", "qwen2.5-1.5b", "--prompts", "32", "--n",
                      "8", "--prompt-len", "256", "--response-len", "1024", "--gpus", "2", "--tp", "1", "--steps", "3",
                      "--micro", "4", "--logprob-micro", "8", "--variants",
                      "padded,packed:actor_rollout_ref.model.use_remove_padding=true,packed_sp2:"
                      "actor_rollout_ref.model.use_remove_padding=true;"
                      "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"),)),
    Scenario("smoke-2gpu", "one tiny-model GRPO step through the hybrid engine on two GPUs (not a record)",
             "nvidia-h200-x2", None, (
                 Cmd(("python", "-m", "hybridrl.cli", "assets", "tiny-model", "{work}/tiny", "--layers", "2",
                      "--hidden", "64"), log="tiny_model.log"),
                 grpo("smoke.json", "--preset", "dir:{work}/tiny", "--gpus", "2", "--tp", "2", "--prompts", "8", "--n",
                      "4", "--prompt-len", "32", "--response-len", "16", "--steps", "2", "--micro", "4",
                      "--logprob-micro", "8", "--variants", "hybrid"))),
]

ARITH_60 = ("trainer.total_training_steps=60", "trainer.default_local_dir={work}/smollm2_run")
SMOLLM2 = [
    Scenario("smollm2-vs-trl", "SmolLM2-135M learns a + b: hybridrl's curve and TRL's, LoRA r32, TRL's peak",
             "nvidia-h200", "smollm2_vs_trl", (
                 MAKE_ADD,
                 recipe(ARITH, "hybridrl_metrics.jsonl", "hybridrl_run.log", *ARITH_60, DATA=ADD),
                 smollm2_trl("trl.json", "trl_curve.log", "--val-prompts", f"{ADD}/test.parquet", "--val-every", "12",
                             "--steps", "24", "--val-temperature", "0.8"),
                 smollm2_trl("trl_mem.json", "trl_mem.log", "--steps", "4"),
                 recipe(ARITH, "hybridrl_lora_metrics.jsonl", "hybridrl_lora_run.log",
                        "trainer.total_training_steps=40", "actor_rollout_ref.model.lora_rank=32",
                        "actor_rollout_ref.model.lora_alpha=64", "actor_rollout_ref.actor.optim.lr=1e-4", DATA=ADD),
                 summarize("summarize_smollm2.py"))),
    Scenario("smollm2-arith", "SmolLM2-135M learns a + b at today's defaults (hybridrl's side alone)", "nvidia-h200",
             "rows_on_host/smollm2", (recipe(ARITH, "hybridrl_metrics.jsonl", "hybridrl_run.log", *ARITH_60,
                                             DATA=ADD),)),
    Scenario("smollm2-arith-20", "SmolLM2-135M learns a + b at today's defaults, 20 steps (the check of the defaults)",
             "nvidia-h200", "smollm2_defaults", (recipe(ARITH, "metrics.jsonl", "smollm2.log",
                                                         "trainer.total_training_steps=20",
                                                         "trainer.default_local_dir={work}/smollm2_run", DATA=ADD),)),
    Scenario("smollm2-arith-20-seeds", "the 20-step check over three seeds, Triton log-prob head on and off "
             "(HYBRIDRL_FUSED=0)", "nvidia-h200", "smollm2_defaults/seeds", tuple(
                 recipe(ARITH, f"m_fused{fused}_seed{seed}.jsonl", f"log_fused{fused}_seed{seed}.log",
                        "trainer.total_training_steps=20", f"trainer.seed={seed}", f"data.seed={41 + seed}",
                        "actor_rollout_ref.rollout.gpu_memory_utilization=0.1",
                        f"trainer.default_local_dir={{work}}/smollm2_run_{fused}_{seed}", DATA=ADD,
                        HYBRIDRL_FUSED=str(fused))
                 for seed in (1, 2, 3) for fused in (1, 0))),
    Scenario("smollm2-gsm8k", "SmolLM2-135M on GSM8K-format word problems, strict scorer", "nvidia-h200",
             "smollm2_gsm8k", (recipe("examples/smollm2_gsm8k/run.sh", "hybridrl_metrics.jsonl", "hybridrl_run.log",
                                      "trainer.total_training_steps=60", DATA="{work}/smollm2_gsm8k"),)),
    Scenario("smollm2-reward-model", "GRPO on SmolLM2 driven by a reward model trained on its own answers",
             "nvidia-h200", "smollm2_reward_model", (
                 MAKE_ADD,
                 recipe("examples/smollm2_reward_model/run.sh", "smollm2_rm_metrics.jsonl", "rm_run.log",
                        "trainer.total_training_steps=40", DATA=ADD, RM="{work}/smollm2_rm"),
                 Cmd(("cp", "{work}/smollm2_rm/rm_eval.json", "{out}/rm_eval.json")),
                 summarize("summarize_reward_model.py", "benchmarks/results/smollm2_vs_trl/hybridrl_metrics.jsonl"))),
    Scenario("smollm2-tools", "SmolLM2 learns to call a calculator: SFT warm-up, then 20 multi-turn GRPO steps",
             "nvidia-h200", "smollm2_tools", (
                 recipe("examples/smollm2_tools/run.sh", "smollm2_tools_metrics.jsonl", "smollm2_tools.log",
                        "trainer.total_training_steps=20", "trainer.test_freq=5", DATA="{work}/smollm2_bignum",
                        SFT="{work}/smollm2_tools_sft"),
                 summarize("summarize_tools.py"))),
    Scenario("smollm2-interaction", "SmolLM2 learns a + b with a simulated user's feedback and up to two retries "
             "(verl's interactions): 20 multi-turn GRPO steps", "nvidia-h200", "smollm2_interaction", (
                 recipe("examples/smollm2_interaction/run.sh", "metrics.jsonl", "smollm2_interaction.log",
                        "trainer.total_training_steps=20", "trainer.default_local_dir={work}/smollm2_interaction_run",
                        DATA="{work}/smollm2_add_interaction"),)),
    Scenario("smollm2-arith-20-early-update", "the 20-step a + b check with the early update on (seed 1; the other "
             "seeds not run)", "nvidia-h200", "smollm2_defaults/early_update", (MAKE_ADD, recipe(
                 ARITH, "m_early_seed1.jsonl", "log_early_seed1.log", "trainer.total_training_steps=20",
                 "trainer.seed=1", "data.seed=42", f"{EARLY}=true",
                 "actor_rollout_ref.rollout.gpu_memory_utilization=0.1",
                 "trainer.default_local_dir={work}/smollm2_early_1", DATA=ADD))),
    Scenario("smollm2-arith-20-partial", "the 20-step a + b check with partial rollouts (64 new tokens per sample "
             "per step), three seeds", "nvidia-h200", "smollm2_defaults/partial_rollout",
             (MAKE_ADD, *partial_arith_runs(64, "")), parallel=True),
    Scenario("smollm2-arith-20-partial-tail", "the 20-step a + b check with partial rollouts whose budget cuts only "
             "the tail (96 of the 128 new tokens per sample per step; responses average ~55), three seeds",
             "nvidia-h200", "smollm2_defaults/partial_rollout", (MAKE_ADD, *partial_arith_runs(96, "96")),
             parallel=True),
    Scenario("smollm2-arith-20-algorithms", "the 20-step a + b check, three seeds each, with verl's bypass mode "
             "(ppo_clip, and reinforce with token IS), the optimal token baseline, and PF-PPO on GAE beside GAE alone",
             "nvidia-h200", "smollm2_defaults/algorithms", (
                 MAKE_ADD,
                 *arith_seed_runs("bypass_clip", "algorithm.rollout_correction.bypass_mode=true"),
                 *arith_seed_runs("bypass_reinforce", "algorithm.rollout_correction.bypass_mode=true",
                                  "algorithm.rollout_correction.loss_type=reinforce",
                                  "algorithm.rollout_correction.rollout_is=token"),
                 *arith_seed_runs("otb", "algorithm.adv_estimator=optimal_token_baseline",
                                  "actor_rollout_ref.actor.calculate_sum_pi_squared=true"),
                 *arith_seed_runs("pf_ppo", "algorithm.adv_estimator=gae", "algorithm.use_pf_ppo=true"),
                 *arith_seed_runs("gae", "algorithm.adv_estimator=gae")), parallel=True),   # PF-PPO's own baseline
]


SCENARIOS: dict[str, Scenario] = {s.name: s for s in CPU + SMALL + SEVEN_B + TWO_GPUS + SMOLLM2}
