"""The run plan: automatic micro-batches from the memory model, explicit ones kept or refused with the key named,
KV blocks sized to the step's batch, and the plan printed by `hybridrl config check`."""

import pytest
from transformers import AutoConfig

from hybridrl import cli
from hybridrl.config import ConfigError, load_config
from hybridrl.plan import DeviceSpec, kv_need, make_plan
from hybridrl.plan.memory import GiB

A, R = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
H200 = DeviceSpec("cuda", "H200", int(139.8 * GiB))
STEP = ["data.train_batch_size=64", f"{R}.n=8", f"{A}.ppo_mini_batch_size=64", "data.max_prompt_length=256",
        "data.max_response_length=256", "trainer.n_gpus_per_node=1",
        f"{A}.use_prefix_grouper=false",   # the tests below without shared prompts: the rows' whole lengths
        # ... and with micro-batches of fixed rows (token budgets: test_token_budgets_*)
        f"{A}.use_dynamic_bsz=false", f"{R}.log_prob_use_dynamic_bsz=false",
        "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=false"]


def qwen(hidden, inter, layers, heads, kv, tied):
    return AutoConfig.for_model("qwen2", hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                                num_attention_heads=heads, num_key_value_heads=kv, vocab_size=151936,
                                tie_word_embeddings=tied)


Q05 = qwen(896, 4864, 24, 14, 2, True)
Q7 = qwen(3584, 18944, 28, 28, 4, False)


def plan(extra=(), hf=Q05, device=H200, **kw):
    return make_plan(load_config(overrides=[*STEP, *extra]), hf, device, **kw)


def test_kv_need_counts_shared_prompt_blocks_once():
    # 4 prompts x n=8, prompt 40 tokens (2 full blocks + a partial one), 30 generated, block 16: 5 blocks a sequence
    shared, unshared = kv_need(4, 8, 40, 30, 16, sharing=True, max_num_seqs=1024)
    assert unshared == 4 * 8 * 5
    assert shared == 4 * 2 + 4 * 8 * 3          # the 2 full prompt blocks once per prompt, the rest per sample
    assert kv_need(4, 8, 40, 30, 16, sharing=False, max_num_seqs=1024) == (unshared, unshared)
    assert kv_need(4, 8, 40, 30, 16, sharing=True, max_num_seqs=10)[0] == 10 * 5  # concurrency bounds the need


def test_plan_kv_blocks_follow_the_batch_not_the_gpu():
    p = plan()
    assert (p.rollout.kv_cache.blocks, p.rollout.kv_cache.blocks_unshared) == (64 * 16 + 512 * 16, 512 * 32)
    assert p.rollout.kv_cache.max_num_seqs == 512
    bigger = plan(device=DeviceSpec("cuda", "x", int(2 * 139.8 * GiB)))
    assert bigger.rollout.kv_cache.blocks == p.rollout.kv_cache.blocks
    # validation batches count too: 1000 prompts greedy over one dp group need more than the training batch
    val = plan(val_prompts=1000)
    assert val.rollout.kv_cache.blocks == 1000 * 32 and val.rollout.kv_cache.max_num_seqs == 1000
    # ... but a hybrid engine allocates per call: the training step still gets (and is predicted at) its own need
    assert val.rollout.kv_cache.blocks_for(64, 8) == p.rollout.kv_cache.blocks
    assert val.rollout.kv_cache.blocks_for(1000, 1) == 1000 * 32
    assert val.predicted["gen"].parts["kv cache"] == p.predicted["gen"].parts["kv cache"]
    resident = plan(["actor_rollout_ref.hybrid_engine=false"], val_prompts=1000)
    assert resident.predicted["gen"].parts["kv cache"] > p.predicted["gen"].parts["kv cache"]


def test_engine_config_takes_the_plans_sizes_and_the_sections_switches():
    extra = [f"{R}.max_num_batched_tokens=100", f"{R}.enforce_eager=true", f"{R}.gpu_memory_utilization=0.7"]
    p = plan(extra)
    c = p.rollout.engine_config(load_config(overrides=[*STEP, *extra]).actor_rollout_ref.rollout, eos_token_ids=(7,))
    assert (c.num_kv_blocks, c.max_num_seqs, c.async_scheduling) == \
        (p.rollout.kv_cache.blocks, 512, p.rollout.async_scheduling)
    assert c.max_num_batched_tokens == p.rollout.max_num_batched_tokens == c.max_model_len == 512  # raised to P + R
    assert (c.enforce_eager, c.gpu_memory_utilization, c.eos_token_ids, str(c.dtype)) == (
        True, 0.7, (7,), "torch.bfloat16")


def test_speculative_threshold_comes_from_the_device_and_reaches_the_engine():
    S = f"{R}.speculative"
    on = [f"{S}.enable=true", f"{S}.num_draft_tokens=3"]
    p = plan(on, device=DeviceSpec("cuda", "NVIDIA H200", int(139.8 * GiB)))
    # H200: 989e12 FLOP/s / 4.8e12 B/s = 206 FLOP/byte; half of it in rows, 4 rows a sequence -> 25 sequences
    assert p.rollout.speculative.max_running_seqs == 25
    c = p.rollout.engine_config(load_config(overrides=[*STEP, *on]).actor_rollout_ref.rollout)
    assert c.speculative == p.rollout.speculative and c.speculative.enable and c.speculative.num_draft_tokens == 3
    assert "speculative.max_running_seqs = 25" in str(p) and "checks up to 3 draft tokens" in str(p)
    assert plan([*on, f"{S}.max_running_seqs=7"]).rollout.speculative.max_running_seqs == 7
    off = plan()
    assert not off.rollout.speculative.enable and "speculative     off" in str(off)
    with pytest.raises(ConfigError, match=r"speculative.max_match' = 1 must be >= .*min_match' = 2"):
        load_config(overrides=[*STEP, f"{S}.max_match=1"])


def test_auto_micro_batches_stay_within_token_target_and_memory():
    p = plan(["actor_rollout_ref.model.enable_gradient_checkpointing=true"])
    assert p.actor.update.rows == 128 and p.layout.grad_accum_steps == 4   # 65536 tokens / 512 per row, divides 512
    # one on-policy mini-batch: no old-log-prob pass (the update's own log-probs are the old ones)
    assert p.actor.old_log_prob_pass is False and p.actor.old_log_prob.rows is None
    assert "old_log_prob" not in p.predicted
    two = plan(["actor_rollout_ref.model.enable_gradient_checkpointing=true", f"{A}.ppo_mini_batch_size=32"])
    assert two.actor.old_log_prob_pass and two.actor.old_log_prob.rows == 64
    assert two.actor.update.rows == 128  # 256 rows: 128 divides
    assert all(pm.total < 0.9 * H200.total_bytes for pm in p.predicted.values())
    # a smaller GPU: the same config gets smaller micro-batches, chosen by the memory model
    small = plan(["actor_rollout_ref.model.enable_gradient_checkpointing=true"],
                 device=DeviceSpec("cuda", "small", 11 * GiB))
    assert small.actor.update.rows < 128 and small.predicted["update_actor"].total <= 0.9 * 11 * GiB
    assert small.layout.ppo_mini_batch_per_gpu % small.actor.update.rows == 0


def test_update_token_target_gives_small_models_enough_work_per_micro_batch():
    """On GPUs the update's micro-batch aims at the work of 32k tokens of a 1.5B (so the GPU's work hides the
    host's launches), never below 16384 tokens nor above 65536; on a CPU it stays 16384."""
    from hybridrl.plan.sizing import MAX_UPDATE_TOKENS_TARGET, UPDATE_TOKENS_TARGET

    q15 = qwen(1536, 8960, 28, 12, 2, True)
    budgets = {name: plan([f"{A}.use_dynamic_bsz=true", *extra], hf=hf).actor.update.max_tokens
               for name, hf, extra in (("0.5B", Q05, []), ("1.5B", q15, []), ("7B LoRA", Q7, LORA7))}
    assert budgets == {"0.5B": MAX_UPDATE_TOKENS_TARGET, "1.5B": 32768, "7B LoRA": UPDATE_TOKENS_TARGET}
    # the target is lowered where its phase would not fit (7B full fine-tuning with fp32 masters on an H200)
    assert plan([f"{A}.use_dynamic_bsz=true"], hf=Q7).actor.update.max_tokens == UPDATE_TOKENS_TARGET // 2
    assert plan([f"{A}.use_dynamic_bsz=true"], device=CPU).actor.update.max_tokens == UPDATE_TOKENS_TARGET


def test_checkpointing_changes_activation_memory():
    on = plan(["actor_rollout_ref.model.enable_gradient_checkpointing=true", f"{A}.ppo_micro_batch_size_per_gpu=8"])
    off = plan(["actor_rollout_ref.model.enable_gradient_checkpointing=false", f"{A}.ppo_micro_batch_size_per_gpu=8"])
    assert off.predicted["update_actor"].parts["activations"] > 5 * on.predicted["update_actor"].parts["activations"]


def test_explicit_micro_batch_is_kept_or_refused_naming_the_key():
    assert plan([f"{A}.ppo_micro_batch_size_per_gpu=4"]).actor.update.rows == 4
    with pytest.raises(ConfigError) as e:
        plan([f"{A}.ppo_micro_batch_size_per_gpu=512"], device=DeviceSpec("cuda", "small", 24 * GiB))
    msg = str(e.value)
    assert f"'{A}.ppo_micro_batch_size_per_gpu' = 512" in msg and "set it to" in msg
    fit = int(msg.split("set it to ")[1].split()[0])
    assert plan([f"{A}.ppo_micro_batch_size_per_gpu={fit}"], device=DeviceSpec("cuda", "small", 24 * GiB))


def test_a_model_that_cannot_fit_is_refused_with_a_hint():
    with pytest.raises(ConfigError) as e:
        plan(hf=Q7, device=DeviceSpec("cuda", "small", 80 * GiB))
    # the update holds the AdamW state whatever its offload: the hint names what lowers the update, not that
    assert "fsdp_config.model_dtype=bf16" in str(e.value) and "GiB" in str(e.value)
    assert "optimizer_offload" not in str(e.value)
    # with bf16 masters and offloaded optimizer state the same model plans on the 80 GiB GPU
    ok = plan([f"{A}.fsdp_config.model_dtype=bf16", f"{A}.fsdp_config.optimizer_offload=true",
               "actor_rollout_ref.model.enable_gradient_checkpointing=true"], hf=Q7,
              device=DeviceSpec("cuda", "small", 80 * GiB))
    assert ok.predicted["gen"].parts["actor optimizer"] == 0


def test_cpu_plan_has_no_memory_refusal_and_uses_token_targets():
    p = plan(["algorithm.use_kl_in_reward=true"], device=DeviceSpec("cpu", "cpu", None))
    assert p.actor.update.rows == 32 and p.actor.old_log_prob.rows == 64 and p.actor.old_log_prob.unshard_once is False
    assert p.actor.old_log_prob_pass and p.actor.ref_log_prob.rows == 64   # KL in the reward: old log-probs first


def test_old_log_prob_pass_false_needs_an_on_policy_update():
    assert plan([f"{A}.old_log_prob_pass=true"]).actor.old_log_prob_pass
    with pytest.raises(ConfigError, match="old_log_prob_pass"):
        plan([f"{A}.old_log_prob_pass=false", f"{A}.ppo_epochs=2"])


LORA7 = ["actor_rollout_ref.model.lora_rank=64", "actor_rollout_ref.model.lora_alpha=128"]
CKPT = "actor_rollout_ref.model.enable_gradient_checkpointing"


def test_checkpointing_auto_stays_on_where_the_update_would_not_fit_without_it():
    # 0.5B on a 24 GiB GPU: the micro-batch chosen with checkpointing does not fit the device without it
    small = DeviceSpec("cuda", "small", 24 * GiB)
    p, every = plan(device=small), plan([f"{CKPT}=true"], device=small)
    assert p.actor.gradient_checkpointing and p.actor.update.rows == every.actor.update.rows
    assert any(c.startswith(f"{CKPT} = true") for c in p.choices)
    with pytest.raises(ConfigError, match="ppo_micro_batch_size_per_gpu"):
        plan([f"{CKPT}=false", f"{A}.ppo_micro_batch_size_per_gpu={p.actor.update.rows}"], device=small)


def test_checkpointing_auto_turns_off_where_the_update_fits_the_device():
    # time first within the device: without recompute the 0.5B's micro-batch fits 90% of an H200, though it peaks
    # far above the rollout; the micro-batch is the one chosen with checkpointing (never shrunk to fit)
    on, p = plan([f"{CKPT}=true"]), plan()
    assert on.actor.gradient_checkpointing and not p.actor.gradient_checkpointing
    assert p.actor.update.rows == on.actor.update.rows and p.layout.grad_accum_steps == on.layout.grad_accum_steps
    assert p.predicted["gen"].total < on.predicted["update_actor"].total < p.predicted["update_actor"].total
    assert p.predicted["update_actor"].total <= 0.9 * H200.total_bytes
    assert any(c.startswith(f"{CKPT} = false (no recompute") and "device budget" in c for c in p.choices)
    # an explicit micro-batch too large to fit without recompute keeps it on, for some layers
    big = plan([f"{A}.ppo_micro_batch_size_per_gpu=512"])
    assert big.actor.gradient_checkpointing and big.actor.update.rows == 512
    # with a token budget (dynamic batch size) the budget itself must fit without recompute
    long, dynamic = ["data.max_response_length=4096", f"{R}.n=16"], [f"{A}.use_dynamic_bsz=true"]
    assert not plan([*long, *dynamic, f"{A}.ppo_max_token_len_per_gpu=65536"]).actor.gradient_checkpointing
    assert plan([*long, *dynamic, f"{A}.ppo_max_token_len_per_gpu=131072"]).actor.gradient_checkpointing


def test_checkpointing_auto_keeps_the_last_layers_that_fit_the_device():
    # 7B LoRA at 512 tokens on an 80 GiB GPU: recompute stays on, but the device leaves room for some layers'
    # activations
    gpu80 = DeviceSpec("cuda", "80G", 80 * GiB)
    lora, every = plan(LORA7, hf=Q7, device=gpu80), plan([*LORA7, f"{CKPT}=true"], hf=Q7, device=gpu80)
    k, layers = lora.actor.recompute_kept_layers, lora.model.layers
    assert lora.actor.gradient_checkpointing and 0 < k < layers and every.actor.recompute_kept_layers == 0
    assert lora.actor.update.rows == every.actor.update.rows                      # the micro-batch is not shrunk
    budget = 0.9 * gpu80.total_bytes
    acts = [p.predicted["update_actor"].parts["activations"] for p in (every, lora)]
    assert acts[0] < acts[1] and lora.predicted["update_actor"].total <= budget
    # gathering the weights once per mini-batch (+14.2 GiB) would take the place of more than one kept layer: not
    # chosen there; with every layer recomputing it fits the device: chosen
    assert not lora.actor.update.unshard_once and every.actor.update.unshard_once
    assert any("the update would peak over the device budget" in c for c in lora.choices)
    assert any(f"true for the first {layers - k} of {layers} decoder layers" in c for c in lora.choices)
    # the largest such count: each more kept layer adds its saved activations less its input
    shape, tokens = lora.model, lora.actor.update.rows * 512
    per_layer = tokens * (shape.train_act_bytes_per_token_layer() - 2 * shape.hidden)
    assert lora.predicted["update_actor"].total + per_layer > budget
    # kept activations: the recomputed layers' inputs and the kept layers' saved activations; no layer is rebuilt
    # while a kept one's activations are alive, so the rebuild is not added
    from hybridrl.plan.memory import MemoryModel

    kept = MemoryModel._kept_activations(shape, tokens, True, False, False, k)
    assert kept == (layers - k) * tokens * shape.hidden * 2 + k * tokens * shape.train_act_bytes_per_token_layer()
    assert MemoryModel(shape, None)._train_activations(shape, tokens, True, False, False, k) == \
        kept + tokens * shape.layer_backward_bytes_per_token()
    # an explicit true keeps verl's meaning (every layer), and so does activation offload
    offload = plan([*LORA7, "actor_rollout_ref.model.enable_activation_offload=true"], hf=Q7, device=gpu80)
    assert offload.actor.recompute_kept_layers == 0


def test_checkpointing_auto_on_cpu_offload_and_explicit_values():
    no_gpu = plan(device=DeviceSpec("cpu", "cpu", None))
    assert not no_gpu.actor.gradient_checkpointing   # no memory model: no recompute
    assert plan([*LORA7, "actor_rollout_ref.model.enable_activation_offload=true"], hf=Q7).actor.gradient_checkpointing
    assert plan([*LORA7, f"{CKPT}=true"], hf=Q7).actor.gradient_checkpointing
    assert not plan([f"{CKPT}=false"]).actor.gradient_checkpointing
    with pytest.raises(ConfigError, match="enable_gradient_checkpointing"):
        plan([f"{CKPT}=sometimes"])


def test_critic_checkpointing_auto_is_resolved_on_its_own():
    p = plan(["algorithm.adv_estimator=gae"], device=DeviceSpec("cpu", "cpu", None))
    assert not p.critic.gradient_checkpointing
    on = plan(["algorithm.adv_estimator=gae", "critic.model.enable_gradient_checkpointing=true"],
              device=DeviceSpec("cpu", "cpu", None))
    assert on.critic.gradient_checkpointing and not on.actor.gradient_checkpointing
    gpu = plan(["algorithm.adv_estimator=gae"], device=DeviceSpec("cuda", "small", 24 * GiB))
    assert gpu.critic.gradient_checkpointing and any(c.startswith("critic.model.enable_gradient_checkpointing = true")
                                                    for c in gpu.choices)
    assert not plan(["algorithm.adv_estimator=gae"]).critic.gradient_checkpointing   # it fits an H200 without


def test_gae_plans_the_critic():
    p = plan(["algorithm.adv_estimator=gae", "actor_rollout_ref.model.enable_gradient_checkpointing=true",
              "critic.model.enable_gradient_checkpointing=true"])
    assert p.critic.update.rows == 128 and p.critic.values.rows == 64
    assert {"values", "update_critic"} <= set(p.predicted)
    assert p.predicted["gen"].parts["critic params"] > 0


def test_critic_values_token_budget_follows_verl_keys():
    gae = ["algorithm.adv_estimator=gae", f"{A}.use_dynamic_bsz=true"]
    auto = plan(gae)
    assert (auto.critic.values.max_tokens, auto.critic.values.rows) == (32768, None)   # the no-grad target
    # verl's default: the values pass takes the update's budget where that is set
    update_set = plan([*gae, "critic.ppo_max_token_len_per_gpu=4096"])
    assert update_set.critic.update.max_tokens == update_set.critic.values.max_tokens == 4096
    own = plan([*gae, "critic.ppo_max_token_len_per_gpu=4096", "critic.forward_max_token_len_per_gpu=16384"])
    assert (own.critic.update.max_tokens, own.critic.values.max_tokens) == (4096, 16384)
    with pytest.raises(ConfigError, match=r"'critic.forward_max_token_len_per_gpu' = 100 must be >= "
                                          r"max_prompt_length \+ max_response_length = 512"):
        plan([*gae, "critic.forward_max_token_len_per_gpu=100"])


def test_config_check_prints_the_plan(tmp_path, capsys):
    model = tmp_path / "m"
    Q05.save_pretrained(model)
    rc = cli.main(["config", "check", *STEP, f"actor_rollout_ref.model.path={model}", "--gpu-memory-gb", "141"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "predicted peak per GPU" in out and "update_actor" in out and "kv cache        9216 blocks" in out
    rc = cli.main(["config", "check", *STEP, f"actor_rollout_ref.model.path={model}", "--gpu-memory-gb", "8",
                   f"{A}.ppo_micro_batch_size_per_gpu=512"])
    assert rc == 1 and f"'{A}.ppo_micro_batch_size_per_gpu' = 512" in capsys.readouterr().err
    # the host memory the offloads pin, checked against --host-memory-gb: the reference offloaded to a 1 GiB host
    ref_off = [*STEP, f"actor_rollout_ref.model.path={model}", "--gpu-memory-gb", "141", f"{A}.use_kl_loss=true",
               "actor_rollout_ref.ref.fsdp_config.param_offload=true"]
    assert cli.main(["config", "check", *ref_off, "--host-memory-gb", "64"]) == 0
    out = capsys.readouterr().out
    assert "64.0 GiB host memory available per node" in out and "host (pinned)    0.95  = ref params 0.92" in out
    assert cli.main(["config", "check", *ref_off, "--host-memory-gb", "1"]) == 1
    assert "actor_rollout_ref.ref.fsdp_config.param_offload=false" in capsys.readouterr().err


def test_whole_batch_rollout_correction_needs_the_old_log_prob_pass():
    rc = "algorithm.rollout_correction"
    assert not plan([f"{rc}.rollout_is=token"]).actor.old_log_prob_pass  # per-token weights: made inside the update
    assert plan([f"{rc}.rollout_rs=token_k1", f"{rc}.rollout_rs_threshold=2"]).actor.old_log_prob_pass
    assert plan([f"{rc}.rollout_is=token", f"{rc}.rollout_is_batch_normalize=true"]).actor.old_log_prob_pass
    with pytest.raises(ConfigError, match=r"old_log_prob_pass' = false cannot go with "
                                          r"'algorithm.rollout_correction.rollout_rs' = seq_mean_k3"):
        plan([f"{A}.old_log_prob_pass=false", f"{rc}.rollout_rs=seq_mean_k3", f"{rc}.rollout_rs_threshold=0.1"])


def test_critic_lora_keeps_optimizer_state_for_its_adapters_only():
    full = plan(["algorithm.adv_estimator=gae"])
    lora = plan(["algorithm.adv_estimator=gae", "critic.model.lora_rank=16"])
    f, l = full.predicted["update_critic"].parts, lora.predicted["update_critic"].parts
    assert l["critic optimizer"] < 0.05 * f["critic optimizer"] and l["critic params"] == f["critic params"]


def test_bypass_mode_runs_no_old_log_prob_pass_at_any_mini_batch_count():
    rc = "algorithm.rollout_correction"
    for extra in ([], [f"{A}.ppo_mini_batch_size=32", f"{A}.ppo_epochs=2"], ["algorithm.use_kl_in_reward=true"],
                  [f"{rc}.rollout_rs=token_k1", f"{rc}.rollout_rs_threshold=2"]):
        p = plan([f"{rc}.bypass_mode=true", *extra])
        assert p.actor.old_log_prob_pass is False and "old_log_prob" not in p.predicted
        assert any("bypass_mode" in c for c in p.choices)


def test_generation_batches_size_the_rollout():
    p = plan(["data.gen_batch_size=96", "algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=acc"])
    assert p.layout.rollout_prompts_per_dp == 96 and p.layout.rollout_samples_per_dp == 96 * 8
    assert p.rollout.kv_cache.blocks == 96 * 16 + 96 * 8 * 16  # the prompt's 16 blocks once per prompt, 16 per sample


def test_gpu_plans_fuse_the_adamw_step_and_cpu_plans_count_its_temporaries():
    """A 7B model with fp32 masters on one H200: the multi-tensor AdamW step would hold sqrt(exp_avg_sq) of every
    parameter at once (28 GiB), which no longer fits; the GPU plan takes the fused kernel and counts no temporary."""
    gpu = plan(hf=Q7)
    assert gpu.fused_optimizer and gpu.predicted["update_actor"].parts["optimizer step"] == 0
    cpu = plan(hf=Q7, device=DeviceSpec("cpu", "cpu", None))
    assert not cpu.fused_optimizer
    assert cpu.predicted["update_actor"].parts["optimizer step"] == cpu.model.num_params * 4
    lora = plan(["actor_rollout_ref.model.lora_rank=8"], hf=Q7, device=DeviceSpec("cpu", "cpu", None))
    assert 0 < lora.predicted["update_actor"].parts["optimizer step"] < 0.01 * lora.model.num_params * 4


def test_lora_update_counts_no_gradients_for_the_frozen_base_or_head():
    """With LoRA the head weight and the unsharded blocks get no gradient buffers (measured on one H200 at 7B,
    r64: 26.8 GiB in the update; counting them predicted 32.1)."""
    micro = [f"{A}.ppo_micro_batch_size_per_gpu=8", f"{CKPT}=true", f"{A}.update_unshard_once=false"]
    full, lora = plan(micro, hf=Q7), plan([*micro, "actor_rollout_ref.model.lora_rank=64"], hf=Q7)
    m, f, lo = full.model, full.predicted["update_actor"].parts, lora.predicted["update_actor"].parts
    # LoRA peaks in a layer's backward: the untied embedding and head plus two blocks unsharded in bf16, no block
    # gradients, no head-weight gradient held for the root's reduce
    assert lo["unsharded params"] == m.embed_params * 2 * 2 + 2 * m.layer_params * 2 and lo["log-prob head"] == 0
    # gathered once per mini-batch (the plan's choice here, every layer recomputing): every parameter, still no
    # gradient buffers for the frozen base
    once = plan([*micro[:2], "actor_rollout_ref.model.lora_rank=64"], hf=Q7)
    assert once.actor.update.unshard_once and not lora.actor.update.unshard_once
    assert once.predicted["update_actor"].parts["unsharded params"] == m.num_params * 2
    # full fine-tuning peaks in the head's backward, which sums the head weight's gradient (fp32 and a bf16 product)
    assert f["log-prob head"] > m.vocab * m.hidden * 6
    assert lora.predicted["update_actor"].total < full.predicted["update_actor"].total


def test_scheme_a_rollout_holds_no_gradients():
    """Gradients are freed after every optimizer step, so scheme A's rollout holds the resident engine on top of the
    same actor state as the hybrid one (measured on one H200: gen peaks 8.67 GiB in both at 0.5B)."""
    hybrid, a = plan(), plan(["actor_rollout_ref.hybrid_engine=false"])
    assert a.predicted["gen"].parts["actor grads"] == 0
    assert a.predicted["gen"].total == hybrid.predicted["gen"].total


def test_sampling_memory_follows_the_sampler_path():
    """The default sampler (no top-k / top-p) is one kernel over bf16 logits and an fp32 noise tensor; top-p anywhere
    (training or validation) takes the sorting path, which holds several full-vocabulary fp32 tensors."""
    rows = 512
    plain = plan().predicted["gen"].parts["sampling"]
    assert plain == rows * 151936 * (2 + 4)
    for key in (f"{R}.top_p=0.9", f"{R}.val_kwargs.top_k=20"):
        assert plan([key]).predicted["gen"].parts["sampling"] > 5 * plain


def test_kv_beyond_the_budget_lowers_concurrency_instead_of_refusing():
    """7B full fine-tuning on one H200 with 256 prompts x 8: the step's KV need (1024 sequences at full length) does
    not fit next to the resident training state (the AdamW state kept on the GPU); the plan keeps what fits. With
    ignore_eos (every sequence at the limit) fewer run at once; where responses end at EOS all run and the engine
    preempts if the cache runs out."""
    big = ["data.train_batch_size=256", f"{A}.ppo_mini_batch_size=256"]
    p = plan([*big, f"{A}.fsdp_config.optimizer_offload=false", "actor_rollout_ref.rollout.ignore_eos=true"], hf=Q7)
    per_seq = 512 // 16
    kv = p.rollout.kv_cache
    assert kv.blocks < 1024 * per_seq and kv.max_num_seqs == kv.blocks // per_seq < 1024
    eos = plan([*big, f"{A}.fsdp_config.optimizer_offload=false"], hf=Q7).rollout.kv_cache
    assert eos.blocks == kv.blocks and eos.max_num_seqs == 1024
    assert p.rollout.kv_cache.blocks_for(256, 8) <= p.rollout.kv_cache.blocks
    assert p.predicted["gen"].total <= 0.9 * H200.total_bytes
    assert any("sequences at once" in c for c in p.choices)
    # left to auto, the AdamW state waits in host memory during the rollout and all 1024 run at once
    moved = plan(big, hf=Q7)
    assert moved.actor.optimizer_offload and moved.rollout.kv_cache.max_num_seqs == 1024
    # the batch that fits whole keeps its full concurrency
    assert plan(hf=Q7).rollout.kv_cache.max_num_seqs == 512


def test_activation_offload_keeps_two_layer_inputs_on_the_gpu():
    micro = f"{A}.ppo_micro_batch_size_per_gpu=8"
    kept = plan([micro, f"{CKPT}=true"], hf=Q7).predicted["update_actor"].parts["activations"]
    off = plan([micro, "actor_rollout_ref.model.enable_activation_offload=true"],
               hf=Q7).predicted["update_actor"].parts["activations"]
    assert kept - off == (28 - 2) * 8 * 512 * 3584 * 2


LIGER = "actor_rollout_ref.model.use_liger"
CPU = DeviceSpec("cpu", "cpu", None)


@pytest.mark.parametrize("device, installed, model_type, reason", [
    (CPU, True, "qwen2", "CPU"),
    (H200, False, "qwen2", "liger-kernel package"),
    (H200, True, "olmo2", "'olmo2'"),
])
def test_liger_auto_is_off_and_true_refused_where_it_cannot_run(monkeypatch, device, installed, model_type, reason):
    monkeypatch.setattr("hybridrl.training.liger.liger_installed", lambda: installed)
    hf = qwen(896, 4864, 24, 14, 2, True)
    hf.model_type = model_type
    p = plan(hf=hf, device=device)
    assert p.actor.use_liger is False
    assert any(c.startswith(f"{LIGER} = false") and reason in c for c in p.choices), p.choices
    with pytest.raises(ConfigError) as e:
        plan([f"{LIGER}=true"], hf=hf, device=device)
    assert f"'{LIGER}' = true" in str(e.value) and reason in str(e.value)
    assert plan([f"{LIGER}=false"], hf=hf, device=device).actor.use_liger is False


def test_liger_on_a_gpu_shrinks_the_planned_update_activations(monkeypatch):
    monkeypatch.setattr("hybridrl.training.liger.liger_installed", lambda: True)
    lean = ["actor_rollout_ref.model.enable_gradient_checkpointing=false", f"{A}.ppo_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.model.lora_rank=64"]
    on, off = plan(lean, hf=Q7), plan([*lean, f"{LIGER}=false"], hf=Q7)
    assert on.actor.use_liger and f"{LIGER} = true (fused RMSNorm, SwiGLU, RoPE)" in on.choices
    assert not off.actor.use_liger
    diff = off.predicted["update_actor"].parts["activations"] - on.predicted["update_actor"].parts["activations"]
    h, i, tokens, layers = 3584, 18944, 4 * 512, 28
    # per token and layer the norms keep bf16 inputs and one fp32 rstd (not fp32 inputs) and SwiGLU no SiLU output;
    # a layer's backward holds one [tokens, i] gradient instead of three, the head's the final norm's bf16 input
    kept = layers * tokens * (2 * 2 * h - 2 * 4 + 2 * i)
    assert diff in (kept + tokens * 2 * 2 * i, kept + tokens * 2 * h), diff
    assert on.predicted["update_actor"].total < off.predicted["update_actor"].total


def test_critic_checkpointing_auto_keeps_its_last_layers_too():
    # GAE, 1k-token responses on a 40 GiB GPU: actor and critic each keep what fits the device
    gpu40 = DeviceSpec("cuda", "40G", 40 * GiB)
    gae = ["algorithm.adv_estimator=gae", "data.max_response_length=1024"]
    p = plan(gae, device=gpu40)
    budget = 0.9 * gpu40.total_bytes
    assert p.critic.gradient_checkpointing and 0 < p.critic.recompute_kept_layers < p.model.layers
    assert p.actor.gradient_checkpointing and 0 < p.actor.recompute_kept_layers < p.model.layers
    tokens = p.critic.update.rows * (256 + 1024)
    per_layer = tokens * (p.model.train_act_bytes_per_token_layer() - 2 * p.model.hidden)
    assert p.predicted["update_critic"].total <= budget < p.predicted["update_critic"].total + per_layer
    assert any(c.startswith("critic.model.enable_gradient_checkpointing = true for the first") for c in p.choices)
    every = plan([*gae, "critic.model.enable_gradient_checkpointing=true"], device=gpu40)
    assert every.critic.recompute_kept_layers == 0 and every.critic.update.rows == p.critic.update.rows


def test_prefix_grouper_auto_on_gpus_with_several_samples_and_its_tokens():
    from hybridrl.plan.sizing import shared_prompt_tokens

    key = f"{A}.use_prefix_grouper"
    p = plan([f"{key}=auto"], hf=Q7)
    assert p.actor.share_prompts and any(c.startswith(f"{key} = true") for c in p.choices)
    # 7B full fine-tuning: 32 rows hold 4 whole prompt groups: 4 x 256 + 32 x 256 tokens, within the 16384 target
    assert p.actor.update.rows == 32 and f"{A}.ppo_micro_batch_size_per_gpu = 32 (9216 tokens" in " ".join(p.choices)
    unshared = plan([f"{key}=false"], hf=Q7)
    assert not unshared.actor.share_prompts and unshared.actor.update.rows == 16
    assert p.predicted["update_actor"].parts["activations"] < 2 * unshared.predicted["update_actor"].parts[
        "activations"]
    assert not plan([f"{key}=auto"], device=DeviceSpec("cpu", "cpu", None)).actor.share_prompts   # auto: off on the CPU
    assert plan([f"{key}=true"], device=DeviceSpec("cpu", "cpu", None)).actor.share_prompts
    assert not plan([f"{key}=auto", f"{R}.n=1"]).actor.share_prompts
    gae = ["algorithm.adv_estimator=gae", "critic.ppo_mini_batch_size=64"]
    ppo = plan([f"{key}=auto", *gae])
    assert ppo.actor.share_prompts and ppo.critic.share_prompts
    assert "critic.ppo_micro_batch_size_per_gpu = 128 (36864 tokens" in " ".join(ppo.choices)
    assert not plan([f"{key}=false", *gae]).critic.share_prompts
    assert shared_prompt_tokens(32, 8, 256, 256) == 4 * 256 + 32 * 256
    assert shared_prompt_tokens(4, 8, 256, 256) == 256 + 4 * 256              # inside one group
    assert shared_prompt_tokens(12, 8, 100, 10) == 3 * 100 + 12 * 10          # may touch three groups
    assert shared_prompt_tokens(1, 1, 100, 10) == 110


def test_prefix_grouper_true_with_ulysses_is_refused_naming_both_keys():
    sp = ["trainer.n_gpus_per_node=2", f"{A}.ulysses_sequence_parallel_size=2",
          "actor_rollout_ref.model.use_remove_padding=true"]
    assert not plan([*sp, f"{A}.use_prefix_grouper=auto"]).actor.share_prompts
    with pytest.raises(ConfigError, match=r"use_prefix_grouper' = true does not go with .*ulysses_sequence_parallel"):
        plan([*sp, f"{A}.use_prefix_grouper=true"])
    with pytest.raises(ConfigError, match="use_prefix_grouper' = 'sometimes'"):
        plan([f"{A}.use_prefix_grouper=sometimes"])


def test_token_budgets_are_the_default_on_gpus_and_explicit_rows_keep_their_meaning():
    dyn = ["actor_rollout_ref.actor.use_dynamic_bsz=auto", f"{R}.log_prob_use_dynamic_bsz=auto",
           "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=auto", f"{A}.use_kl_loss=true"]
    long = plan([*dyn, "data.max_response_length=4096", f"{A}.old_log_prob_pass=true"])
    assert long.actor.update.rows is None and long.actor.old_log_prob.rows is None
    assert long.actor.ref_log_prob.rows is None
    actor = long.actor
    assert (actor.update.max_tokens, actor.old_log_prob.max_tokens, actor.ref_log_prob.max_tokens) == \
        (65536, 32768, 32768)
    assert long.actor.remove_padding and long.rollout.max_num_batched_tokens == 8192   # rollout.max_num_batched_tokens
    assert "update <= 65536 tokens" in str(long) and "packed" in str(long)
    # a budget is never below the longest sequence: one must fit a micro-batch
    very_long = plan([*dyn, "data.max_response_length=70000"])
    assert very_long.actor.update.max_tokens == 70256 and very_long.rollout.max_num_batched_tokens == 70256
    # an explicit micro-batch size keeps verl's fixed rows; so does the CPU (the padded reference)
    rows = plan([*dyn, f"{A}.ppo_micro_batch_size_per_gpu=4"])
    assert rows.actor.update.rows == 4 and rows.actor.update.max_tokens is None and rows.actor.old_log_prob.rows is None
    cpu = plan(dyn, device=DeviceSpec("cpu", "cpu", None))
    assert cpu.actor.update.max_tokens is None and cpu.actor.update.rows is not None and not cpu.actor.remove_padding
    # an explicit budget is kept, or refused naming the key when its phase cannot fit
    assert plan([*dyn, f"{A}.ppo_max_token_len_per_gpu=9000"]).actor.update.max_tokens == 9000
    with pytest.raises(ConfigError, match="ppo_max_token_len_per_gpu' = 4000000"):
        plan([*dyn, f"{A}.ppo_max_token_len_per_gpu=4000000", f"{A}.use_dynamic_bsz=true"], hf=Q7)


def test_update_gathers_its_weights_once_where_it_costs_at_most_one_kept_layer():
    """The long-tail 1.5B update (32k-token micro-batches) on an 80 GiB GPU: gathering the weights once per
    mini-batch costs about one kept layer's activations; it takes that layer's place within the device, and is
    said."""
    q15 = qwen(1536, 8960, 28, 12, 2, True)
    long_tail = ["data.train_batch_size=32", f"{A}.ppo_mini_batch_size=32", "data.max_response_length=4096",
                 f"{A}.use_dynamic_bsz=auto", f"{A}.use_prefix_grouper=auto"]
    gpu80 = DeviceSpec("cuda", "80G", 80 * GiB)
    auto = plan(long_tail, hf=q15, device=gpu80)
    off = plan([*long_tail, f"{A}.update_unshard_once=false"], hf=q15, device=gpu80)
    assert auto.actor.update.unshard_once and not off.actor.update.unshard_once
    assert auto.actor.gradient_checkpointing and off.actor.gradient_checkpointing
    assert auto.actor.recompute_kept_layers == off.actor.recompute_kept_layers - 1 > 0
    assert auto.predicted["update_actor"].total <= 0.9 * gpu80.total_bytes
    assert auto.predicted["update_actor"].parts["unsharded params"] == auto.model.num_params * 2
    assert any(c.startswith(f"{A}.update_unshard_once = true") and "one kept layer fewer" in c for c in auto.choices)
    # on an H200 the same update fits without recompute, and gathered once
    h200 = plan(long_tail, hf=q15)
    assert not h200.actor.gradient_checkpointing and h200.actor.update.unshard_once
    # true where it cannot fit is refused naming the key; on a CPU (no memory model) auto is off
    small = DeviceSpec("cuda", "small", int(40 * GiB))   # 7B LoRA fits at 33.9 GiB, +14.2 GiB gathered once
    assert not plan(LORA7, hf=Q7, device=small).actor.update.unshard_once
    with pytest.raises(ConfigError, match=f"'{A}.update_unshard_once' = True"):
        plan([*LORA7, f"{A}.update_unshard_once=true"], hf=Q7, device=small)
    assert not plan(long_tail, hf=q15, device=DeviceSpec("cpu", "cpu", None)).actor.update.unshard_once


def test_a_budget_below_one_sequence_is_refused_where_the_plan_turns_dynamic_batches_on():
    """use_dynamic_bsz auto: on on GPUs, off on the CPU. A per-GPU budget that cannot hold one sequence is refused
    by the plan where it turns them on, and nowhere else."""
    small = [f"{A}.use_dynamic_bsz=auto", f"{A}.ppo_micro_batch_size_per_gpu=auto", f"{A}.ppo_max_token_len_per_gpu=300"]
    cfg = load_config(overrides=[*STEP, *small])   # the config alone does not decide it
    make_plan(cfg, Q05, DeviceSpec("cpu", "cpu", None))
    with pytest.raises(ConfigError, match=rf"'{A}.ppo_max_token_len_per_gpu' = 300 must be >= 512 with dynamic "
                                          r"batch size: a micro-batch must hold one sequence"):
        make_plan(cfg, Q05, H200)
    with pytest.raises(ConfigError, match=rf"'{A}.ppo_max_token_len_per_gpu' = 300 must be >= max_prompt_length"):
        load_config(overrides=[*STEP, *small, f"{A}.use_dynamic_bsz=true"])   # asked for: refused at once
