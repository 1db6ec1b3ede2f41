"""Partial rollouts end to end on 2 Ray CPU workers: GRPO with a 4-token budget per step on 8-token responses, so
samples are carried over steps, groups train once complete with truncated IS, and a resumed run continues the
checkpointed groups."""

import math

import pytest
import torch
from test_e2e_runs import arith_dir, overrides, train_metrics  # noqa: F401 (arith_dir is a fixture)

from hybridrl.config.loader import load_config
from hybridrl.trainer.launch import run_ppo
from hybridrl.trainer.partial_rollout import STATE_FILE

pytestmark = pytest.mark.slow
PR = "actor_rollout_ref.rollout.partial_rollout"


def run(model_dir, data_dir, run_dir, *extra):
    return run_ppo(load_config(overrides=overrides(
        model_dir, data_dir, run_dir, "data.max_response_length=8", f"{PR}.enable=true",
        f"{PR}.max_new_tokens_per_step=4", f"{PR}.max_staleness=1",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1", *extra)))["history"]


def test_grpo_with_partial_rollouts_and_resume(ray_local, tiny_model_dir, arith_dir, tmp_path):  # noqa: F811
    """Random weights rarely end early: most samples need both steps of 4 tokens, so step 1 trains nothing and each
    later step trains the groups of the step before, from older policies. The step-2 checkpoint holds groups in
    flight; a run resumed from it continues them and repeats step 3."""
    history = run(tiny_model_dir, arith_dir, tmp_path / "full", "trainer.total_training_steps=3",
                  "trainer.save_freq=2")
    steps = [h for h in history if "partial/trained_groups" in h]
    assert [h["training/global_step"] for h in steps] == [1, 2, 3]
    for h in steps:
        for key in ("partial/carried_samples", "partial/carried_groups", "partial/dropped_stale",
                    "partial/continued_samples", "timing_s/gen"):
            assert key in h and math.isfinite(h[key]), key
        assert h["partial/dropped_stale"] == 0  # (1 + 1) x 4 tokens >= 8: every sample finishes in time
    assert steps[0]["partial/continued_samples"] == 0 and steps[0]["partial/carried_samples"] > 0
    assert steps[1]["partial/continued_samples"] > 0
    trained = train_metrics(history)
    assert trained and sum(h["partial/trained_groups"] for h in steps) == 4 * len(trained)
    assert all("actor/pg_loss" not in h for h in steps if h["partial/trained_groups"] == 0)
    for h in trained:  # token-level TIS on by default, the step's staleness reported
        for key in ("rollout_corr/rollout_is_mean", "partial/mean_staleness", "partial/off_policy_token_frac",
                    "actor/grad_norm", "critic/score/mean"):
            assert math.isfinite(h[key]), key
    assert max(h["partial/off_policy_token_frac"] for h in trained) > 0
    state = torch.load(tmp_path / "full" / "global_step_2" / STATE_FILE, weights_only=False)
    assert len(state["groups"]) == steps[1]["partial/carried_groups"] > 0

    resumed = run(tiny_model_dir, arith_dir, tmp_path / "resumed", "trainer.total_training_steps=3",
                  "trainer.resume_mode=resume_path", f"trainer.resume_from_path={tmp_path / 'full' / 'global_step_2'}")
    (again,) = [h for h in resumed if "partial/trained_groups" in h]
    assert again["training/global_step"] == 3
    for key in ("partial/trained_groups", "partial/carried_samples", "partial/continued_samples",
                "partial/mean_staleness", "response_length/mean", "critic/score/mean", "actor/grad_norm",
                "rollout_corr/rollout_is_mean"):
        assert again[key] == pytest.approx(steps[2][key], rel=1e-5, abs=1e-6), key
