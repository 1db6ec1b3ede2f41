"""The allowed values of config keys, as `Literal` types the section fields are annotated with."""

from typing import Literal, get_args

Dtype = Literal["fp32", "float32", "bf16", "bfloat16", "fp16", "float16"]
LossAggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
KLType = Literal["kl", "k1", "k2", "mse", "k3", "low_var_kl", "abs"]
# the actor's KL loss also takes "<estimator>+": that estimator's value with k2's gradient (unbiased, as verl's docs)
KLLossType = Literal["kl", "k1", "k2", "mse", "k3", "low_var_kl", "abs", "kl+", "k1+", "k2+", "mse+", "k3+",
                     "low_var_kl+", "abs+"]
Truncation = Literal["error", "left", "right", "middle"]   # prompts (data.truncation)
RewardTruncation = Literal["error", "left", "right"]   # reward-model inputs
WarmupStyle = Literal["constant", "cosine"]
Strategy = Literal["fsdp2"]
Device = Literal["auto", "cuda", "cpu"]
# the policy losses registered in hybridrl.algorithms.registry (a test keeps the two equal); names registered by
# model.external_lib are accepted too
PolicyLossMode = Literal["vanilla", "gspo", "gpg", "clip_cov", "kl_cov", "cispo", "sapo", "geo_mean"]
AdvEstimator = Literal["gae", "grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax",
                       "grpo_vectorized", "rloo_vectorized", "grpo_passk", "opo", "gpg", "optimal_token_baseline",
                       "tir_optimal_token_baseline"]
CheckpointContent = Literal["model", "optimizer", "extra", "hf_model"]
LoggerName = Literal["console", "file", "tensorboard", "wandb", "mlflow"]
FilterMetric = Literal["acc", "score", "seq_reward", "seq_final_reward"]
Auto = Literal["auto"]

POLICY_LOSS_MODES: tuple[str, ...] = get_args(PolicyLossMode)
