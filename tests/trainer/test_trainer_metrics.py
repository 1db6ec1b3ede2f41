"""Step metrics against hand-computed numbers; validation metrics against a crafted case and a verl-style loop."""

from collections import defaultdict
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hybridrl.protocol import DataProto
from hybridrl.trainer import timer as timer_mod
from hybridrl.trainer.metrics import (
    compute_data_metrics,
    compute_throughout_metrics,
    compute_throughput_metrics,
    compute_timing_metrics,
    flatten_validation_metrics,
    multi_turn_stats_metrics,
    process_validation_metrics,
    reduce_metrics,
)
from hybridrl.trainer.timer import marked_timer


def small_batch(aborted_row: bool = False) -> DataProto:
    # P=3, R=4. Row 0: prompt 2 tokens, response 3; row 1: prompt 3 (full), response 4 (full, clipped).
    attn = [[0, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1, 1]]
    rows = {
        "token_level_scores": [[0, 0, 1, 0], [0, 0, 0, 0.5]],
        "token_level_rewards": [[0, 0, 0.9, 0], [0.1, 0, 0, 0.4]],
        "advantages": [[1, 2, 3, 100], [-1, -2, -3, -4]],  # 100 sits on padding: must be masked out
        "returns": [[1, 1, 1, 50], [2, 2, 2, 2]],
        "values": [[1, 1, 1, 9], [2, 2, 2, 1]],
    }
    if aborted_row:
        attn.append([1, 1, 1, 0, 0, 0, 0])
        for v in rows.values():
            v.append([7, 7, 7, 7])
    t = {k: torch.tensor(v, dtype=torch.float32) for k, v in rows.items()}
    t["attention_mask"] = torch.tensor(attn)
    t["response_mask"] = t["attention_mask"][:, 3:].clone()
    t["responses"] = torch.zeros(len(attn), 4, dtype=torch.long)
    return DataProto.from_dict(t)


def test_data_metrics_match_hand_computed_values():
    m = compute_data_metrics(small_batch(), use_critic=True)
    expected = {
        "critic/score/mean": 0.75, "critic/score/max": 1.0, "critic/score/min": 0.5,
        "critic/rewards/mean": 0.7, "critic/rewards/max": 0.9, "critic/rewards/min": 0.5,
        "critic/advantages/mean": -4 / 7, "critic/advantages/max": 3.0, "critic/advantages/min": -4.0,
        "critic/returns/mean": 11 / 7, "critic/returns/max": 2.0, "critic/returns/min": 1.0,
        "critic/values/mean": 10 / 7, "critic/values/max": 2.0, "critic/values/min": 1.0,
        # Var(returns - values) = 1/7, Var(returns) = 2/7 (unbiased)
        "critic/vf_explained_var": 1 - (1 / 7) / (2 / 7 + 1e-5),
        "response_length/mean": 3.5, "response_length/max": 4.0, "response_length/min": 3.0,
        "response_length/clip_ratio": 0.5, "response/aborted_ratio": 0.0,
        "response_length_non_aborted/mean": 3.5, "response_length_non_aborted/max": 4.0,
        "response_length_non_aborted/min": 3.0, "response_length_non_aborted/clip_ratio": 0.5,
        "prompt_length/mean": 2.5, "prompt_length/max": 3.0, "prompt_length/min": 2.0,
        "prompt_length/clip_ratio": 0.5,
    }
    assert set(m) == set(expected)
    for k, v in expected.items():
        assert m[k] == pytest.approx(v, abs=1e-6), k


def test_data_metrics_without_critic_and_aborted_rows_are_counted():
    m = compute_data_metrics(small_batch(aborted_row=True), use_critic=False)
    assert not any(k.startswith("critic/values") for k in m) and "critic/vf_explained_var" not in m
    assert m["response/aborted_ratio"] == pytest.approx(1 / 3)
    assert m["critic/score/max"] == pytest.approx(1.0)  # the aborted row's score 28 is excluded
    assert m["response_length/min"] == 0.0  # but its length is part of the length statistics
    assert m["response_length_non_aborted/min"] == 3.0 and m["response_length_non_aborted/mean"] == 3.5  # verl's
    assert m["response_length_non_aborted/clip_ratio"] == 0.5


def test_data_metrics_errors_name_the_problem():
    b = small_batch()
    b.batch.pop("advantages")
    with pytest.raises(ValueError, match="advantages"):
        compute_data_metrics(b, use_critic=False)
    b = small_batch()
    b.batch["attention_mask"] = b.batch["attention_mask"][:, 3:]
    with pytest.raises(ValueError, match="P\\+R"):
        compute_data_metrics(b, use_critic=False)


def test_timing_and_throughput_metrics():
    b = small_batch()  # 5 prompt tokens + 7 response tokens
    m = compute_timing_metrics(b, {"gen": 0.7, "update_actor": 1.2, "step": 3.0})
    assert m["timing_s/gen"] == 0.7 and m["timing_s/step"] == 3.0
    assert m["timing_per_token_ms/gen"] == pytest.approx(100.0)
    assert m["timing_per_token_ms/update_actor"] == pytest.approx(100.0)
    assert "timing_per_token_ms/step" not in m

    t = compute_throughout_metrics(b, {"step": 3.0}, n_gpus=2)
    assert t == {"perf/total_num_tokens": 12, "perf/time_per_step": 3.0, "perf/throughput": 2.0}
    b.meta_info["global_token_num"] = [10, 14]
    assert compute_throughput_metrics(b, {"step": 3.0}, n_gpus=2)["perf/throughput"] == 4.0
    with pytest.raises(ValueError, match="'step'"):
        compute_throughout_metrics(b, {"gen": 1.0}, n_gpus=1)
    with pytest.raises(ValueError, match="n_gpus"):
        compute_throughout_metrics(b, {"step": 1.0}, n_gpus=0)


# ------------------------------------------------------------------ validation
def _verl_loop_reference(vals, preds, n, seed=42, n_bootstrap=1000):
    """verl's bootstrap_metric + calc_maj_val as written there: global seed, one choice() per resample."""
    np.random.seed(seed)
    best, worst, maj = [], [], []
    for _ in range(n_bootstrap):
        idx = np.random.choice(len(vals), size=n, replace=True)
        sample = [vals[i] for i in idx]
        best.append(np.max(sample))
        worst.append(np.min(sample))
        if preds is not None:
            vote2vals = defaultdict(list)
            for i in idx:
                vote2vals[preds[i]].append(vals[i])
            counts = {k: len(v) for k, v in vote2vals.items()}
            maj.append(vote2vals[max(counts, key=counts.get)][0])
    return {"best": (np.mean(best), np.std(best)), "worst": (np.mean(worst), np.std(worst)),
            "maj": (np.mean(maj), np.std(maj)) if preds is not None else None}


def test_validation_metrics_crafted_case():
    # prompt a: 4 correct answers, prompt b: 4 wrong answers -> every @N mean is 0.5 over the data source
    sources = ["ds"] * 8
    uids = ["a"] * 4 + ["b"] * 4
    infos = {"acc": [1.0] * 4 + [0.0] * 4, "pred": ["x"] * 4 + ["y"] * 4}
    out = process_validation_metrics(sources, uids, infos)
    acc = out["ds"]["acc"]
    assert "pred" not in out["ds"]  # string variables are not scored
    assert acc["mean@4"] == 0.5 and acc["std@4"] == 0.0
    for n in (2, 4):
        assert acc[f"best@{n}/mean"] == 0.5 and acc[f"worst@{n}/mean"] == 0.5 and acc[f"maj@{n}/mean"] == 0.5
    flat = flatten_validation_metrics(out)
    assert flat["val-core/ds/acc/mean@4"] == 0.5
    assert flat["val-core/ds/acc/best@4/mean"] == 0.5 and flat["val-core/ds/acc/maj@4/mean"] == 0.5
    assert "val-aux/ds/acc/std@4" in flat and "val-aux/ds/acc/best@2/mean" in flat
    assert not any(k.startswith("val-core") and "@2" in k for k in flat)


def test_validation_bootstrap_equals_verl_loop_and_majority_vote():
    # one prompt, 5 samples: the majority answer "A" is right (1), "B" wrong (0), a lone "C" wrong
    vals = [1.0, 0.0, 1.0, 0.0, 1.0]
    preds = ["A", "B", "A", "C", "A"]
    out = process_validation_metrics(["d"] * 5, ["u"] * 5, {"acc": vals, "pred": preds}, seed=7)["d"]["acc"]
    assert out["mean@5"] == pytest.approx(0.6)
    for n in (2, 4, 5):
        ref = _verl_loop_reference(vals, preds, n, seed=7)
        assert (out[f"best@{n}/mean"], out[f"best@{n}/std"]) == pytest.approx(ref["best"], abs=1e-12)
        assert (out[f"worst@{n}/mean"], out[f"worst@{n}/std"]) == pytest.approx(ref["worst"], abs=1e-12)
        assert (out[f"maj@{n}/mean"], out[f"maj@{n}/std"]) == pytest.approx(ref["maj"], abs=1e-12)
    assert out["best@2/mean"] == pytest.approx(1 - 0.4**2, abs=0.05)  # P(at least one right in 2 draws)
    assert out["maj@5/mean"] > out["mean@5"]  # voting helps when the majority is right


def test_validation_length_mismatch_is_an_error():
    with pytest.raises(ValueError, match="acc"):
        process_validation_metrics(["d", "d"], ["u", "u"], {"acc": [1.0]})


def test_reduce_metrics_and_timer(monkeypatch):
    assert reduce_metrics({"a": [1, 2, 3], "b": [torch.tensor(1.0), torch.tensor(3.0)], "c": 5.0}) == \
        {"a": 2.0, "b": 2.0, "c": 5.0}
    with pytest.raises(ValueError, match="'empty'"):
        reduce_metrics({"empty": []})

    clock = iter([10.0, 12.5, 20.0, 21.0, 30.0, 30.25])
    monkeypatch.setattr(timer_mod, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    timing = {}
    with marked_timer("gen", timing):
        pass
    with marked_timer("gen", timing):
        pass
    with pytest.raises(RuntimeError), marked_timer("step", timing):
        raise RuntimeError("boom")
    assert timing == {"gen": 3.5, "step": 0.25}


def test_multi_turn_stats_metrics_by_hand():
    stats = [{"num_turns": 4, "tool_calls": 1, "tool_errors": 0, "tool_time_s": 0.5},
             {"num_turns": 2, "tool_calls": 0},
             {"num_turns": 6, "tool_calls": 2, "tool_errors": 1, "tool_time_s": 0.25, "cut": "turns"},
             {"num_turns": 2, "tool_calls": 0, "cut": "length"}]
    m = multi_turn_stats_metrics(stats)
    assert m["multi_turn/tool_use_rate"] == 0.5  # 2 of 4 trajectories called a tool
    assert (m["num_turns/min"], m["num_turns/max"], m["num_turns/mean"]) == (2, 6, 3.5)
    assert (m["tool_call_counts/min"], m["tool_call_counts/max"], m["tool_call_counts/mean"]) == (0, 2, 0.75)
    assert m["multi_turn/tool_calls"] == 3 and m["multi_turn/tool_errors"] == 1
    assert m["multi_turn/tool_time_s"] == 0.75 and m["multi_turn/tool_time_s_max"] == 0.5
    assert m["multi_turn/cut_by_turns"] == 1 and m["multi_turn/cut_by_length"] == 1


def test_floor_metrics_put_each_phase_next_to_its_flop_or_byte_floor():
    from hybridrl.device_peaks import peaks_of
    from hybridrl.plan.model_shape import ModelShape
    from hybridrl.trainer.metrics import compute_floor_metrics

    assert peaks_of("NVIDIA H200").hbm_bytes_per_s == 4.8e12 and peaks_of("NVIDIA H100 80GB HBM3").bf16_flops == 989e12
    assert peaks_of("NVIDIA A100-SXM4-80GB").hbm_bytes_per_s == 2.039e12 and peaks_of("Some GPU") is None
    shape = ModelShape(layers=2, hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16, vocab=100, tied=True,
                       qkv_bias=False)
    mask = torch.ones(4, 10, dtype=torch.long)
    mask[:, 6:] = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 1, 0]])  # responses 2, 1, 4, 3
    batch = DataProto({"attention_mask": mask, "responses": torch.zeros(4, 4, dtype=torch.long)})
    plan = SimpleNamespace(device=SimpleNamespace(type="cuda", name="NVIDIA H200"), model=shape,
                           actor=SimpleNamespace(share_prompts=True, lora_base_dtype=None),
                           layout=SimpleNamespace(n=2))
    timing = {"update_actor": 1.0, "ref": 0.5}
    out = compute_floor_metrics(batch, timing, {"rollout/decode_floor_s": 0.2, "rollout/decode_s": 0.8}, plan, 1)
    tokens = 10 + 24 / 2   # responses, then each prompt once for its 2 samples
    lens = mask.sum(-1).double()
    forward = 2 * (2 * shape.layer_params + shape.embed_params) * tokens + 2 * 64 * 2 * float((lens**2).sum())
    assert out["perf/floor_s/update_actor"] == pytest.approx(3 * forward / 989e12)
    assert out["perf/vs_floor/ref"] == pytest.approx(0.5 / (forward / 989e12))
    assert out["perf/vs_floor/gen_decode"] == pytest.approx(4.0)
    assert "perf/floor_s/old_log_prob" not in out  # no such phase ran
    assert out["perf/mfu/actor"] == pytest.approx(3 * forward / 989e12 / 1.0)   # verl's name: floor over time
    assert "perf/mfu/actor_infer" not in out
    two = compute_floor_metrics(batch, {"update_actor": 1.0, "old_log_prob": 0.25}, {}, plan, 1, ppo_epochs=2)
    assert two["perf/floor_s/update_actor"] == pytest.approx(6 * forward / 989e12)   # each epoch is a pass
    assert two["perf/mfu/actor_infer"] == pytest.approx(forward / 989e12 / 0.25)
    plan.device = SimpleNamespace(type="cpu", name="cpu")
    assert compute_floor_metrics(batch, timing, {}, plan, 1) == {}


def test_step_worker_metrics_add_a_steps_calls_and_average_ranks():
    """Two generate calls in a step (dynamic sampling), two ranks each: amounts the engine counts add up over the
    calls (each call the ranks' mean), times add each call's slowest rank, peaks take the max, levels the mean."""
    from hybridrl.trainer.metrics import StepWorkerMetrics

    step = StepWorkerMetrics()
    for tokens, peak, frac, secs in (([100, 300], [10, 12], [0.2, 0.4], [1.0, 1.5]), ([50, 50], [20, 8], [0.1, 0.3],
                                                                                      [0.5, 0.2])):
        step.absorb(DataProto(meta_info={"metrics": {
            "rollout/generated_tokens": tokens, "rollout/kv_blocks_peak": peak, "rollout/tail_time_frac": frac,
            "timing_s/gen_engine": secs, "memory/gen/peak_allocated_gb": [3.0, 4.0], "actor/pg_loss": [1.0, 3.0]}}))
    step.absorb(DataProto(meta_info={}))   # a call without metrics
    metrics, timing = {}, {"gen": 9.0}
    step.fold(metrics, timing)
    assert metrics["rollout/generated_tokens"] == 200 + 50
    assert metrics["rollout/kv_blocks_peak"] == 20 and metrics["memory/gen/peak_allocated_gb"] == 4.0
    assert metrics["rollout/tail_time_frac"] == pytest.approx(0.25) and metrics["actor/pg_loss"] == 2.0
    assert timing == {"gen": 9.0, "gen_engine": 1.5 + 0.5}   # the driver's own timing of gen is kept
