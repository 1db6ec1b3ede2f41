"""The pinned host memory the offloads need per node, against the host memory available: the plan leaves the
actor's optimizer state on the GPU where the node cannot pin it for all its ranks, and refuses explicit offloads that
would pin more than HOST_SAFETY of it, naming the keys; an unknown host (None) is not checked."""

import pytest

from hybridrl.assets.tiny_model import SIZE_PRESETS, make_config
from hybridrl.config import ConfigError, load_config
from hybridrl.plan import DeviceSpec, make_plan
from hybridrl.plan.host_memory import host_available_bytes
from hybridrl.plan.memory import GiB

M, A, R = "actor_rollout_ref.model", "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
OPT = f"{A}.fsdp_config.optimizer_offload"
Q7 = make_config(**SIZE_PRESETS["qwen2.5-7b"])
SEVEN_16K = ["data.max_prompt_length=256", "data.max_response_length=16384", "data.train_batch_size=16", f"{R}.n=8",
             f"{A}.ppo_mini_batch_size=16", f"{M}.use_liger=false"]
STATE_7B = 2 * 7615616512 * 4   # AdamW's two fp32 moments of the 7.6B parameters, one rank


def h200(host_gib):
    return DeviceSpec("cuda", "a 139.8 GiB GPU", int(139.8 * GiB), None if host_gib is None else int(host_gib * GiB))


def plan(keys, host_gib, gpus=1):
    return make_plan(load_config(overrides=[*keys, f"trainer.n_gpus_per_node={gpus}"]), Q7, h200(host_gib))


def opt_choice(p):
    return next(c for c in p.choices if c.startswith(f"{OPT} = "))


def test_the_7b_state_is_offloaded_where_the_host_can_pin_it_and_kept_where_it_cannot():
    eight_k = [k.replace("16384", "8192") for k in SEVEN_16K]
    roomy = plan(eight_k, 120)
    assert roomy.actor.optimizer_offload
    pinned = roomy.host_pinned
    assert pinned.parts["actor optimizer"] == pytest.approx(STATE_7B, rel=1e-3)
    assert STATE_7B < pinned.total <= 1.03 * STATE_7B + 1   # the power-of-two packing's slack
    assert "host (pinned)" in str(roomy) and "120.0 GiB host memory available per node" in str(roomy)
    # 70 GiB available: 75% is 52.5 GiB, short of the 56.7 GiB state -> on the GPU, the choice says why
    tight = plan(eight_k, 70)
    assert not tight.actor.optimizer_offload and tight.host_pinned.total == 0
    assert opt_choice(tight).startswith(f"{OPT} = false (with its 56.7 GiB on the GPU the rollout's KV cache holds 56 "
                                        "of the step's 128 sequences at full length; in host memory it would need "
                                        "58.4 GiB pinned per GPU x 1 GPUs per node = 58.4 GiB, of 52.5 GiB")
    # unknown host: planned as before
    assert plan(eight_k, None).actor.optimizer_offload


def test_a_small_host_plans_the_7b_16k_with_activation_offload_or_says_the_host_is_short():
    """7B / 16k on one H200 with a 70 GiB host: the state stays on the GPU, the update then needs its layer inputs in
    host memory (3.5 GiB pinned), 28 sequences fit at full length instead of 61. With activation offload turned off
    as well nothing fits, and the refusal names the host among the fixes."""
    p = plan(SEVEN_16K, 70)
    assert not p.actor.optimizer_offload and p.actor.activation_offload
    assert set(p.host_pinned.parts) == {"actor layer inputs"}
    assert p.rollout.kv_cache.max_num_seqs == 128 and "(28 of 128 could)" in str(p)
    with pytest.raises(ConfigError, match=r"more host memory per node \(the optimizer offload was left off: in host "
                                          r"memory it would need 58.4 GiB"):
        plan([*SEVEN_16K, f"{M}.enable_activation_offload=false"], 70)


def test_explicit_offloads_over_the_host_are_refused_naming_the_keys():
    with pytest.raises(ConfigError) as e:
        plan([*SEVEN_16K, f"{OPT}=true", f"{A}.fsdp_config.param_offload=true"], 70)
    msg = str(e.value)
    assert "pin more host memory than the node has" in msg and "of 52.5 GiB (75% of the node's 70.0 GiB" in msg
    assert f"{OPT}=false" in msg and f"{A}.fsdp_config.param_offload=false" in msg
    assert "actor optimizer 56.74" in msg and "actor params 28.37" in msg
    # the same on a host that holds it
    assert plan([*SEVEN_16K, f"{OPT}=true"], 120).actor.optimizer_offload


def test_every_rank_of_a_node_pins_its_own_shard():
    """8 GPUs of one node shard the 7B's state 8 ways: 7.1 GiB each, 56.7 GiB for the node, the same as one GPU's
    whole state. The node's memory, not the rank's, is the limit."""
    keys = [*SEVEN_16K, "data.train_batch_size=64", f"{A}.ppo_mini_batch_size=64", f"{OPT}=true"]
    p = plan(keys, 120, gpus=8)
    assert p.host_pinned.parts["actor optimizer"] == pytest.approx(STATE_7B / 8, rel=1e-3)
    with pytest.raises(ConfigError, match=r"x 8 GPUs per node"):
        plan(keys, 70, gpus=8)


def test_activation_offload_counts_the_layer_inputs_rounded_to_powers_of_two():
    p = plan([*SEVEN_16K, f"{M}.enable_activation_offload=true", f"{M}.enable_gradient_checkpointing=true"], 120)
    inputs = p.host_pinned.parts["actor layer inputs"]
    tokens = p.actor.update.max_tokens
    per_layer = tokens * 3584 * 2
    recomputed = 28 - p.actor.recompute_kept_layers
    assert inputs == recomputed * (1 << (per_layer - 1).bit_length())
    assert per_layer * recomputed <= inputs < 2 * per_layer * recomputed


def test_host_pinned_is_empty_without_offloads_and_available_memory_reads_the_host():
    p = plan([*SEVEN_16K[:1], "data.max_response_length=2048", *SEVEN_16K[2:]], 120)
    assert not p.actor.optimizer_offload and p.host_pinned.total == 0 and "host (pinned)" not in str(p)
    avail = host_available_bytes()
    assert avail is None or avail > 0
