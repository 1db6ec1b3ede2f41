"""Step metrics with verl's names (`critic/score/mean`, `timing_s/gen`, `perf/throughput`, `val-core/...`).

The names are the contract: a verl user's dashboards must carry over, so they are copied, including
verl's misspelled `compute_throughout_metrics` (with a correctly spelled alias).

Choices, following verl's trainer/ppo/metric_utils.py unless stated:
- sequence score / reward = sum over the response of `token_level_scores` / `token_level_rewards`,
  statistics over the samples that were not aborted (response length 0); the aborted fraction is
  reported as `response/aborted_ratio`, so excluded samples are counted, never silently dropped;
- advantages / returns / values statistics over the response tokens only (`response_mask`);
- `critic/vf_explained_var` = 1 - Var(returns - values) / (Var(returns) + 1e-5), unbiased variances;
- lengths come from `attention_mask` ([B, P+R]): prompt = first P columns, response = last R;
  `clip_ratio` = fraction of rows whose length equals the padded maximum (P or R), i.e. truncated;
- throughput uses `meta_info["global_token_num"]` (per-sample token counts, verl) when present and
  falls back to `attention_mask.sum()`; tokens / second / GPU;
- multi-turn rollouts (`multi_turn_stats` in the batch): verl's `num_turns/{min,max,mean}` and
  `tool_call_counts/{min,max,mean}`, and batch sums under `multi_turn/` (tool errors, timeouts, crashes, malformed
  calls, dropped calls, calls inside reasoning blocks (not run), truncated tool answers, trajectories cut by each
  limit: `cut_by_turns` (turn counts), `cut_by_length` (an appended message did not fit the response budget),
  `cut_by_turn_length` (max_tokens_per_turn), `cut_by_max_tokens` / `cut_by_max_model_len` (the engine ended the
  trajectory mid-turn at the response budget or at the model length the KV was sized for); seconds in tools);
  `multi_turn/tool_use_rate` is the fraction of trajectories with at least one tool call;
  `multi_turn/masked_tokens` counts the tool tokens kept out of the loss; validation reports the same (without
  masked_tokens) over all its samples under `val-aux/` (verl's `val-aux/num_turns/{min,max,mean}` among them);
- validation: bootstrap as verl does (1000 resamples, `np.random.RandomState(seed)` — the same
  numbers as verl's `np.random.seed` + `np.random.choice` loop, checked in tests, but vectorised and
  without touching numpy's global RNG); majority vote ties go to the prediction seen first in the
  resample, and the vote's value is that of its first occurrence (verl's `calc_maj_val`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from hybridrl.protocol import DataProto
from hybridrl.rollout.scheduler import PEAK_STATS

__all__ = [
    "compute_data_metrics",
    "compute_floor_metrics",
    "compute_timing_metrics",
    "compute_throughout_metrics",
    "compute_variance_proxy_metrics",
    "compute_throughput_metrics",
    "multi_turn_stats_metrics",
    "process_validation_metrics",
    "flatten_validation_metrics",
    "bootstrap_metric",
    "reduce_metrics",
    "StepWorkerMetrics",
]

# Sections whose per-token time is reported, and which tokens they process (verl's table + old_log_prob).
_RESPONSE_TOKEN_SECTIONS = ("gen",)
_ALL_TOKEN_SECTIONS = ("old_log_prob", "ref", "values", "adv", "update_critic", "update_actor")


def _require(batch: DataProto, keys: Sequence[str], fn: str) -> None:
    missing = [k for k in keys if k not in batch.batch]
    if missing:
        raise ValueError(f"{fn}: batch lacks tensor keys {missing} (has {sorted(batch.batch)})")


def _lengths(batch: DataProto) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """(prompt_length [B], response_length [B], max prompt length P, max response length R) as floats."""
    max_resp = batch.batch["responses"].shape[-1]
    attn = batch.batch["attention_mask"]
    if attn.shape[-1] <= max_resp:
        raise ValueError(f"attention_mask has {attn.shape[-1]} columns but responses has {max_resp}: "
                         "attention_mask must cover prompt + response ([B, P+R])")
    prompt_len = attn[:, :-max_resp].sum(-1).float()
    resp_len = attn[:, -max_resp:].sum(-1).float()
    return prompt_len, resp_len, attn.shape[-1] - max_resp, max_resp


def _stats(prefix: str, x: torch.Tensor) -> dict[str, float]:
    x = x.detach().float()
    return {f"{prefix}/mean": x.mean().item(), f"{prefix}/max": x.max().item(), f"{prefix}/min": x.min().item()}


def compute_data_metrics(batch: DataProto, use_critic: bool = True) -> dict[str, float]:
    """verl's data metrics: score, rewards, advantages, returns, (values, vf_explained_var), lengths."""
    keys = ["token_level_scores", "token_level_rewards", "advantages", "returns", "responses",
            "attention_mask", "response_mask"] + (["values"] if use_critic else [])
    _require(batch, keys, "compute_data_metrics")
    prompt_len, resp_len, max_prompt, max_resp = _lengths(batch)
    aborted = resp_len == 0
    if bool(aborted.all()):
        raise ValueError(f"compute_data_metrics: all {len(aborted)} samples have an empty response (aborted); "
                         "the rollout produced nothing to score")
    kept = ~aborted
    mask = batch.batch["response_mask"].bool()
    returns = torch.masked_select(batch.batch["returns"], mask)

    metrics = {
        **_stats("critic/score", batch.batch["token_level_scores"].sum(-1)[kept]),
        **_stats("critic/rewards", batch.batch["token_level_rewards"].sum(-1)[kept]),
        **_stats("critic/advantages", torch.masked_select(batch.batch["advantages"], mask)),
        **_stats("critic/returns", returns),
    }
    if use_critic:
        values = torch.masked_select(batch.batch["values"], mask)
        metrics.update(_stats("critic/values", values))
        explained = 1.0 - torch.var(returns - values) / (torch.var(returns) + 1e-5)
        metrics["critic/vf_explained_var"] = explained.item()
    metrics.update(_stats("response_length", resp_len))
    metrics["response_length/clip_ratio"] = (resp_len == max_resp).float().mean().item()
    metrics.update(_stats("response_length_non_aborted", resp_len[kept]))
    metrics["response_length_non_aborted/clip_ratio"] = (resp_len[kept] == max_resp).float().mean().item()
    metrics["response/aborted_ratio"] = aborted.float().mean().item()
    metrics.update(_stats("prompt_length", prompt_len))
    metrics["prompt_length/clip_ratio"] = (prompt_len == max_prompt).float().mean().item()
    if "multi_turn_stats" in batch.non_tensor_batch:
        metrics.update(compute_multi_turn_metrics(batch))
    return metrics


_MULTI_TURN_SUMS = ("tool_calls", "tool_errors", "tool_timeouts", "tool_crashes", "malformed_calls", "dropped_calls",
                    "calls_in_reasoning", "truncated_responses", "tool_time_s")


def multi_turn_stats_metrics(stats: Sequence[dict]) -> dict[str, float]:
    """Tool-use metrics of per-trajectory `multi_turn_stats`: verl's `num_turns/*` and `tool_call_counts/*`, the
    `multi_turn/` sums, and `multi_turn/tool_use_rate`, the fraction of trajectories with at least one tool call."""
    out: dict[str, float] = {}
    for name, key in (("num_turns", "num_turns"), ("tool_call_counts", "tool_calls")):
        values = np.asarray([s.get(key, 0) for s in stats], dtype=np.float64)
        out.update({f"{name}/min": values.min(), f"{name}/max": values.max(), f"{name}/mean": values.mean()})
    for key in _MULTI_TURN_SUMS:
        out[f"multi_turn/{key}"] = float(sum(s.get(key, 0) for s in stats))
    out["multi_turn/tool_use_rate"] = float(np.mean([s.get("tool_calls", 0) > 0 for s in stats]))
    out["multi_turn/tool_time_s_max"] = float(max(s.get("tool_time_s", 0.0) for s in stats))
    out["multi_turn/cut_by_turns"] = float(sum(s.get("cut") == "turns" for s in stats))
    out["multi_turn/cut_by_length"] = float(sum(s.get("cut") == "length" for s in stats))
    out["multi_turn/cut_by_turn_length"] = float(sum(s.get("cut") == "turn_length" for s in stats))
    out["multi_turn/cut_by_max_tokens"] = float(sum(s.get("cut") == "max_tokens" for s in stats))
    out["multi_turn/cut_by_max_model_len"] = float(sum(s.get("cut") == "max_model_len" for s in stats))
    return {k: float(v) for k, v in out.items()}


def compute_multi_turn_metrics(batch: DataProto) -> dict[str, float]:
    """Per-step tool-use metrics from the per-sample `multi_turn_stats` (see the module docstring)."""
    out = multi_turn_stats_metrics(list(batch.non_tensor_batch["multi_turn_stats"]))
    resp = batch.batch["responses"].shape[-1]
    attended = batch.batch["attention_mask"][:, -resp:].bool()
    out["multi_turn/masked_tokens"] = float((attended & ~batch.batch["response_mask"].bool()).sum().item())
    return out


def compute_timing_metrics(batch: DataProto, timing_raw: dict[str, float]) -> dict[str, float]:
    """`timing_s/{name}` for every timed section; `timing_per_token_ms/{name}` for sections with a token count
    (gen: response tokens; old_log_prob, ref, values, adv, update_critic, update_actor: prompt + response)."""
    _require(batch, ["responses", "attention_mask"], "compute_timing_metrics")
    prompt_len, resp_len, _, _ = _lengths(batch)
    n_resp = resp_len.sum().item()
    n_all = prompt_len.sum().item() + n_resp
    tokens = {**{s: n_resp for s in _RESPONSE_TOKEN_SECTIONS}, **{s: n_all for s in _ALL_TOKEN_SECTIONS}}
    out = {f"timing_s/{name}": float(sec) for name, sec in timing_raw.items()}
    for name, sec in timing_raw.items():
        if name in tokens and tokens[name] > 0:
            out[f"timing_per_token_ms/{name}"] = float(sec) * 1000.0 / tokens[name]
    return out


def compute_throughout_metrics(batch: DataProto, timing_raw: dict[str, float], n_gpus: int) -> dict[str, float]:
    """`perf/total_num_tokens`, `perf/time_per_step` (= timing_raw["step"]), `perf/throughput` (tokens/s/GPU)."""
    if "step" not in timing_raw:
        raise ValueError(f"compute_throughout_metrics: timing_raw needs a 'step' entry (the whole step's seconds); "
                         f"has {sorted(timing_raw)}")
    if not isinstance(n_gpus, int) or n_gpus < 1:
        raise ValueError(f"compute_throughout_metrics: n_gpus must be a positive int, got {n_gpus!r}")
    step_s = float(timing_raw["step"])
    if step_s <= 0:
        raise ValueError(f"compute_throughout_metrics: timing_raw['step'] must be > 0 seconds, got {step_s}")
    if "global_token_num" in batch.meta_info:
        total = int(sum(int(t) for t in batch.meta_info["global_token_num"]))
    else:
        _require(batch, ["attention_mask"], "compute_throughout_metrics")
        total = int(batch.batch["attention_mask"].sum().item())
    return {"perf/total_num_tokens": total, "perf/time_per_step": step_s,
            "perf/throughput": total / (step_s * n_gpus)}


compute_throughput_metrics = compute_throughout_metrics


# ---------------------------------------------------------------------------------------------- validation
def compute_floor_metrics(batch: DataProto, timing_raw: dict[str, float], metrics: dict, plan, n_gpus: int,
                          ppo_epochs: int = 1) -> dict[str, float]:
    """Each phase's floor next to its time: `perf/floor_s/{phase}` (the FLOPs, or for decode the bytes, it cannot
    avoid, over the GPUs' datasheet peak, device_peaks.py) and `perf/vs_floor/{phase}` (measured / floor).
    Training passes count the matmul FLOPs of the tokens they run (2 x matmul params per token forward, each prompt
    once per group with shared-prompt forwards) plus causal attention (2 x heads x head_dim x len^2 per layer);
    the update is forward + backward (3x forward; 2x with LoRA, whose frozen base gets no weight gradient), once per
    PPO epoch. Decode: the engine's `rollout/decode_floor_s` against `rollout/decode_s`. verl's model-FLOPs
    utilisations are the same counts over the time: `perf/mfu/actor` (the update), `perf/mfu/actor_infer` (the
    old-log-prob pass). Nothing on CPUs or unknown GPUs."""
    from hybridrl.device_peaks import peaks_of

    peaks = peaks_of(plan.device.name) if plan is not None and plan.device.type == "cuda" else None
    if peaks is None:
        return {}
    shape = plan.model
    mask = batch.batch["attention_mask"]
    response_len = batch.batch["responses"].shape[-1]
    prompt_tokens = mask[:, :-response_len].sum().item()
    tokens = mask[:, -response_len:].sum().item() + (prompt_tokens / plan.layout.n if plan.actor.share_prompts
                                                      else prompt_tokens)
    lens = mask.sum(-1).double()
    forward = (2 * (shape.decoder_active_params + shape.embed_params) * tokens
               + 2 * shape.heads * shape.head_dim * shape.layers * float((lens**2).sum()))
    flops_per_s = n_gpus * peaks.bf16_flops
    update_passes = (2 if plan.actor.lora_base_dtype else 3) * ppo_epochs
    floors = {"update_actor": forward * update_passes / flops_per_s,
              "old_log_prob": forward / flops_per_s, "ref": forward / flops_per_s}
    out = {}
    for phase, floor in floors.items():
        if phase in timing_raw:
            out[f"perf/floor_s/{phase}"] = floor
            out[f"perf/vs_floor/{phase}"] = timing_raw[phase] / floor
    for phase, name in (("update_actor", "actor"), ("old_log_prob", "actor_infer")):
        if timing_raw.get(phase):
            out[f"perf/mfu/{name}"] = floors[phase] / timing_raw[phase]
    if metrics.get("rollout/decode_floor_s"):
        out["perf/floor_s/gen_decode"] = metrics["rollout/decode_floor_s"]
        out["perf/vs_floor/gen_decode"] = metrics["rollout/decode_s"] / metrics["rollout/decode_floor_s"]
    return out


def compute_variance_proxy_metrics(batch: DataProto, gradient_norm: float | None = None) -> dict[str, float]:
    """verl's gradient-variance proxies (`variance_proxy/*`), where the batch has Σπ² (actor.calculate_sum_pi_squared),
    old log-probs and advantages. Per sample: Ā = its mean advantage, W = Σ_t (1 - 2π_t + Σπ²) (the score-norm
    proxy, algorithms/optimal_token_baseline.py). proxy2_total_power = mean(Ā² max(W, 0)) (with rollout IS weights
    ρ: mean(ρ̄² Ā² W) where ρ̄ is the sample's mean weight), proxy1_signal_strength = grad_norm², proxy3_pure_noise =
    max(0, (proxy2 - proxy1) / (samples - 1)); expected_a_squared = mean(Ā²), expected_w = mean(W)."""
    b = batch.batch
    if not all(k in b for k in ("sum_pi_squared", "old_log_probs", "advantages")):
        return {}
    from hybridrl.algorithms.optimal_token_baseline import score_norm_proxy
    from hybridrl.algorithms.utils import masked_mean, masked_sum

    mask, weights = b["response_mask"].float(), b.get("rollout_is_weights")
    adv = masked_mean(b["advantages"].float(), mask, axis=-1)
    w = score_norm_proxy(b["old_log_probs"], b["sum_pi_squared"], weights)
    w_values = masked_sum(w, mask, axis=-1)
    if weights is not None:
        rho = masked_mean(weights.float(), mask, axis=-1)
        w_plain = masked_sum(w / torch.clamp(weights.float() ** 2, min=1e-10), mask, axis=-1).clamp(min=0.0)
        total_power = float((rho**2 * adv**2 * w_plain).mean())
    else:
        total_power = float((adv**2 * w_values.clamp(min=0.0)).mean())
    signal = None if gradient_norm is None else float(gradient_norm) ** 2
    noise = max(0.0, (total_power - signal) / (len(adv) - 1)) if signal is not None and len(adv) > 1 else 0.0
    return {"variance_proxy/proxy1_signal_strength": signal if signal is not None else 0.0,
            "variance_proxy/proxy2_total_power": total_power, "variance_proxy/proxy3_pure_noise": noise,
            "variance_proxy/expected_a_squared": float((adv**2).mean()),
            "variance_proxy/expected_w": float(w_values.mean())}


def bootstrap_metric(data: Sequence[float], subset_size: int, reduce_fns=(np.max, np.min),
                     n_bootstrap: int = 1000, seed: int = 42) -> list[tuple[float, float]]:
    """(mean, std) over `n_bootstrap` resamples (with replacement, size `subset_size`) of each reduce_fn
    applied row-wise (reduce_fn(matrix, axis=1))."""
    idx = np.random.RandomState(seed).choice(len(data), size=(n_bootstrap, subset_size), replace=True)
    rows = np.asarray(data, dtype=np.float64)[idx]
    out = []
    for fn in reduce_fns:
        vals = fn(rows, axis=1)
        out.append((float(np.mean(vals)), float(np.std(vals))))
    return out


def _bootstrap_majority(vals: Sequence[float], preds: Sequence[Any], subset_size: int,
                        n_bootstrap: int = 1000, seed: int = 42) -> tuple[float, float]:
    """Majority vote over `preds` in each resample; the value is that of the vote's first occurrence."""
    idx = np.random.RandomState(seed).choice(len(vals), size=(n_bootstrap, subset_size), replace=True)
    codes_of = {}
    codes = np.array([codes_of.setdefault(p, len(codes_of)) for p in preds])[idx]  # [n_boot, subset]
    k = len(codes_of)
    onehot = codes[:, :, None] == np.arange(k)[None, None, :]                     # [n_boot, subset, k]
    counts = onehot.sum(1)
    first_pos = np.where(onehot.any(1), onehot.argmax(1), subset_size)              # first position of each vote
    first_pos = np.where(counts == counts.max(1, keepdims=True), first_pos, subset_size + 1)
    winner_pos = first_pos.min(1)                                                   # earliest among the tied maxima
    maj = np.asarray(vals, dtype=np.float64)[idx[np.arange(n_bootstrap), winner_pos]]
    return float(np.mean(maj)), float(np.std(maj))


def _subset_sizes(n_resps: int) -> list[int]:
    ns, n = [], 2
    while n < n_resps:
        ns.append(n)
        n *= 2
    return ns + [n_resps]


def _per_prompt_metrics(var_vals: list, preds: list | None, seed: int) -> dict[str, float]:
    n = len(var_vals)
    metric = {f"mean@{n}": float(np.mean(var_vals))}
    if n == 1:
        return metric
    metric[f"std@{n}"] = float(np.std(var_vals))
    for size in _subset_sizes(n):
        (bm, bs), (wm, ws) = bootstrap_metric(var_vals, size, (np.max, np.min), seed=seed)
        metric[f"best@{size}/mean"], metric[f"best@{size}/std"] = bm, bs
        metric[f"worst@{size}/mean"], metric[f"worst@{size}/std"] = wm, ws
        if preds is not None:
            metric[f"maj@{size}/mean"], metric[f"maj@{size}/std"] = _bootstrap_majority(var_vals, preds, size, seed=seed)
    return metric


def process_validation_metrics(data_sources: Sequence[str], sample_uids: Sequence[Any],
                               infos_dict: dict[str, Sequence[Any]], seed: int = 42
                               ) -> dict[str, dict[str, dict[str, float]]]:
    """{data_source: {var_name: {metric: value}}}: per prompt (uid) mean@N, std@N, best@n/worst@n/maj@n
    (bootstrap, n = 2, 4, ..., N), then averaged over the prompts of each data source. String-valued
    variables (e.g. `pred`) are not scored; `pred`, when present, drives the majority vote."""
    n = len(data_sources)
    if len(sample_uids) != n:
        raise ValueError(f"process_validation_metrics: {len(sample_uids)} uids for {n} data_sources")
    bad = {k: len(v) for k, v in infos_dict.items() if len(v) != n}
    if bad:
        raise ValueError(f"process_validation_metrics: infos_dict lengths {bad} differ from {n} samples")

    groups: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))  # src -> uid -> var -> values
    for i, (src, uid) in enumerate(zip(data_sources, sample_uids)):
        for var, vals in infos_dict.items():
            groups[src][uid][var].append(vals[i])

    per_src: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))  # src -> var -> metric -> [per uid]
    for src, by_uid in groups.items():
        for var2vals in by_uid.values():
            preds = var2vals.get("pred")
            for var, vals in var2vals.items():
                if isinstance(vals[0], str):
                    continue
                for name, value in _per_prompt_metrics(vals, preds, seed).items():
                    per_src[src][var][name].append(value)
    return {src: {var: {name: float(np.mean(v)) for name, v in metrics.items()} for var, metrics in by_var.items()}
            for src, by_var in per_src.items()}


def flatten_validation_metrics(data_src2var2metric2val: dict[str, dict[str, dict[str, float]]]) -> dict[str, float]:
    """verl's key layout: the core variable (`acc` if present, else `reward`) with mean/maj/best at the largest
    N goes to `val-core/{data_source}/{var}/{metric}`; everything else to `val-aux/...`."""
    out = {}
    for src, var2metric in data_src2var2metric2val.items():
        core_var = "acc" if "acc" in var2metric else "reward"
        for var, metric2val in var2metric.items():
            n_max = max(int(name.split("@")[-1].split("/")[0]) for name in metric2val)
            for name, value in metric2val.items():
                core = (var == core_var and name.startswith(("mean", "maj", "best")) and f"@{n_max}" in name)
                out[f"{'val-core' if core else 'val-aux'}/{src}/{var}/{name}"] = value
    return out


# the engine's stats (rollout/*) that are levels, rates or peaks rather than amounts: a step with several generate
# calls averages them (the peaks: their max) where it adds up the amounts (tokens, steps, seconds)
ROLLOUT_LEVELS = frozenset({"num_kv_blocks", "kv_block_bytes", "tail_time_frac", "running_seqs_mean",
                            "spec_acceptance_rate", "spec_mean_acceptance_length", "spec_tokens_per_verify_step"})
ROLLOUT_PEAKS = frozenset(PEAK_STATS)


class StepWorkerMetrics:
    """What the workers return over one step's calls (each call: a list with a value per rank), folded: a call's
    `timing_s/*` is its slowest rank's and the step's calls add up; an amount the rollout engine counts (tokens,
    decode steps, seconds: `rollout/*` but ROLLOUT_LEVELS / ROLLOUT_PEAKS) is the ranks' mean, added up over the
    step's generate calls (dynamic sampling makes several); peaks (memory, KV blocks) are the max over ranks and
    calls; anything else the mean."""

    def __init__(self):
        self.lists: dict[str, list] = {}
        self.added: dict[str, float] = {}

    def absorb(self, out) -> None:
        """One call's outputs (a DataProto whose meta_info may hold `metrics`: name -> value or per-rank list)."""
        for key, value in out.meta_info.pop("metrics", {}).items():
            values = value if isinstance(value, list) else [value]
            if key.startswith("timing_s/"):
                self.added[key] = self.added.get(key, 0.0) + max(values)
            elif key.startswith("rollout/") and key.removeprefix("rollout/") not in ROLLOUT_LEVELS | ROLLOUT_PEAKS:
                self.added[key] = self.added.get(key, 0.0) + sum(values) / len(values)
            else:
                self.lists.setdefault(key, []).extend(values)

    def fold(self, metrics: dict, timing: dict) -> None:
        """Into the step's metrics, and its timings (`timing_s/x` as `x`, unless the driver timed `x` itself)."""
        for key, total in self.added.items():
            if key.startswith("timing_s/"):
                timing.setdefault(key.removeprefix("timing_s/"), total)
            else:
                metrics[key] = total
        for key, mean in reduce_metrics(self.lists).items():
            peak = key.startswith(("perf/max_memory", "memory/")) or key.removeprefix("rollout/") in ROLLOUT_PEAKS
            metrics[key] = max(self.lists[key]) if peak else mean


def reduce_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """Mean of each list of values (scalars and 0-d tensors pass through as floats)."""
    out = {}
    for key, values in metrics.items():
        if isinstance(values, torch.Tensor):
            values = values.detach().float().cpu().numpy()
        arr = np.asarray(values, dtype=np.float64)
        if arr.size == 0:
            raise ValueError(f"reduce_metrics: metric {key!r} has no values to average")
        out[key] = float(arr.mean())
    return out
