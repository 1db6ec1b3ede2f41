#!/usr/bin/env bash
# The GPU benchmark suite as run through the device tool (2 × H200). Usage: benchmarks/gpu_suite.sh PART OUTDIR
#   part 1: CUDA smoke (tiny model, 1 step) + Qwen2.5-1.5B: hybrid vs scheme A, TP sweep, offload
#   part 2: Qwen2.5-7B: hybrid vs scheme A
#   part 12: SmolLM2 GRPO driven by a trained reward model (docs/benchmarks.md §0e)
#   part 13: SmolLM2 learns to call a calculator: SFT on tool-call traces, then multi-turn GRPO
#   part 14 (not yet run as a whole): where the 7B actor update's GPU time goes per micro-batch size (profile_update.py,
#           one GPU; its LoRA fused-vs-peft pair ran in benchmarks/results/lora_fused/call1_profile.sh)
#   part 17: shared-prompt forwards' GPU tests, and the 7B full update alone with / without them (ran as
#           benchmarks/results/rows_on_host/call1.sh)
#   (7B full fine-tuning, both master precisions, three runs beside TRL in one session: ran as
#           benchmarks/results/bf16_one_rank/call{1,2,3}.sh)
#   parts 15, 16 (not yet run; need nvidia-h200-x2): 7B full fine-tuning (15) and LoRA r64 (16) on two GPUs at the
#           defaults, three runs each (issue 14's repeats, with Liger and partial recompute); one device call each
#   parts 9-11: 7B on one GPU (full and LoRA) vs TRL bf16 / TRL+peft; 7B on two GPUs; SmolLM2 TRL curve, LoRA, gsm8k
#   part 3 (not yet run): Llama-3-8B shape hybrid vs scheme A; log-prob micro-batch sweep 1/4/8/16 in one run;
#           20-step stability of the hybrid engine at gpu_memory_utilization 0.7 (where scheme A OOMs)
set -uo pipefail
part=$1; out=$2
export PYTHONUNBUFFERED=1 RAY_DEDUP_LOGS=0 TOKENIZERS_PARALLELISM=false
common="--prompts 64 --n 8 --prompt-len 256 --response-len 256 --gpus 2 --tp 2"
if [ "$part" = 1 ]; then
  python -m hybridrl.cli assets tiny-model /tmp/tiny --layers 2 --hidden 64 >/dev/null &&
  python benchmarks/grpo_step.py --preset dir:/tmp/tiny --gpus 2 --tp 2 --prompts 8 --n 4 --prompt-len 32 \
      --response-len 16 --steps 2 --micro 4 --logprob-micro 8 --variants hybrid --out "$out/smoke.json" || exit 1
  python benchmarks/grpo_step.py --preset qwen2.5-1.5b $common --steps 3 --micro 8 --logprob-micro 16 \
      --variants "hybrid,scheme_a,hybrid_tp1:actor_rollout_ref.rollout.tensor_model_parallel_size=1,hybrid_offload:actor_rollout_ref.actor.fsdp_config.param_offload=true;actor_rollout_ref.actor.fsdp_config.optimizer_offload=true" \
      --out "$out/grpo_qwen2.5-1.5b.json"
elif [ "$part" = 2 ]; then
  python benchmarks/grpo_step.py --preset qwen2.5-7b $common --steps 3 --micro 4 --logprob-micro 16 --grad-ckpt \
      --variants hybrid,scheme_a --out "$out/grpo_qwen2.5-7b.json"
elif [ "$part" = 3 ]; then
  lp=actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu
  python benchmarks/grpo_step.py --preset qwen2.5-1.5b $common --tp 1 --steps 3 --micro 8 \
      --variants "lp1:$lp=1,lp4:$lp=4,lp8:$lp=8,lp16:$lp=16" --out "$out/grpo_qwen2.5-1.5b_logprob_micro_full.json"
elif [ "$part" = 4 ]; then
  python benchmarks/grpo_step.py --preset llama3-8b $common --steps 3 --micro 4 --logprob-micro 16 --grad-ckpt \
      --variants hybrid,scheme_a --out "$out/grpo_llama3-8b.json"
elif [ "$part" = 5 ]; then
  # 20 steps at a quarter of part 2's batch (16x8) so that the run fits one device call; the per-step metrics
  # (metrics.jsonl, trainer.logger=file) are copied to OUTDIR even when the call is cut short
  timeout 300 python benchmarks/grpo_step.py --preset qwen2.5-7b ${common/--prompts 64/--prompts 16} --steps 20 \
      --micro 4 --logprob-micro 16 --grad-ckpt --workdir /tmp/bench5 \
      --variants "hybrid_util07:actor_rollout_ref.rollout.gpu_memory_utilization=0.7" \
      --out "$out/grpo_qwen2.5-7b_20steps.json"
  cp /tmp/bench5/runs/hybrid_util07/logs/metrics.jsonl "$out/grpo_qwen2.5-7b_20steps_metrics.jsonl"
elif [ "$part" = 6 ]; then
  python benchmarks/logprob_unshard.py --preset qwen2.5-1.5b --ranks 2 --rows 64 --micro 1,4,16 \
      --out "$out/logprob_unshard_qwen2.5-1.5b.json"
  for size in 0.5b 1.5b; do
    timeout 200 python benchmarks/grpo_step.py --preset qwen2.5-$size --prompts 64 --n 8 --prompt-len 256 \
        --response-len 256 --gpus 1 --tp 1 --steps 3 --micro 8 --logprob-micro 16 --variants hybrid \
        --out "$out/grpo_qwen2.5-${size}_1gpu.json"
  done
elif [ "$part" = 7 ]; then
  pk="actor_rollout_ref.model.use_remove_padding=true"
  python benchmarks/grpo_step.py --preset qwen2.5-1.5b --prompts 32 --n 8 --prompt-len 256 --response-len 1024 \
      --gpus 2 --tp 1 --steps 3 --micro 4 --logprob-micro 8 \
      --variants "padded,packed:$pk,packed_sp2:$pk;actor_rollout_ref.actor.ulysses_sequence_parallel_size=2" \
      --out "$out/grpo_qwen2.5-1.5b_packing_ulysses.json"
elif [ "$part" = 9 ]; then
  # Qwen2.5-7B shape on ONE GPU each (docs/benchmarks.md 0d): GPU 0 hybridrl at the defaults, full fine-tuning then
  # LoRA r64; GPU 1 TRL bf16 then TRL + peft r64, same model, prompts and workload
  M=/tmp/b7/models/qwen2.5-7b
  [ -f $M/config.json ] || python -c "from hybridrl.assets.tiny_model import write_size_preset as w; w('$M', 'qwen2.5-7b', weights=True)"
  ls /tmp/b7/data/prompts_*x256.parquet >/dev/null 2>&1 || python -c "from pathlib import Path; import sys; sys.path.insert(0, 'benchmarks'); from grpo_step import make_prompts as m; m(Path('/tmp/b7/data'), Path('$M'), 256, 256)"
  (CUDA_VISIBLE_DEVICES=0 timeout 500 python benchmarks/grpo_step.py --preset qwen2.5-7b --gpus 1 --defaults --grad-ckpt \
      --steps 3 --workdir /tmp/b7 --out "$out/hybridrl_qwen2.5-7b_1gpu.json" \
      --variants "full,lora64:actor_rollout_ref.model.lora_rank=64;actor_rollout_ref.model.lora_alpha=128") &
  (export CUDA_VISIBLE_DEVICES=1
   for lora in 0 64; do
     timeout 250 python benchmarks/trl_grpo.py --model $M --prompts "$(ls /tmp/b7/data/prompts_*x256.parquet | head -1)" \
       --steps 2 --batch-prompts 64 --n 8 --max-prompt-len 256 --max-new-tokens 256 --weights bf16 --reward last_int \
       --gradient-checkpointing --ignore-eos --lora-rank $lora --lora-alpha 128 --out "$out/trl_qwen2.5-7b_lora$lora.json"
   done) &
  wait
elif [ "$part" = 10 ]; then
  # the same 7B workload on TWO GPUs at the defaults (after part 9 on the same machine: weights and prompts exist)
  timeout 590 python benchmarks/grpo_step.py --preset qwen2.5-7b --gpus 2 --defaults --grad-ckpt --steps 3 \
      --workdir /tmp/b7 --variants full --out "$out/hybridrl_qwen2.5-7b_2gpu_full.json"
elif [ "$part" = 11 ]; then
  # the real model (MODEL=/tmp/smollm2 converted first; see ../shared/tools/real-model): GPU 0 TRL's a + b curve to
  # step 24 (docs/benchmarks.md 0b, run 2); GPU 1 hybridrl's LoRA curve on the same task, then the GSM8K task (0c)
  D=/tmp/smollm2_add
  [ -f $D/train.parquet ] || python examples/smollm2_arith/make_data.py --out $D --train 3000 --test 200 --seed 0
  (CUDA_VISIBLE_DEVICES=0 timeout 585 python benchmarks/trl_grpo.py --model /tmp/smollm2 --prompts $D/train.parquet \
     --val-prompts $D/test.parquet --val-every 12 --steps 24 --batch-prompts 64 --n 8 --micro-batch 8 \
     --max-prompt-len 128 --max-new-tokens 128 --lr 1e-5 --temperature 0.8 --val-temperature 0.8 --weights fp32 \
     --gradient-checkpointing --reward last_int --out "$out/trl.json" > "$out/trl_curve.log" 2>&1) &
  (export CUDA_VISIBLE_DEVICES=1
   VERL_FILE_LOGGER_PATH=$out/hybridrl_lora_metrics.jsonl MODEL=/tmp/smollm2 DATA=$D timeout 200 \
     bash examples/smollm2_arith/run.sh trainer.total_training_steps=40 actor_rollout_ref.model.lora_rank=32 \
     actor_rollout_ref.model.lora_alpha=64 actor_rollout_ref.actor.optim.lr=1e-4
   VERL_FILE_LOGGER_PATH=$out/smollm2_gsm8k_metrics.jsonl MODEL=/tmp/smollm2 DATA=/tmp/smollm2_gsm8k timeout 330 \
     bash examples/smollm2_gsm8k/run.sh trainer.total_training_steps=60) &
  wait
elif [ "$part" = 12 ]; then
  # a reward model trained on the policy's own a + b answers drives GRPO on SmolLM2
  # (examples/smollm2_reward_model; MODEL=/tmp/smollm2 converted first); val-core acc is still the rule
  VERL_FILE_LOGGER_PATH=$out/smollm2_rm_metrics.jsonl MODEL=/tmp/smollm2 DATA=/tmp/smollm2_add RM=/tmp/smollm2_rm \
      timeout 580 bash examples/smollm2_reward_model/run.sh trainer.total_training_steps=40
elif [ "$part" = 13 ]; then
  # examples/smollm2_tools (docs/benchmarks.md §0f): tool template + SFT warm-up + 20 multi-turn GRPO steps with the
  # calculator (MODEL=/tmp/smollm2 converted first); validation before training and every 5 steps reports
  # val-core/bignum/acc/mean@1 and val-aux/multi_turn/tool_use_rate; the SFT's metrics are in the log
  VERL_FILE_LOGGER_PATH=$out/smollm2_tools_metrics.jsonl MODEL=/tmp/smollm2 DATA=/tmp/smollm2_bignum \
      SFT=/tmp/smollm2_tools_sft timeout 585 bash examples/smollm2_tools/run.sh \
      trainer.total_training_steps=20 trainer.test_freq=5 2>&1 | tee "$out/smollm2_tools.log"
elif [ "$part" = 14 ]; then
  # part 9's update alone, no Ray: LoRA r64 with recompute at 32 rows vs without at 4/8/16 rows per micro-batch, full
  # fine-tuning at 16; 512 rows x (256 + 256) tokens, one optimizer step; reuses part 9's weights in /tmp/b7 if there
  CUDA_VISIBLE_DEVICES=0 timeout 550 python benchmarks/profile_update.py --preset qwen2.5-7b --workdir /tmp/b7 \
      --rows 512 --prompt-len 256 --response-len 256 --repeat 1 \
      --configs lora64:ckpt:32,lora64:nockpt:4,lora64:nockpt:8,lora64:nockpt:16,full:ckpt:16 \
      --out "$out/profile_update_qwen2.5-7b.json"
elif [ "$part" = 15 ] || [ "$part" = 16 ]; then
  M=/tmp/b7/models/qwen2.5-7b
  [ -f $M/config.json ] || python -c "from hybridrl.assets.tiny_model import write_size_preset as w; w('$M', 'qwen2.5-7b', weights=True)"
  variant=full; [ "$part" = 16 ] && variant="lora64:actor_rollout_ref.model.lora_rank=64;actor_rollout_ref.model.lora_alpha=128"
  timeout $((580 - SECONDS)) python benchmarks/grpo_step.py --preset qwen2.5-7b --gpus 2 --defaults --steps 3 --repeat 3 \
      --workdir /tmp/b7 --out "$out/hybridrl_qwen2.5-7b_2gpu_part$part.json" --variants "$variant"
elif [ "$part" = 17 ]; then
  # shared-prompt forwards: the GPU packing and host-sync tests (the host-side layout and the dense-mask fallback
  # for rows under 128 tokens have not run on a GPU), then the 7B full update alone with and without shared prompts
  # (separate processes, Liger on in both) to see how much of the update the prompt tokens were
  M=/tmp/b7/models/qwen2.5-7b
  [ -f $M/config.json ] || python -c "from hybridrl.assets.tiny_model import write_size_preset as w; w('$M', 'qwen2.5-7b', weights=True)"
  timeout 150 python -m pytest -q -p no:cacheprovider -m gpu tests/training/test_gpu_packing.py \
      tests/training/test_update_sync_gpu.py > "$out/gpu_tests_part17.log" 2>&1; tail -3 "$out/gpu_tests_part17.log"
  for share in true false; do
    timeout $((590 - SECONDS)) python benchmarks/profile_update.py --preset qwen2.5-7b --workdir /tmp/b7 --rows 512 \
        --prompt-len 256 --response-len 256 --n 8 --repeat 1 --use-prefix-grouper $share --configs full:ckpt:32 \
        --out "$out/profile_update_share_$share.json"
  done
elif [ "$part" = 8 ]; then
  python benchmarks/rollout.py --models 0.5B,7B --skip-hf --ab-async 0.5B,7B --out "$out/rollout_async.json"
  python -m pytest -q tests -m gpu -p no:cacheprovider
fi
