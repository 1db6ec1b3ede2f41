"""The actor's offloads left to the plan ('auto', the defaults): activation offload where the update cannot hold one
sequence of the longest length without it, optimizer offload where the AdamW state would keep the rollout's KV
cache from holding the step's sequences at once; explicit values, the CPU and LoRA keep them as they are."""

import pytest

from hybridrl.assets.tiny_model import SIZE_PRESETS, make_config
from hybridrl.config import ConfigError, load_config
from hybridrl.plan import DeviceSpec, make_plan
from hybridrl.plan.memory import GiB

M, A, R = "actor_rollout_ref.model", "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
ACT, OPT = f"{M}.enable_activation_offload", f"{A}.fsdp_config.optimizer_offload"
H200 = DeviceSpec("cuda", "a 139.8 GiB GPU", int(139.8 * GiB))
CPU = DeviceSpec("cpu", "cpu", None)
Q7, Q15 = (make_config(**SIZE_PRESETS[size]) for size in ("qwen2.5-7b", "qwen2.5-1.5b"))
# 7B, 16 prompts x 8 samples of up to 256 + 16384 tokens on one H200 (Liger off: its kernels are optional)
SEVEN_16K = ["data.max_prompt_length=256", "data.max_response_length=16384", "data.train_batch_size=16", f"{R}.n=8",
             f"{A}.ppo_mini_batch_size=16", "trainer.n_gpus_per_node=1", f"{M}.use_liger=false"]
# the 1.5B long tail: 32 prompts x 8, 256 + 4096 tokens
LONG_TAIL = ["data.max_prompt_length=256", "data.max_response_length=4096", "data.train_batch_size=32", f"{R}.n=8",
             f"{A}.ppo_mini_batch_size=32", "trainer.n_gpus_per_node=1", f"{M}.use_liger=false"]
LORA = [f"{M}.lora_rank=64", f"{M}.lora_alpha=128"]


def plan(keys, hf=Q7, device=H200):
    return make_plan(load_config(overrides=keys), hf, device)


def choice(p, key):
    """The plan's line for `key` (exactly one)."""
    lines = [c for c in p.choices if c.startswith(f"{key} = ")]
    assert len(lines) == 1, p.choices
    return lines[0]


def test_7b_16k_plans_at_the_defaults_with_the_optimizer_offloaded_until_its_step():
    p = plan(SEVEN_16K)
    budget = 0.9 * H200.total_bytes
    # optimizer offload: on the GPU the KV cache would hold 28 of the 128 sequences at full length; off it, 61 (the
    # engine's weights, KV and activations within gpu_memory_utilization 0.5 of the GPU)
    assert p.actor.optimizer_offload and p.predicted["gen"].parts["actor optimizer"] == 0
    assert choice(p, OPT).startswith(f"{OPT} = true (with its 56.7 GiB on the GPU the rollout's KV cache holds 28 "
                                     "of the step's 128 sequences at full length")
    assert "until the update's optimizer step, 61, at the cost of copying 56.7 GiB" in choice(p, OPT)
    # one optimizer step per update: the state returns only for it, so the forward and backward have its 56.7 GiB.
    # One 16640-token sequence then fits with checkpointing alone (the step itself, params + grads + state, is the
    # 113.5 GiB), no activation offload, and 17 of the 28 layers keep their activations instead of recomputing
    assert not p.actor.activation_offload and p.actor.gradient_checkpointing and p.actor.recompute_kept_layers == 17
    assert choice(p, ACT) == (f"{ACT} = false (one sequence of 16640 tokens fits the update with checkpointing alone: "
                              "predicted 113.5 GiB, within the device budget (90% of 139.8 GiB))")
    update = p.predicted["update_actor"]
    assert update.parts["actor optimizer"] == 0 and update.parts["activations"] > 0   # the backward's moment
    at_step = 30462466048 * 4    # fp32 params + grads + two AdamW moments of the 7.6B parameters
    assert update.total > at_step and update.total <= budget
    assert p.actor.update.max_tokens == 16640
    # responses end at EOS: all 128 run at once in the cache that fits, preempted by recompute if it runs out
    kv = p.rollout.kv_cache
    assert kv.max_num_seqs == 128 and kv.blocks < 128 * (16640 // 16)
    assert any(c.startswith(f"kv cache = {kv.blocks} blocks") and "(61 of 128 could): all 128 run at once" in c
               for c in p.choices)
    # with ignore_eos every sequence reaches the limit: 61 at once, the rest queue
    fixed = plan([*SEVEN_16K, f"{R}.ignore_eos=true"])
    assert fixed.rollout.kv_cache.max_num_seqs == 61 and fixed.rollout.kv_cache.blocks == kv.blocks
    # the KV the engine takes at wake within gpu_memory_utilization: the 7B run's engine allocated 62,158 blocks
    assert 62158 <= kv.blocks <= 1.05 * 62158
    roomier = plan([*SEVEN_16K, f"{R}.gpu_memory_utilization=0.7"]).rollout.kv_cache
    assert roomier.blocks > 1.4 * kv.blocks
    assert all(pm.total <= budget for pm in p.predicted.values())
    # `hybridrl config check` prints both choices
    assert f"  auto: {choice(p, ACT)}" in str(p) and f"  auto: {choice(p, OPT)}" in str(p)


def test_7b_16k_with_two_mini_batches_counts_the_state_in_the_update_and_offloads_activations():
    """Two optimizer steps: the state is back from the first, so the second mini-batch's forward and backward hold
    it: the update counts it, and one 16640-token sequence then needs its layer inputs on the host."""
    p = plan([*SEVEN_16K, f"{A}.ppo_mini_batch_size=8"])
    assert p.actor.optimizer_offload and p.predicted["update_actor"].parts["actor optimizer"] > 56 * GiB
    assert p.actor.activation_offload and p.actor.gradient_checkpointing and p.actor.recompute_kept_layers == 0
    assert choice(p, ACT).startswith(f"{ACT} = true (one sequence of 16640 tokens is predicted at 126.9 GiB")
    assert "124.1 GiB" in choice(p, ACT)
    assert p.predicted["update_actor"].total <= 0.9 * H200.total_bytes


def test_1_5b_long_tail_keeps_both_off_and_its_plan_unchanged():
    auto = plan(LONG_TAIL, hf=Q15)
    off = plan([*LONG_TAIL, f"{ACT}=false", f"{OPT}=false"], hf=Q15)
    assert not auto.actor.activation_offload and not auto.actor.optimizer_offload
    assert choice(auto, ACT).startswith(f"{ACT} = false (one sequence of 4352 tokens fits the update with "
                                        "checkpointing alone")
    assert choice(auto, OPT).startswith(f"{OPT} = false (the rollout's KV cache holds all 256 of the step's "
                                        "sequences at full length")
    # the same plan as with both off explicitly, but for the two lines
    assert auto.actor == off.actor and auto.rollout == off.rollout and auto.predicted == off.predicted
    assert [c for c in auto.choices if not c.startswith((ACT, OPT))] == list(off.choices)


def test_explicit_values_are_kept():
    # activation offload false: the 7B/16k update with two mini-batches (the state back for the second) is refused,
    # the offload named as a fix
    with pytest.raises(ConfigError) as e:
        plan([*SEVEN_16K, f"{A}.ppo_mini_batch_size=8", f"{ACT}=false"])
    msg = str(e.value)
    assert "even one sequence of 16640 tokens is predicted to need 126.9 GiB in phase update_actor" in msg
    assert f"({ACT}=true)" in msg and "model_dtype=bf16" in msg
    # optimizer offload false: the rollout keeps 28 sequences at once, the state on the GPU
    kept = plan([*SEVEN_16K, f"{OPT}=false"])
    assert not kept.actor.optimizer_offload and kept.rollout.kv_cache.max_num_seqs == 128
    assert any("(28 of 128 could)" in c for c in kept.choices)
    assert kept.predicted["gen"].parts["actor optimizer"] > 56 * GiB
    assert not any(c.startswith(OPT) for c in kept.choices)
    # true where auto would not: the 1.5B with both on
    on = plan([*LONG_TAIL, f"{ACT}=true", f"{OPT}=true"], hf=Q15)
    assert on.actor.activation_offload and on.actor.optimizer_offload and on.actor.gradient_checkpointing
    assert on.predicted["gen"].parts["actor optimizer"] == 0
    assert not any(c.startswith((ACT, OPT)) for c in on.choices)


def test_cpu_plan_keeps_both_off():
    p = plan(SEVEN_16K, device=CPU)
    assert not p.actor.activation_offload and not p.actor.optimizer_offload
    assert choice(p, ACT) == f"{ACT} = false (no device memory to plan against)"
    assert choice(p, OPT) == f"{OPT} = false (no device memory to plan against)"


def test_lora_and_a_resident_engine_never_offload_the_optimizer_by_auto():
    lora = plan([*SEVEN_16K, *LORA])
    # the situation auto offloads for (fewer sequences at full length than the step's) ... but LoRA's state is tiny
    assert any(c.startswith("kv cache = ") and " could): all 128 run at once" in c for c in lora.choices)
    assert not lora.actor.optimizer_offload and lora.predicted["gen"].parts["actor optimizer"] > 0
    assert choice(lora, OPT) == f"{OPT} = false (LoRA: only the adapters have optimizer state)"
    # the resident engine (scheme A) never moves the state: auto leaves it
    resident = plan([*LONG_TAIL, "actor_rollout_ref.hybrid_engine=false"], hf=Q15)
    assert not resident.actor.optimizer_offload and "a resident engine" in choice(resident, OPT)


def test_activation_offload_auto_needs_checkpointing_and_refusals_do_not_repeat_a_weighed_offload():
    # auto with checkpointing off is accepted and stays off; the refusal names checkpointing (auto follows it)
    with pytest.raises(ConfigError) as e:
        plan([*SEVEN_16K, f"{M}.enable_gradient_checkpointing=false"])
    msg = str(e.value)
    assert f"{M}.enable_gradient_checkpointing=true; activation offload, left to auto, is then weighed too" in msg
    # true with checkpointing off is still refused by the config check
    with pytest.raises(ConfigError, match="enable_activation_offload' = true needs"):
        load_config(overrides=[f"{ACT}=true", f"{M}.enable_gradient_checkpointing=false"])
    # on 80 GiB auto weighed activation offload (not enough): the refusal does not tell the user to set it
    with pytest.raises(ConfigError) as e:
        plan(SEVEN_16K, device=DeviceSpec("cuda", "80G", 80 * GiB))
    assert "enable_activation_offload" not in str(e.value) and "model_dtype=bf16" in str(e.value)


def test_critic_optimizer_offload_is_counted_only_from_the_critics_optimizer_step():
    """GAE on the 1.5B: with the critic's optimizer offloaded and one critic mini-batch its AdamW state returns only
    for the step, so the update's forward/backward moment holds none of it; with two mini-batches it is back for the
    second one and counted, as without the offload."""
    gae = ["data.max_prompt_length=256", "data.max_response_length=1024", "data.train_batch_size=16", f"{R}.n=8",
           f"{A}.ppo_mini_batch_size=16", "trainer.n_gpus_per_node=1", f"{M}.use_liger=false",
           "algorithm.adv_estimator=gae", "critic.ppo_mini_batch_size=16"]
    off = "critic.model.fsdp_config.optimizer_offload=true"
    resident, deferred, two = (plan(keys, hf=Q15).predicted["update_critic"]
                               for keys in (gae, [*gae, off], [*gae, off, "critic.ppo_mini_batch_size=8"]))
    state = resident.parts["critic optimizer"]
    assert state > 11 * GiB and deferred.parts["critic optimizer"] == 0 and two.parts["critic optimizer"] == state
    # the step's own moment (critic params, grads and state, no activations) is within the phase's peak
    at_step = sum(v for k, v in deferred.parts.items() if k not in ("activations", "unsharded params")) + state
    assert deferred.total >= at_step and deferred.total <= 0.9 * H200.total_bytes
