"""actor.early_update in the run plan: auto on a GPU where it is the same update and the rollout and the update fit
at once (that sum then being the rollout's predicted peak); true refused where either fails, naming the key."""

import pytest
from test_run_plan import A, R, plan

from hybridrl.config import ConfigError
from hybridrl.plan import DeviceSpec
from hybridrl.plan.early_update import KEY
from hybridrl.plan.memory import GiB

AUTO = [f"{KEY}=auto"]


def test_auto_on_where_it_fits_and_the_rollout_holds_both():
    on, off = plan(AUTO), plan([f"{KEY}=false"])
    assert on.actor.early_update and not off.actor.early_update
    gen, alone, update = on.predicted["gen"].parts, off.predicted["gen"].parts, off.predicted["update_actor"].parts
    for part in ("actor grads", "activations", "log-prob head", "kv cache", "engine weights", "actor params"):
        assert gen[part] == max(alone.get(part, 0), update.get(part, 0)), part
    assert "optimizer step" not in gen            # the step follows the rollout
    assert on.predicted["gen"].total < off.predicted["gen"].total + off.predicted["update_actor"].total
    assert any(c.startswith(f"{KEY} = true") for c in on.choices)
    assert "the update starts on finished groups" in on.actor.describe()


def test_auto_off_where_both_at_once_would_not_fit():
    small = DeviceSpec("cuda", "small", 13 * GiB)   # each phase alone fits (10.2 GiB), both at once not
    p = plan(AUTO, device=small)
    assert not p.actor.early_update and any(c.startswith(f"{KEY} = false (the rollout and the update at once")
                                            for c in p.choices)
    with pytest.raises(ConfigError, match=KEY):
        plan([f"{KEY}=true"], device=small)


@pytest.mark.parametrize("extra, reason", [
    ([f"{A}.ppo_mini_batch_size=32"], "old-log-prob pass"),
    (["algorithm.adv_estimator=reinforce_plus_plus"], "'reinforce_plus_plus'"),
    (["algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=acc"], "dynamic sampling"),
    ([f"{A}.fsdp_config.param_offload=true"], "param_offload"),
    (["reward_model.launch_reward_fn_async=true"], "launch_reward_fn_async"),
    ([f"{R}.name=hf"], "native engine"),
    (["trainer.n_gpus_per_node=2"], "2 ranks"),
    ([f"{A}.entropy_coeff=0.01", f"{A}.policy_loss.loss_mode=gspo"], "aggregates with 'seq-mean-token-mean'"),
])
def test_where_it_would_not_be_the_same_update(extra, reason):
    p = plan([*AUTO, *extra])
    assert not p.actor.early_update and any(c.startswith(f"{KEY} = false") and reason in c for c in p.choices)
    with pytest.raises(ConfigError, match=reason):
        plan([f"{KEY}=true", *extra])


def test_off_on_the_cpu_unless_asked():
    cpu = DeviceSpec("cpu", "cpu", None)
    assert not plan(AUTO, device=cpu).actor.early_update
    assert plan([f"{KEY}=true"], device=cpu).actor.early_update




def test_true_plans_the_updates_recompute_to_fit_beside_the_rollout():
    """The long-tail 1.5B update fits an H200 alone without recompute; beside the rollout it would not, so with
    true the plan recomputes some layers until both fit CONCURRENT_SAFETY of the GPU, and auto stays off."""
    from test_run_plan import H200, qwen

    from hybridrl.plan.early_update import CONCURRENT_SAFETY

    q15 = qwen(1536, 8960, 28, 12, 2, True)
    long_tail = ["data.train_batch_size=32", f"{A}.ppo_mini_batch_size=32", "data.max_response_length=4096",
                 f"{A}.use_dynamic_bsz=auto", f"{A}.use_prefix_grouper=auto"]
    alone, auto, on = (plan([*long_tail, f"{KEY}={v}"], hf=q15) for v in ("false", "auto", "true"))
    assert not alone.actor.gradient_checkpointing and not auto.actor.early_update
    assert any(c.startswith(f"{KEY} = false (the rollout and the update at once") for c in auto.choices)
    assert on.actor.early_update and on.actor.gradient_checkpointing and 0 < on.actor.recompute_kept_layers < 28
    assert on.actor.update == alone.actor.update   # the same micro-batches, recomputed in part
    assert on.predicted["gen"].total <= CONCURRENT_SAFETY * H200.total_bytes
    assert any("beside the rollout" in c and c.startswith("actor_rollout_ref.model.enable_gradient_checkpointing")
               for c in on.choices)
