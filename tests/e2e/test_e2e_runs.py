"""End to end on 2 Ray CPU workers (gloo): GRPO and PPO (with critic) for 3 steps each, and exact resume.

One local Ray serves the whole session (the `ray_local` fixture); each run creates and releases its workers.
"""

import math

import pytest

from hybridrl.config.loader import load_config
from hybridrl.trainer.launch import run_ppo

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def arith_dir(tmp_path_factory):
    from hybridrl.data.tasks import make_dataset

    out = tmp_path_factory.mktemp("arith")
    make_dataset("arith", out, n_train=64, n_test=8, seed=0, digits=1, operands=3, ops="+")
    return out


def overrides(model_dir, data_dir, run_dir, *extra):
    return [
        f"actor_rollout_ref.model.path={model_dir}",
        f"data.train_files={data_dir / 'train.parquet'}",
        f"data.val_files={data_dir / 'test.parquet'}",
        "data.max_prompt_length=64", "data.max_response_length=12", "data.train_batch_size=4",
        "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
        "actor_rollout_ref.rollout.max_num_seqs=64",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.actor.optim.lr=1e-4",
        "trainer.n_gpus_per_node=2", "trainer.device=cpu", "trainer.logger=[console,file]",
        "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.total_training_steps=3",
        f"trainer.default_local_dir={run_dir}", *extra,
    ]


def train_metrics(history):
    return [h for h in history if "actor/pg_loss" in h]


def test_grpo_three_steps_with_kl_loss(ray_local, tiny_model_dir, arith_dir, tmp_path):
    import json

    cfg = load_config(overrides=overrides(tiny_model_dir, arith_dir, tmp_path / "grpo",
                                          "actor_rollout_ref.actor.use_kl_loss=true", "trainer.test_freq=3",
                                          f"trainer.rollout_data_dir={tmp_path / 'rollouts'}",
                                          f"trainer.validation_data_dir={tmp_path / 'val'}"))
    history = run_ppo(cfg)["history"]
    steps = train_metrics(history)
    assert [h["training/global_step"] for h in steps] == [1, 2, 3]
    for h in steps:
        for key in ("timing_s/gen", "timing_s/reshard", "timing_s/old_log_prob", "timing_s/ref", "timing_s/update_actor",
                    "actor/kl_loss", "actor/grad_norm", "critic/score/mean", "response_length/mean", "perf/throughput"):
            assert key in h and math.isfinite(h[key]), key
    assert any(k.startswith("val-core/arith/") for k in steps[-1])
    assert (tmp_path / "grpo" / "logs" / "metrics.jsonl").exists()
    # verl's dumps: each step's 16 trained samples and the validation's 8, a JSON line each
    assert sorted(p.name for p in (tmp_path / "rollouts").iterdir()) == ["1.jsonl", "2.jsonl", "3.jsonl"]
    for h in steps:
        rows = [json.loads(line) for line in (tmp_path / "rollouts" / f"{h['training/global_step']}.jsonl").open()]
        assert len(rows) == 16 and {r["step"] for r in rows} == {h["training/global_step"]}
        assert len({r["uid"] for r in rows}) == 4 and all(r["gts"] is not None and r["input"] for r in rows)
        assert sum(r["score"] for r in rows) / 16 == pytest.approx(h["critic/score/mean"], abs=1e-6)
    val = [json.loads(line) for line in (tmp_path / "val" / "3.jsonl").open()]
    assert len(val) == 8 and all({"input", "output", "gts", "score", "step", "uid"} <= set(r) for r in val)


def test_ppo_with_critic_three_steps(ray_local, tiny_model_dir, arith_dir, tmp_path):
    """PPO with a critic (GAE), the batch redrawn by PF-PPO after the advantages: the critic and the actor train on
    the redrawn batch."""
    cfg = load_config(overrides=overrides(tiny_model_dir, arith_dir, tmp_path / "ppo", "algorithm.adv_estimator=gae",
                                          "actor_rollout_ref.rollout.n=1", "data.train_batch_size=8",
                                          "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                                          "critic.ppo_micro_batch_size_per_gpu=4", "critic.optim.lr=1e-4",
                                          "algorithm.use_pf_ppo=true"))
    steps = train_metrics(run_ppo(cfg)["history"])
    assert len(steps) == 3
    for h in steps:
        for key in ("critic/vf_loss", "critic/vpred_mean", "critic/values/mean", "timing_s/values", "timing_s/update_critic"):
            assert key in h and math.isfinite(h[key]), key
        assert h["pf_ppo/samples"] == 8 and 1 <= h["pf_ppo/unique_samples"] <= 8


def test_resume_after_checkpoint_matches_uninterrupted(ray_local, tiny_model_dir, arith_dir, tmp_path):
    """A run killed after its step-2 checkpoint and resumed gives the uninterrupted run's steps 3-4. Both of its
    parts leave data.seed null (verl's unseeded order): the first draws a seed and saves it, the resume reads it
    back; the uninterrupted run is given that seed."""
    import json

    # the "killed" run stops right after its step-2 checkpoint; the resumed one continues from it
    run_ppo(load_config(overrides=overrides(tiny_model_dir, arith_dir, tmp_path / "cut", "data.seed=null",
                                            "trainer.total_training_steps=2", "trainer.save_freq=2")))
    assert (tmp_path / "cut" / "global_step_2").is_dir()
    state = json.loads((tmp_path / "cut" / "global_step_2" / "trainer_state.json").read_text())
    drawn = state["dataloader"]["seed"]
    full = train_metrics(run_ppo(load_config(overrides=overrides(
        tiny_model_dir, arith_dir, tmp_path / "full", "trainer.total_training_steps=4", "trainer.save_freq=2",
        f"data.seed={drawn}")))["history"])
    resumed = train_metrics(run_ppo(load_config(overrides=overrides(
        tiny_model_dir, arith_dir, tmp_path / "cut", "trainer.total_training_steps=4", "trainer.save_freq=2",
        "trainer.resume_mode=auto", "data.seed=null")))["history"])
    assert [h["training/global_step"] for h in resumed] == [3, 4]
    compared = ["critic/score/mean", "response_length/mean", "actor/pg_loss", "actor/ppo_kl", "actor/grad_norm",
                "critic/advantages/mean"]
    for want, got in zip(full[2:], resumed):
        for key in compared:
            assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6), (got["training/global_step"], key)
    # val_only: the latest checkpoint's weights validated, nothing trained or saved
    (val,) = run_ppo(load_config(overrides=overrides(tiny_model_dir, arith_dir, tmp_path / "cut", "trainer.val_only=true",
                                                     "data.seed=null",
                                                     "trainer.total_training_steps=6", "trainer.save_freq=1")))["history"]
    assert val["training/global_step"] == 4 and any(k.startswith("val-core/arith/") for k in val)
    assert "actor/pg_loss" not in val and not (tmp_path / "cut" / "global_step_5").exists()


def test_hf_rollout_backend_runs_on_the_actor_module(ray_local, tiny_model_dir, arith_dir, tmp_path):
    """rollout.name=hf generates with the FSDP actor itself (HF generate, synced across ranks): no resharding."""
    cfg = load_config(overrides=overrides(tiny_model_dir, arith_dir, tmp_path / "hf", "actor_rollout_ref.rollout.name=hf",
                                          "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
                                          "trainer.total_training_steps=1"))
    steps = train_metrics(run_ppo(cfg)["history"])
    assert len(steps) == 1 and steps[0]["timing_s/reshard"] == 0.0
    assert steps[0]["response_length/mean"] > 0


@pytest.mark.parametrize("extra", [
    ["algorithm.adv_estimator=remax",  # a second, greedy rollout per step gives the baseline
     "actor_rollout_ref.actor.fsdp_config.model_dtype=bf16"],  # bf16 master weights (one-GPU large models)
    ["algorithm.adv_estimator=rloo", "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive",
     "actor_rollout_ref.rollout.async_scheduling=true",
     "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true"],  # hybrid: the state back at the optimizer step
    ["actor_rollout_ref.hybrid_engine=false", "actor_rollout_ref.actor.fsdp_config.param_offload=true",
     "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true"],  # scheme A: the resident engine
    ["algorithm.adv_estimator=gae", "actor_rollout_ref.actor.use_kl_loss=true",
     "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2", "actor_rollout_ref.model.use_remove_padding=true",
     "critic.ulysses_sequence_parallel_size=2", "critic.model.use_remove_padding=true",
     "actor_rollout_ref.model.enable_gradient_checkpointing=true"],  # one SP group of 2 (+ recompute in backward):
    # actor, reference and critic each split every sequence over both ranks
    ["algorithm.adv_estimator=optimal_token_baseline", "actor_rollout_ref.actor.calculate_sum_pi_squared=true",
     "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2", "actor_rollout_ref.model.use_remove_padding=true"],
    # Σπ² from the old-log-prob pass, each sequence split over an SP group of 2
    ["algorithm.adv_estimator=gae", "actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=16",
     "critic.model.lora_rank=8", "critic.model.lora_alpha=16"],   # PPO with LoRA on the actor and the critic
], ids=["remax", "rloo_kl_in_reward", "scheme_a_offload", "ppo_ulysses_sp2", "otb_ulysses_sp2", "ppo_lora"])
def test_other_estimators_and_scheme_a_run(ray_local, tiny_model_dir, arith_dir, tmp_path, extra):
    cfg = load_config(overrides=overrides(tiny_model_dir, arith_dir, tmp_path / "run", "trainer.total_training_steps=2",
                                          *extra))
    steps = train_metrics(run_ppo(cfg)["history"])
    assert len(steps) == 2
    for h in steps:
        assert math.isfinite(h["actor/pg_loss"]) and math.isfinite(h["critic/advantages/mean"])
    if "algorithm.use_kl_in_reward=true" in extra:
        assert "actor/reward_kl_penalty" in steps[-1]
    if "actor_rollout_ref.actor.calculate_sum_pi_squared=true" in extra:
        assert "timing_s/old_log_prob" in steps[0] and steps[0]["variance_proxy/expected_w"] > 0
        assert steps[0]["variance_proxy/proxy1_signal_strength"] == pytest.approx(steps[0]["actor/grad_norm"] ** 2)
    if "actor_rollout_ref.rollout.async_scheduling=true" in extra:
        assert steps[-1]["rollout/num_lookahead_steps"] > 0
    if "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true" in extra and "hybrid_engine=false" not in str(extra):
        # the AdamW state exists from the first update on: offloaded for the second rollout, back at its step
        assert "timing_s/switch_to_rollout/offload_optimizer" in steps[1]
        assert "timing_s/switch_to_train/load_optimizer" in steps[1]


SIGNAL_ON_EVEN_PROMPTS = '''
import zlib

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if extra_info["index"] % 2:  # odd prompts: every sample scores 0, a group without signal
        return 0.0
    return {"score": float(zlib.crc32(solution_str.encode()) % 2), "acc": zlib.crc32(solution_str.encode()) % 2 == 1}
'''


def test_dapo_dynamic_sampling_overlong_buffer_and_rollout_correction(ray_local, tiny_model_dir, arith_dir, tmp_path):
    """filter_groups keeps generating batches of gen_batch_size prompts until train_batch_size prompts with signal
    are there (a surplus is trimmed); the loader's position counts every batch consumed. The overlong penalty and the
    TIS/RS correction run in the same steps. The train batch (3) need not divide by the rollout's dp size (2), only
    the generation batch (4) does: the collected batch only trains, on one Ulysses group of 2 ranks here."""
    import json

    scorer = tmp_path / "signal.py"
    scorer.write_text(SIGNAL_ON_EVEN_PROMPTS)
    fg, rc = "algorithm.filter_groups", "algorithm.rollout_correction"
    cfg = load_config(overrides=overrides(
        tiny_model_dir, arith_dir, tmp_path / "dapo", "trainer.total_training_steps=2", "trainer.save_freq=2",
        f"custom_reward_function.path={scorer}", f"{fg}.enable=true", f"{fg}.metric=acc",
        f"{fg}.max_num_gen_batches=12", "data.train_batch_size=3", "data.gen_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=3", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2", "reward_model.overlong_buffer.enable=true",
        "reward_model.overlong_buffer.len=4", "reward_model.overlong_buffer.penalty_factor=0.5",
        "actor_rollout_ref.actor.clip_ratio_high=0.28", f"{rc}.rollout_is=token", f"{rc}.rollout_is_threshold=2.0",
        f"{rc}.rollout_rs=token_k1", f"{rc}.rollout_rs_threshold=10"))
    steps = train_metrics(run_ppo(cfg)["history"])
    assert len(steps) == 2
    gen_batches = [h["train/num_gen_batches"] for h in steps]
    for h in steps:
        assert h["train/filter_groups/kept"] == 3
        assert h["train/filter_groups/kept"] + h["train/filter_groups/trimmed"] + h["train/filter_groups/dropped"] \
            == 4 * h["train/num_gen_batches"]
        assert h["reward/samples"] == 16 * h["train/num_gen_batches"]  # every generated sample was scored
        assert h["reward/overlong_samples"] > 0 and h["reward/overlong_reward_mean"] < 0
        for key in ("rollout_corr/rollout_is_mean", "rollout_corr/rollout_rs_masked_fraction", "rollout_corr/kl",
                    "training/rollout_probs_diff_mean", "actor/pg_loss"):
            assert math.isfinite(h[key]), key
    assert sum(gen_batches) > 2  # at least one step needed a second generation batch (the odd prompts drop)
    assert sum(h["train/filter_groups/dropped"] for h in steps) > 0
    assert sum(h["train/filter_groups/trimmed"] for h in steps) > 0  # 4 prompts with signal collected for 3
    state = json.loads((tmp_path / "dapo" / "global_step_2" / "trainer_state.json").read_text())
    assert state["dataloader"]["batch_index"] == sum(gen_batches)  # 16 batches an epoch: still the first


def test_rollout_is_without_old_log_prob_pass_uses_the_updates_own_log_probs(ray_local, tiny_model_dir, arith_dir,
                                                                              tmp_path):
    """One on-policy mini-batch: no old-log-prob pass; the actor weighs with its own log-probs and hands them back
    through the dispatch, so the driver reports the rollout-vs-trainer metrics over the whole batch."""
    rc = "algorithm.rollout_correction"
    cfg = load_config(overrides=overrides(tiny_model_dir, arith_dir, tmp_path / "own", "trainer.total_training_steps=1",
                                          "actor_rollout_ref.actor.ppo_mini_batch_size=4", f"{rc}.rollout_is=sequence"))
    (h,) = train_metrics(run_ppo(cfg)["history"])
    assert "timing_s/old_log_prob" not in h
    assert h["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=1e-3)  # the engine samples the actor's policy
    assert 0 <= h["training/rollout_probs_diff_max"] < 1e-3 and math.isfinite(h["rollout_corr/chi2_seq"])


def test_bypass_mode_trains_two_mini_batches_on_the_rollouts_log_probs(ray_local, tiny_model_dir, arith_dir, tmp_path):
    """verl's bypass mode at two mini-batches with the KL in the reward: no old-log-prob pass, the in-reward KL
    from the rollout's log-probs, the REINFORCE loss with rejection per micro-batch, the metrics over the batch."""
    rc = "algorithm.rollout_correction"
    cfg = load_config(overrides=overrides(
        tiny_model_dir, arith_dir, tmp_path / "bypass", "trainer.total_training_steps=1",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "algorithm.use_kl_in_reward=true", f"{rc}.bypass_mode=true",
        f"{rc}.loss_type=reinforce", f"{rc}.rollout_is=token", f"{rc}.rollout_rs=token_k1",
        f"{rc}.rollout_rs_threshold=10"))
    (h,) = train_metrics(run_ppo(cfg)["history"])
    assert "timing_s/old_log_prob" not in h and "timing_s/ref" in h
    assert h["actor/reward_kl_penalty"] == pytest.approx(0.0, abs=1e-3)   # the reference is the initial policy
    assert h["rollout_corr/rollout_rs_masked_fraction"] == 0.0 and math.isfinite(h["actor/ppo_kl"])
    assert 0 <= h["training/rollout_probs_diff_max"] < 0.05   # the second mini-batch sees updated weights


def test_shared_prompt_forwards_give_the_unshared_step(ray_local, tiny_model_dir, arith_dir, tmp_path):
    """actor.use_prefix_grouper=true (PPO: the actor's update, the reference's log-probs, the critic's values and
    update run each prompt once for its 4 samples): the same rollout gives the same first step as unshared."""
    runs = {}
    for share in ("true", "false"):
        cfg = load_config(overrides=overrides(
            tiny_model_dir, arith_dir, tmp_path / share, "trainer.total_training_steps=1",
            "actor_rollout_ref.actor.use_kl_loss=true", "trainer.balance_batch=false", "algorithm.adv_estimator=gae",
            f"actor_rollout_ref.actor.use_prefix_grouper={share}"))
        runs[share] = train_metrics(run_ppo(cfg)["history"])[0]
    shared, plain = runs["true"], runs["false"]
    assert shared["critic/score/mean"] == plain["critic/score/mean"]      # the same rollout
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/kl_loss", "actor/entropy", "critic/vf_loss",
                "critic/grad_norm", "critic/values/mean"):
        assert math.isclose(shared[key], plain[key], rel_tol=1e-4, abs_tol=1e-6), (key, shared[key], plain[key])


def test_the_reward_function_scoring_beside_the_passes_gives_the_same_step(ray_local, tiny_model_dir, arith_dir,
                                                                           tmp_path):
    """reward_model.launch_reward_fn_async: the reward function scores in a driver thread while the reference pass
    runs; the step's scores, losses and update equal those of the step that scored first."""
    steps = {}
    for name, value in (("sync", "false"), ("async", "true")):
        cfg = load_config(overrides=overrides(tiny_model_dir, arith_dir, tmp_path / name,
                                              "trainer.total_training_steps=1", "actor_rollout_ref.actor.use_kl_loss=true",
                                              f"reward_model.launch_reward_fn_async={value}"))
        (steps[name],) = train_metrics(run_ppo(cfg)["history"])
    a, s = steps["async"], steps["sync"]
    assert "timing_s/reward_wait" in a and "timing_s/reward_wait" not in s and "timing_s/ref" in a
    for key in ("critic/score/mean", "critic/advantages/mean", "actor/pg_loss", "actor/kl_loss", "actor/grad_norm",
                "response_length/mean", "reward/failed_fraction"):
        assert a[key] == pytest.approx(s[key], rel=1e-5, abs=1e-7), key


def _windowed_mistral(path, window: int):
    import json

    from hybridrl.assets.tiny_model import build_tiny_model

    model = build_tiny_model(path, arch="mistral", hidden=64, heads=4, kv_heads=2, head_dim=24)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "sliding_window": window}))
    return model


def test_a_mistral_model_trains_and_its_rollout_matches_the_actor(ray_local, arith_dir, tmp_path):
    """Mistral with a head_dim of its own, not hidden / heads, and a sliding window of 100 tokens, wider than the run's
    64 + 12 (so attending fully is the model's own attention): the rollout engine at TP 2 samples the actor's own
    policy (old log-probs equal the engine's), also in step 2 after the update changed the weights (the entropy
    bonus gives a gradient where a random model's rewards are all 0)."""
    model = _windowed_mistral(tmp_path / "mistral", window=100)
    cfg = load_config(overrides=overrides(model, arith_dir, tmp_path / "run", "trainer.total_training_steps=2",
                                          "actor_rollout_ref.actor.entropy_coeff=0.01"))
    steps = train_metrics(run_ppo(cfg)["history"])
    assert [h["training/global_step"] for h in steps] == [1, 2]
    for h in steps:
        assert 0 <= h["training/rollout_probs_diff_max"] < 1e-3, h["training/rollout_probs_diff_max"]
        assert math.isfinite(h["actor/pg_loss"]) and h["actor/grad_norm"] > 0


def test_the_rollout_engine_runs_the_actors_overridden_config(ray_local, tiny_model_dir, arith_dir, tmp_path):
    """model.override_config reaches the rollout engine as it reaches the actor: with rms_norm_eps overridden (a
    change to every layer's output) the engine still samples the actor's policy, step after step."""
    cfg = load_config(overrides=overrides(tiny_model_dir, arith_dir, tmp_path / "run", "trainer.total_training_steps=1",
                                          "+actor_rollout_ref.model.override_config.rms_norm_eps=10.0"))
    (step,) = train_metrics(run_ppo(cfg)["history"])
    assert 0 <= step["training/rollout_probs_diff_max"] < 1e-4, step["training/rollout_probs_diff_max"]


def test_a_sliding_window_narrower_than_the_runs_sequences_is_refused_by_the_plan(arith_dir, tmp_path):
    from hybridrl.config.errors import ConfigError
    from hybridrl.trainer.launch import make_run_plan

    model = _windowed_mistral(tmp_path / "mistral", window=50)
    cfg = load_config(overrides=overrides(model, arith_dir, tmp_path / "run"))
    with pytest.raises(ConfigError, match=r"sliding_window=50 is narrower than the run's sequences \(76 tokens"):
        make_run_plan(cfg, str(model), use_gpu=False, val_prompts=None)
