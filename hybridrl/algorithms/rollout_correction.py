"""Rollout correction (verl's `algorithm.rollout_correction`): truncated importance sampling (TIS) and rejection
sampling (RS) for the mismatch between the rollout engine's policy and the trainer's, plus off-policy diagnostics.

Shapes: B rows, R response length; log-ratios are log π_train - log π_rollout over [B, R] with a response mask.

- IS weights (`rollout_is`): "token" gives each token exp(log-ratio); "sequence" gives every token of a row
  exp(sum of the row's log-ratios). Exponents are clamped to ±20 first, padding gets 0, then weights are truncated
  at `rollout_is_threshold` (upper bound only, as verl) and detached: they reweight the loss, never carry a gradient.
  `rollout_is_batch_normalize` divides them by their batch mean (token: over tokens; sequence: over non-empty rows).
  The `rollout_is_*` metrics are taken before truncation, so `rollout_is_ratio_fraction_high` says how many got cut.
- Rejection (`rollout_rs`): comma-separated criteria, all must pass; a failing token (token_*) or row (seq_*) is
  removed from the response mask. Statistics per token: k1 = -log-ratio, k2 = ½ log-ratio², k3 = e^lr - 1 - lr;
  seq_sum / seq_mean / seq_max aggregate them over the row. `rollout_rs_threshold` is one value shared by all
  criteria or one per criterion (comma-separated); a k1 criterion takes "lower_upper" ratio bounds (kept when
  log(lower) <= k1 <= log(upper)), or a single upper whose lower is 1/upper; the others an upper bound.
- Off-policy metrics (kl, k3_kl, training/rollout ppl, log_ppl_diff, ppl_ratio, chi2_token, chi2_seq) follow
  verl's compute_offpolicy_metrics. Every metric is returned under `rollout_corr/`, verl's prefix.
RS metrics are verl's: per criterion mean/max/min/std, fraction_high/low, the per-row `_seq_*` summary and the masked fractions.
"""

from __future__ import annotations

import math

import torch

from hybridrl.algorithms.utils import masked_mean, masked_sum
from hybridrl.dotted import dotted_get

__all__ = ["IS_LEVELS", "RS_OPTIONS", "apply_rollout_correction", "kept_by_rejection", "offpolicy_metrics",
           "parse_rs_thresholds", "rejection_mask", "rollout_is_weights", "truncated_is_weights"]

SAFETY_BOUND = 20.0  # exp(±20): the widest weight a log-ratio may turn into
IS_LEVELS = ("token", "sequence")
RS_OPTIONS = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3", "seq_mean_k1",
              "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")
KEY = "algorithm.rollout_correction"


def _check_level(level: str, threshold: float) -> None:
    if level not in IS_LEVELS:
        raise ValueError(f"{KEY}.rollout_is={level!r}: must be one of {list(IS_LEVELS)} or null (off)")
    if not threshold > 0:
        raise ValueError(f"{KEY}.rollout_is_threshold={threshold}: must be > 0")


def _raw_weights(log_ratio: torch.Tensor, mask: torch.Tensor, level: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(untruncated weights [B, R] with 0 on padding, the log-ratio they came from: [B, R] or per row [B, 1])."""
    log_ratio = torch.where(mask.bool(), log_ratio.float(), 0.0)
    if level == "token":
        source = log_ratio
        weights = torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND))
    else:
        source = masked_sum(log_ratio, mask, axis=-1).unsqueeze(-1)
        weights = torch.exp(source.clamp(-SAFETY_BOUND, SAFETY_BOUND)).expand_as(log_ratio)
    return weights * mask, source


def truncated_is_weights(log_ratio: torch.Tensor, mask: torch.Tensor, level: str, threshold: float) -> torch.Tensor:
    """The TIS weights alone (no batch normalisation, no metrics): what the actor computes per micro-batch when
    the update's own log-probs are the old ones. Per token or per row, so micro-batching does not change them."""
    _check_level(level, threshold)
    return _raw_weights(log_ratio, mask, level)[0].clamp(max=threshold).detach()


def rollout_is_weights(log_ratio: torch.Tensor, mask: torch.Tensor, level: str, threshold: float,
                       batch_normalize: bool = False) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated IS weights [B, R] and verl's `rollout_is_*` metrics (unprefixed)."""
    _check_level(level, threshold)
    raw, source = _raw_weights(log_ratio, mask, level)
    metrics = _is_metrics(raw, source, mask, level, threshold) if mask.any() else {}
    weights = raw.clamp(max=threshold).detach()
    if batch_normalize:
        if level == "token":
            mean = masked_mean(weights, mask)
        else:
            nonempty = (mask.sum(-1) > 0).float()
            mean = (masked_mean(weights, mask, axis=-1) * nonempty).sum() / nonempty.sum().clamp_min(1e-8)
        factor = float(mean) if float(mean) > 1e-8 else 1.0
        weights = weights / factor
        metrics["rollout_is_batch_norm_factor"] = factor
    return weights, metrics


def _is_metrics(raw, source, mask, level: str, threshold: float) -> dict[str, float]:
    low = 1.0 / threshold
    keep = mask.bool()
    m = {"rollout_is_mean": masked_mean(raw, mask).item()}
    if level == "sequence":  # from the log-ratio sums: the weights themselves may have been clamped at e^20
        m["rollout_is_max"] = math.exp(min(source.max().item(), SAFETY_BOUND))
        m["rollout_is_min"] = math.exp(source.min().item())
        m["rollout_is_ratio_fraction_high"] = (source > math.log(threshold)).float().mean().item()
        m["rollout_is_ratio_fraction_low"] = (source < math.log(low)).float().mean().item()
    else:
        m["rollout_is_max"] = raw.masked_fill(~keep, float("-inf")).max().item()
        m["rollout_is_min"] = raw.masked_fill(~keep, float("inf")).min().item()
        m["rollout_is_ratio_fraction_high"] = masked_mean((raw > threshold).float(), mask).item()
        m["rollout_is_ratio_fraction_low"] = masked_mean((raw < low).float(), mask).item()
    bounded = raw.clamp(low, threshold)  # std and effective sample size of the weights as truncated at both ends
    mean_b = masked_mean(bounded, mask)
    m["rollout_is_std"] = (masked_mean(bounded.square(), mask) - mean_b.square()).clamp_min(0).sqrt().item() \
        if mask.sum() > 1 else 0.0
    m["rollout_is_eff_sample_size"] = 1.0 / masked_mean((bounded / (mean_b + 1e-8)).square(), mask).item()
    seq = masked_mean(raw, mask, axis=-1)
    m.update({"rollout_is_seq_mean": seq.mean().item(),
              "rollout_is_seq_std": seq.std().item() if seq.numel() > 1 else 0.0,
              "rollout_is_seq_max": seq.max().item(), "rollout_is_seq_min": seq.min().item(),
              "rollout_is_seq_max_deviation": (seq - 1.0).abs().max().item(),
              "rollout_is_seq_fraction_high": (seq > threshold).float().mean().item(),
              "rollout_is_seq_fraction_low": (seq < low).float().mean().item()})
    return m


def parse_rs_thresholds(options: str, spec) -> dict[str, tuple[float | None, float]]:
    """{criterion: (lower or None, upper)} from `rollout_rs` and `rollout_rs_threshold`; ValueError names the key."""
    names = list(dict.fromkeys(o.strip() for o in str(options).split(",") if o.strip()))
    bad = [o for o in names if o not in RS_OPTIONS]
    if not names or bad:
        raise ValueError(f"{KEY}.rollout_rs={options!r}: each comma-separated criterion must be one of "
                         f"{list(RS_OPTIONS)}" + (f" (unknown: {bad})" if bad else ""))
    if spec is None:
        raise ValueError(f"{KEY}.rollout_rs_threshold is null but rollout_rs={options!r}: set a threshold")
    specs = [s.strip() for s in str(spec).split(",") if s.strip()]
    if len(specs) not in (1, len(names)):
        raise ValueError(f"{KEY}.rollout_rs_threshold={spec!r}: give one threshold for all criteria or one per "
                         f"criterion ({len(names)}: {names})")
    specs = specs * len(names) if len(specs) == 1 else specs
    out: dict[str, tuple[float | None, float]] = {}
    for name, s in zip(names, specs):
        parts = s.split("_") if name.endswith("k1") else [s]
        try:  # float() itself reads "1_0" as 10: an underscore is a bound separator or an error
            values = [float(p) for p in parts if "_" not in p]
        except ValueError:
            values = []
        values = values if len(values) == len(parts) else []
        if len(values) not in (1, 2) or any(v <= 0 for v in values):
            rule = "'upper' or 'lower_upper' ratio bounds, positive" if name.endswith("k1") else "one positive number"
            raise ValueError(f"{KEY}.rollout_rs_threshold={spec!r}: {name} needs {rule}, got {s!r}")
        if name.endswith("k1"):
            lower, upper = (1.0 / values[0], values[0]) if len(values) == 1 else values
            out[name] = (math.log(lower), math.log(upper))
        else:
            out[name] = (None, values[0])
    return out


def _rs_statistic(name: str, log_ratio, mask) -> torch.Tensor:
    """The criterion's statistic, per token ([B, R]) or per row ([B])."""
    lr = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    token = {"k1": -lr, "k2": 0.5 * lr.square(), "k3": torch.exp(lr) - 1.0 - lr}[name[-2:]]
    if name.startswith("token"):
        return token
    if name.startswith("seq_sum"):
        return masked_sum(token, mask, axis=-1)
    if name.startswith("seq_mean"):
        return masked_mean(token, mask, axis=-1)
    peak = token.masked_fill(~mask.bool(), float("-inf")).max(-1).values
    return torch.where(torch.isinf(peak), 0.0, peak)


def _rs_spread(prefix: str, stat: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor, lower: float | None,
               upper: float) -> dict[str, float]:
    """verl's spread metrics of a criterion: `_std` of the per-token statistic clamped to [lower or 0, upper], and
    the per-row values' (a sequence criterion's statistic, a token criterion's row mean) `_seq_*` summary."""
    token = stat if stat.dim() == 2 else stat.unsqueeze(-1).expand_as(mask)
    out = {f"{prefix}_std": 0.0}
    if mask.sum() > 1:
        clamped = token.clamp(min=0.0 if lower is None else lower, max=upper)
        mean = masked_mean(clamped, mask)
        out[f"{prefix}_std"] = torch.sqrt((masked_mean(clamped.square(), mask) - mean.square()).clamp(min=0)).item()
    per_row = (masked_mean(stat, mask, axis=-1) if stat.dim() == 2 else stat)[rows]
    if per_row.numel() == 0:
        return out | {f"{prefix}_seq_{k}": 0.0 for k in ("mean", "std", "max", "min", "max_deviation",
                                                          "fraction_high", "fraction_low")}
    out |= {f"{prefix}_seq_mean": per_row.mean().item(),
            f"{prefix}_seq_std": per_row.std().item() if per_row.numel() > 1 else 0.0,
            f"{prefix}_seq_max": per_row.max().item(), f"{prefix}_seq_min": per_row.min().item(),
            f"{prefix}_seq_max_deviation": per_row.abs().max().item(),
            f"{prefix}_seq_fraction_high": (per_row > upper).float().mean().item()}
    if lower is not None:
        out[f"{prefix}_seq_fraction_low"] = (per_row < lower).float().mean().item()
    return out


def _rs_criterion(name: str, lower: float | None, upper: float, log_ratio, mask):
    """(the criterion's statistic, [B, R] bool: the tokens it keeps) on a log-ratio already zeroed on padding."""
    stat = _rs_statistic(name, log_ratio, mask)
    ok = stat <= upper if lower is None else (stat >= lower) & (stat <= upper)
    return stat, ok if name.startswith("token") else ok.unsqueeze(-1).expand(mask.shape)


def kept_by_rejection(log_ratio: torch.Tensor, mask: torch.Tensor, thresholds: dict[str, tuple[float | None, float]]
                      ) -> torch.Tensor:
    """The response mask with the tokens / rows rejected by every criterion of `thresholds` (parse_rs_thresholds)
    zeroed; no metrics, so no host sync (the update's micro-batches use it)."""
    log_ratio = torch.where(mask.bool(), log_ratio.float(), 0.0)
    keep_all = torch.ones_like(mask, dtype=torch.bool)
    for name, (lower, upper) in thresholds.items():
        keep_all &= _rs_criterion(name, lower, upper, log_ratio, mask)[1]
    return (mask * keep_all).to(mask.dtype)


def rejection_mask(log_ratio: torch.Tensor, mask: torch.Tensor, options: str, threshold_spec
                   ) -> tuple[torch.Tensor, dict[str, float]]:
    """(the response mask with rejected tokens / rows zeroed, `rollout_rs_*` metrics)."""
    thresholds = parse_rs_thresholds(options, threshold_spec)
    log_ratio = torch.where(mask.bool(), log_ratio.float(), 0.0)
    valid, rows = mask.bool(), mask.sum(-1) > 0
    keep_all = torch.ones_like(valid)
    metrics: dict[str, float] = {}
    for name, (lower, upper) in thresholds.items():
        stat, keep = _rs_criterion(name, lower, upper, log_ratio, mask)
        keep_all &= keep
        p = f"rollout_rs_{name}"
        if name.startswith("token"):
            metrics[f"{p}_mean"] = masked_mean(stat, mask).item()
            metrics[f"{p}_max"] = stat.masked_fill(~valid, float("-inf")).max().item()
            metrics[f"{p}_min"] = stat.masked_fill(~valid, float("inf")).min().item()
            metrics[f"{p}_fraction_high"] = masked_mean((stat > upper).float(), mask).item()
            metrics[f"{p}_fraction_low"] = masked_mean((stat < lower).float(), mask).item() if lower is not None else 0.0
        elif rows.any():
            s = stat[rows]
            metrics[f"{p}_mean"] = masked_mean(stat.unsqueeze(-1).expand_as(log_ratio), mask).item()
            metrics[f"{p}_max"], metrics[f"{p}_min"] = s.max().item(), s.min().item()
            metrics[f"{p}_fraction_high"] = (s > upper).float().mean().item()
            metrics[f"{p}_fraction_low"] = (s < lower).float().mean().item() if lower is not None else 0.0
        metrics.update(_rs_spread(p, stat, mask, rows, lower, upper))
        metrics[f"{p}_masked_fraction"] = masked_mean((~keep).float(), mask).item()
        metrics[f"{p}_seq_masked_fraction"] = ((~keep & valid).any(-1) & rows).float().sum().item() / max(
            1, int(rows.sum()))
    metrics["rollout_rs_masked_fraction"] = masked_mean((~keep_all).float(), mask).item()
    metrics["rollout_rs_seq_masked_fraction"] = (~keep_all & valid).any(-1).float().mean().item()
    return (mask * keep_all).to(mask.dtype), metrics


def offpolicy_metrics(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, mask: torch.Tensor
                      ) -> dict[str, float]:
    """verl's off-policy diagnostics between the trainer's log-probs (old_log_prob) and the engine's (unprefixed)."""
    old, rollout = old_log_prob.float(), rollout_log_prob.float()
    seq_train = masked_mean(old, mask, axis=-1)
    seq_rollout = masked_mean(rollout, mask, axis=-1)
    log_ratio = torch.where(mask.bool(), old - rollout, 0.0)
    log_ppl_diff = seq_rollout - seq_train  # = log(training ppl / rollout ppl) per row
    rho = torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND))
    seq_sum = masked_sum(log_ratio, mask, axis=-1).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    return {
        "training_ppl": torch.exp(-seq_train).mean().item(),
        "training_log_ppl": (-seq_train).mean().item(),
        "kl": masked_mean(rollout - old, mask).item(),
        "k3_kl": masked_mean(torch.exp(log_ratio) - log_ratio - 1, mask).item(),
        "rollout_ppl": torch.exp(-seq_rollout).mean().item(),
        "rollout_log_ppl": (-seq_rollout).mean().item(),
        "log_ppl_diff": log_ppl_diff.mean().item(),
        "log_ppl_abs_diff": log_ppl_diff.abs().mean().item(),
        "log_ppl_diff_max": log_ppl_diff.max().item(),
        "log_ppl_diff_min": log_ppl_diff.min().item(),
        "ppl_ratio": torch.exp(log_ppl_diff).mean().item(),
        "chi2_token": (masked_mean(rho.square(), mask) - 1.0).item(),
        "chi2_seq": (torch.exp(2.0 * seq_sum).mean() - 1.0).item(),
    }


def apply_rollout_correction(batch, cfg) -> dict[str, float]:
    """Driver side, with the old log-probs in `batch` (verl's decoupled mode): adds `rollout_is_weights` when
    `cfg.rollout_is` is set, narrows `response_mask` when `cfg.rollout_rs` is set, and returns the `rollout_corr/`
    metrics (the off-policy diagnostics always). `cfg` is `algorithm.rollout_correction`, or a dict of some of its
    keys (verl's defaults for the rest: threshold 2.0, no batch normalisation, no rejection)."""
    def get(key, default=None):
        return dotted_get(cfg, key, default)

    b = batch.batch
    mask, log_ratio = b["response_mask"], b["old_log_probs"].float() - b["rollout_log_probs"].float()
    metrics: dict[str, float] = {}
    if get("rollout_is") is not None:
        b["rollout_is_weights"], is_metrics = rollout_is_weights(
            log_ratio, mask, get("rollout_is"), float(get("rollout_is_threshold", 2.0)),
            bool(get("rollout_is_batch_normalize", False)))
        metrics.update(is_metrics)
    if get("rollout_rs") is not None:
        b["response_mask"], rs_metrics = rejection_mask(log_ratio, mask, get("rollout_rs"), get("rollout_rs_threshold"))
        metrics.update(rs_metrics)
    if mask.any():
        metrics.update(offpolicy_metrics(b["old_log_probs"], b["rollout_log_probs"], mask))
    return {f"rollout_corr/{k}": v for k, v in metrics.items()}
